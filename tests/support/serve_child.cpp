#include "support/serve_child.hpp"

#include <signal.h>

#include <catch2/catch.hpp>
#include <fstream>

#include "support/services.hpp"
#include "support/ws_client.hpp"

namespace outlive::testing {

ServeChild::ServeChild(nlohmann::json config, const std::string& dir, const std::string& name,
                       Options options)
    : port_(harness::free_port()),
      config_path_(dir + "/" + name + ".json"),
      log_path_(dir + "/" + name + ".log") {
  config["listen"] = "127.0.0.1:" + std::to_string(port_);
  {
    std::ofstream out(config_path_);
    out << config.dump();
    REQUIRE(out.good());
  }
  process_ = harness::ChildProcess({outlive_binary(), "serve", "--config", config_path_},
                                   log_path_, std::nullopt, options.env);
  if (options.wait_ready) require_ready(options.ready_within, options.poll);
}

ServeChild::~ServeChild() { process_.stop(SIGTERM); }

void ServeChild::require_ready(std::chrono::milliseconds within, std::chrono::milliseconds poll) {
  INFO("outlive serve on port " << port_ << ", log in " << log_path_);
  REQUIRE(eventually(
      [&] {
        try {
          return http_get(port_, "/readyz").first == 200;
        } catch (...) {
          return false;  // not listening yet
        }
      },
      within, poll));
}

}  // namespace outlive::testing
