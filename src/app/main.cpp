// outlive: migrate | serve | cursor | dev. Only wires components together.
#include <signal.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "common/log.hpp"
#include "config/config.hpp"
#include "harness/embedded_nats.hpp"
#include "harness/embedded_postgres.hpp"
#include "outbox/migrate.hpp"
#include "replica/replica.hpp"
#include "topic/client.hpp"

namespace {

constexpr int kExitConfig = 2;

const char* kUsage =
    "usage:\n"
    "  outlive migrate --database URL      apply the sql/ migrations (idempotent)\n"
    "  outlive serve --config FILE         run a replica\n"
    "  outlive cursor --config FILE --app APP   print the topic's head cursor\n"
    "  outlive dev [--config FILE] [--data DIR] run on an embedded Postgres and NATS\n";

std::optional<std::string> flag(const std::vector<std::string>& args, const std::string& name) {
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == name) return args[i + 1];
  }
  return std::nullopt;
}

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

int wait_for_stop_signal() {
  sigset_t set = stop_signals();
  int sig = 0;
  sigwait(&set, &sig);
  return sig;
}

// How long stop() may take after SIGTERM. The sockets are closed with 1012 at once; what follows
// (in-flight publishes, deletes, background queries) waits on Postgres and NATS, and a server that
// stops answering without closing the connection (frozen, or a peer gone without a reset) would
// hold it forever. What stop() leaves undone is safe to leave: rows acked but not deleted are
// published again under the same Nats-Msg-Id, and the partitions' locks go with the connection.
constexpr int kStopBoundSeconds = 10;

// After the stop signal: exits with 1 when stop() has not finished within kStopBoundSeconds, or
// at once on a second SIGTERM or SIGINT.
void bound_the_stop() {
  std::thread([] {
    sigset_t set = stop_signals();
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(kStopBoundSeconds);
    int sig = -1;
    for (;;) {
      const auto left = deadline - std::chrono::steady_clock::now();
      if (left <= std::chrono::steady_clock::duration::zero()) break;
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      timespec wait{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
      sig = sigtimedwait(&set, nullptr, &wait);
      if (sig > 0 || errno != EINTR) break;
    }
    if (sig > 0) {
      outlive::log::error("a second stop signal: exiting before the stop finished",
                          {{"signal", strsignal(sig)}});
    } else {
      outlive::log::error(
          "the stop did not finish in time (Postgres or NATS not answering); "
          "exiting",
          {{"seconds", kStopBoundSeconds}});
    }
    std::_Exit(1);
  }).detach();
}

int run_replica(outlive::config::Config config) {
  outlive::replica::Replica replica(std::move(config));
  const int sig = wait_for_stop_signal();
  outlive::log::info("stopping", {{"signal", strsignal(sig)}});
  bound_the_stop();
  replica.stop();
  return 0;
}

int cmd_migrate(const std::vector<std::string>& args) {
  auto url = flag(args, "--database");
  if (!url) {
    if (const char* env = std::getenv("OUTLIVE_DATABASE_URL")) url = env;
  }
  if (!url) {
    std::cerr << "outlive migrate: --database URL is required\n" << kUsage;
    return kExitConfig;
  }
  const auto report = outlive::outbox::migrate(*url);
  outlive::log::info("migrations",
                     {{"applied", report.applied}, {"already_applied", report.skipped}});
  return 0;
}

int cmd_serve(const std::vector<std::string>& args) {
  const auto path = flag(args, "--config");
  if (!path) {
    std::cerr << "outlive serve: --config FILE is required\n" << kUsage;
    return kExitConfig;
  }
  return run_replica(outlive::config::load_file(*path));
}

int cmd_cursor(const std::vector<std::string>& args) {
  const auto path = flag(args, "--config");
  const auto app = flag(args, "--app");
  if (!path || !app) {
    std::cerr << "outlive cursor: --config FILE and --app APP are required\n";
    return kExitConfig;
  }
  const auto config = outlive::config::load_file(*path);
  outlive::topic::Client client(config.nats, "outlive-cursor");
  std::cout << client.head_cursor(*app) << "\n";
  return 0;
}

// The embedded default: our own Postgres and NATS in a data folder, migrations, one replica.
int cmd_dev(const std::vector<std::string>& args) {
  const std::string config_path =
      flag(args, "--config").value_or("examples/inventory/outlive.json");
  const std::string data = flag(args, "--data").value_or(".outlive-dev");
  std::filesystem::create_directories(data);
  auto config = outlive::config::load_file(config_path);
  outlive::harness::PostgresOptions pg_options;
  pg_options.data_dir = std::filesystem::absolute(data + "/postgres").string();
  pg_options.durable = true;
  outlive::harness::EmbeddedPostgres postgres(pg_options);
  outlive::harness::NatsOptions nats_options;
  nats_options.store_dir = std::filesystem::absolute(data + "/nats").string();
  outlive::harness::EmbeddedNats nats(nats_options);
  config.database = postgres.url();
  config.nats = {nats.url()};
  outlive::outbox::migrate(config.database);
  std::cout << "\noutlive dev is running\n"
            << "  Postgres: " << config.database << "\n"
            << "  NATS:     " << nats.url() << "\n"
            << "  write:    psql " << config.database
            << " -c \"SELECT events.publish_live('inventory', 'w1', "
               "'{\\\"type\\\":\\\"item.changed\\\",\\\"itemId\\\":\\\"i1\\\"}'); SELECT "
               "events.wake('inventory')\"\n"
            << "  Ctrl-C stops it.\n\n"
            << std::flush;
  return run_replica(std::move(config));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << kUsage;
    return args.empty() ? kExitConfig : 0;
  }
  // Block the stop signals in every thread; main waits for them with sigwait.
  sigset_t set = stop_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  const std::string command = args[0];
  try {
    if (command == "migrate") return cmd_migrate(args);
    if (command == "serve") return cmd_serve(args);
    if (command == "cursor") return cmd_cursor(args);
    if (command == "dev") return cmd_dev(args);
    std::cerr << "outlive: unknown command " << command << "\n" << kUsage;
    return kExitConfig;
  } catch (const outlive::Error& e) {
    outlive::log::error(e.what(), {{"command", command}});
    std::cerr << "outlive " << command << ": " << e.what() << "\n";
    return e.code() == outlive::Errc::invalid_input ? kExitConfig : 1;
  } catch (const std::exception& e) {
    outlive::log::error(e.what(), {{"command", command}});
    std::cerr << "outlive " << command << ": " << e.what() << "\n";
    return 1;
  }
}
