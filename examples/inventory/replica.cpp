// inventory_replica: what `outlive serve` runs (same configuration file, same start checks, same
// SIGTERM path), in a program of the inventory app, so the replica also serves the app's channel
// declared in C++ (`warehouse_code`, services.hpp) beside the SQL channels of outlive.json. The
// demo runs two of these behind the gateway instead of `outlive serve`: every replica a tab may
// reach serves both kinds, and the gateway needs no change.
//
//   inventory_replica serve --config FILE
#include <signal.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <outlive/outlive.hpp>
#include <string>
#include <vector>

#include "services.hpp"

namespace {

constexpr const char* kUsage = "usage: inventory_replica serve --config FILE\n";

// The database the channel's functions read: the replica's own (its file, unless
// OUTLIVE_DATABASE_URL overrides it as it does for the replica).
std::string database_url(const std::string& config_path) {
  if (const char* env = std::getenv("OUTLIVE_DATABASE_URL"); env && *env) return env;
  std::ifstream in(config_path);
  if (!in) throw outlive::Error(outlive::Errc::invalid_input, "cannot read " + config_path);
  const auto config = nlohmann::json::parse(in, nullptr, false);
  if (!config.is_object() || !config.contains("database") || !config["database"].is_string())
    throw outlive::Error(outlive::Errc::invalid_input, config_path + ": no \"database\"");
  return config["database"].get<std::string>();
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() != 3 || args[0] != "serve" || args[1] != "--config") {
    std::cerr << kUsage;
    return 2;
  }
  // Block the stop signals in every thread (the replica's threads start below); sigwait takes them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  signal(SIGPIPE, SIG_IGN);
  try {
    outlive::Replica replica = outlive::Replica::from_file(
        args[2], {inventory::warehouse_code_channel(database_url(args[2]))});
    std::cerr << "inventory_replica: serving on port " << replica.port()
              << " (SQL channels from " << args[2] << ", C++ channel warehouse_code)\n";
    int sig = 0;
    sigwait(&stop, &sig);
    std::cerr << "inventory_replica: stopping (" << strsignal(sig) << ")\n";
    replica.stop();
    return 0;
  } catch (const outlive::Error& e) {
    std::cerr << "inventory_replica: " << e.what() << "\n";
    return e.code() == outlive::Errc::invalid_input ? 2 : 1;
  } catch (const std::exception& e) {
    std::cerr << "inventory_replica: " << e.what() << "\n";
    return 1;
  }
}
