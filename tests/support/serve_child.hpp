#pragma once
// A real `outlive serve` child process for the tests that need one (SIGTERM handling, a fault armed
// from the environment, a SIGKILL failover): writes its configuration with a free loopback port,
// starts `outlive serve --config <file>` with any extra environment, waits for /readyz 200 within
// a deadline, and stops it with SIGTERM (SIGKILL after a grace) when it goes out of scope.
#include <sys/types.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "harness/process.hpp"

namespace outlive::testing {

class ServeChild {
 public:
  struct Options {
    std::vector<std::string> env;  // extra "NAME=value" entries for the child's environment
    // Wait for /readyz 200 in the constructor (a failed REQUIRE when it is not within the
    // deadline); false to start several children first and call require_ready() on each after.
    bool wait_ready = true;
    std::chrono::milliseconds ready_within = std::chrono::seconds(20);
    std::chrono::milliseconds poll = std::chrono::milliseconds(20);
  };

  // `config` with "listen" set to 127.0.0.1:<a free port> is written to <dir>/<name>.json; the
  // child's output goes to <dir>/<name>.log.
  ServeChild(nlohmann::json config, const std::string& dir, const std::string& name,
             Options options);
  ServeChild(nlohmann::json config, const std::string& dir, const std::string& name)
      : ServeChild(std::move(config), dir, name, Options{}) {}
  ~ServeChild();
  ServeChild(ServeChild&&) noexcept = default;
  ServeChild& operator=(ServeChild&&) = delete;
  ServeChild(const ServeChild&) = delete;
  ServeChild& operator=(const ServeChild&) = delete;

  // REQUIREs /readyz 200 on port() within `within`, polling every `poll` (a refused connection
  // while the child starts counts as not ready); the log's path is in the failure message.
  void require_ready(std::chrono::milliseconds within = std::chrono::seconds(20),
                     std::chrono::milliseconds poll = std::chrono::milliseconds(20));

  int port() const { return port_; }
  pid_t pid() const { return process_.pid(); }
  const std::string& log_path() const { return log_path_; }
  const std::string& config_path() const { return config_path_; }
  bool running() { return process_.running(); }
  // See harness::ChildProcess: `signal`, then SIGKILL after `grace`; the exit status.
  int stop(int signal, std::chrono::milliseconds grace = std::chrono::seconds(10)) {
    return process_.stop(signal, grace);
  }
  std::optional<int> wait_for(std::chrono::milliseconds timeout) {
    return process_.wait_for(timeout);
  }

 private:
  int port_ = 0;
  std::string config_path_;
  std::string log_path_;
  harness::ChildProcess process_;
};

}  // namespace outlive::testing
