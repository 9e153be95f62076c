// outlive: serve | migrate | check | version | cursor | dev. Parses the command line (CLI11) and
// wires components together.
#include <signal.h>

#include <CLI/CLI.hpp>

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

#include "app/check.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "config/config.hpp"
#include "config/environment.hpp"
#include "harness/embedded_nats.hpp"
#include "harness/embedded_postgres.hpp"
#include "outbox/migrate.hpp"
#include "replica/replica.hpp"
#include "topic/client.hpp"

namespace {

// Usage and configuration errors; 1 is a failure of the deployment (a query Postgres refuses, a
// server that does not answer).
constexpr int kExitConfig = 2;

#ifndef OUTLIVE_VERSION
#define OUTLIVE_VERSION "unknown"
#endif

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
  {
    outlive::replica::Replica replica(std::move(config));
    const int sig = wait_for_stop_signal();
    outlive::log::info("stopping", {{"signal", strsignal(sig)}});
    bound_the_stop();
    replica.stop();
  }
  // nats.c's dispatcher and timer threads may still be unwinding after the last connection is
  // destroyed; exit() would run the library's teardown (atexit) beside them.
  if (!outlive::topic::close_library(std::chrono::seconds(2))) {
    outlive::log::warn("NATS client threads did not end within 2 s; exiting anyway");
  }
  return 0;
}

int cmd_migrate(std::string url) {
  if (url.empty()) {
    url = outlive::config::database_url_from_environment(outlive::config::process_environment())
              .value_or("");
  }
  if (url.empty()) {
    std::cerr << "outlive migrate: --database URL is required (or OUTLIVE_DATABASE_URL, "
                 "OUTLIVE_DATABASE_URL_FILE)\n";
    return kExitConfig;
  }
  const auto report = outlive::outbox::migrate(url);
  outlive::log::info("migrations",
                     {{"applied", report.applied}, {"already_applied", report.skipped}});
  return 0;
}

// The configuration at `path`, its log.level in force from here on (unless OUTLIVE_LOG_LEVEL says).
outlive::config::Config load_config(const std::string& path) {
  auto config = outlive::config::load_file(path);
  outlive::log::set_min_level(
      outlive::log::configured_level(std::getenv("OUTLIVE_LOG_LEVEL"), config.log_level));
  return config;
}

// Prints every problem as "<path>: <message>"; returns whether there was none.
bool report(const std::vector<outlive::app::Problem>& problems, std::ostream& out) {
  for (const auto& p : problems) out << p.path << ": " << p.message << "\n";
  return problems.empty();
}

int cmd_check(const std::string& path, int nats_timeout_ms) {
  const auto config = load_config(path);
  auto problems = outlive::app::check_database(config);
  auto nats = outlive::app::check_nats(config, std::chrono::milliseconds(nats_timeout_ms));
  problems.insert(problems.end(), nats.begin(), nats.end());
  auto jwt = outlive::app::check_jwt(config);
  problems.insert(problems.end(), jwt.begin(), jwt.end());
  auto hooks = outlive::app::check_hooks(config);
  problems.insert(problems.end(), hooks.begin(), hooks.end());
  if (!report(problems, std::cout)) {
    std::cout << problems.size() << (problems.size() == 1 ? " problem" : " problems") << " in "
              << path << "\n";
    return 1;
  }
  std::cout << path << ": ok (" << outlive::app::statement_count(config)
            << " statements prepared, Postgres and NATS answer)\n";
  return 0;
}

int cmd_serve(const std::string& path) {
  auto config = load_config(path);
  // A query Postgres refuses would otherwise pass start-up and fail on the first subscriber.
  const auto problems = outlive::app::check_database(config);
  if (!problems.empty()) {
    for (const auto& p : problems) {
      outlive::log::error("configuration check failed", {{"path", p.path}, {"error", p.message}});
    }
    outlive::log::error("not starting",
                        {{"failed", problems.size()}, {"check", "outlive check --config " + path}});
    return 1;
  }
  return run_replica(std::move(config));
}

int cmd_cursor(const std::string& path, const std::string& app) {
  const auto config = load_config(path);
  outlive::topic::Client client(config.nats, "outlive-cursor", config.nats_options);
  std::cout << client.head_cursor(app) << "\n";
  return 0;
}

// The embedded default: our own Postgres and NATS in a data folder, migrations, one replica.
int cmd_dev(const std::string& config_path, const std::string& data) {
  std::filesystem::create_directories(data);
  auto config = load_config(config_path);
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
  CLI::App cli(
      "outlive: live updates from a Postgres outbox, through NATS JetStream, to browser "
      "websockets.\nEvery configuration field can also be set from the environment "
      "(OUTLIVE_ + its path, docs/CONFIG.md).",
      "outlive");
  cli.set_version_flag("--version", "outlive " OUTLIVE_VERSION, "print the version and exit");
  cli.require_subcommand(1);
  cli.footer(
      "Exit status: 0 done; 1 a failure of the deployment (a query Postgres rejects, a server "
      "that does not answer); 2 a usage or configuration error.\n"
      "outlive <command> --help prints that command's options.");
  const char* config_help =
      "the configuration (JSON, docs/CONFIG.md; required); OUTLIVE_* environment variables "
      "override it";

  std::string config_path;
  auto* serve = cli.add_subcommand(
      "serve",
      "run a replica; first prepares every SQL statement of the configuration and refuses to "
      "start (exit 1) when Postgres rejects one");
  serve->add_option("--config", config_path, config_help);

  std::string database;
  auto* migrate = cli.add_subcommand("migrate", "apply the sql/ migrations (idempotent)");
  migrate->add_option("--database", database,
                      "Postgres URL; default: OUTLIVE_DATABASE_URL or the file named by "
                      "OUTLIVE_DATABASE_URL_FILE");

  int nats_timeout_ms = 5000;
  auto* check = cli.add_subcommand(
      "check",
      "load the configuration, connect to Postgres and NATS, prepare every SQL statement; "
      "print each failure with its path. Exit 0 when all are valid, 1 when one fails, 2 for a "
      "usage or configuration error");
  check->add_option("--config", config_path, config_help);
  check->add_option("--nats-timeout-ms", nats_timeout_ms, "how long to wait for NATS to answer")
      ->capture_default_str()
      ->check(CLI::Range(1, 600000));

  auto* version = cli.add_subcommand("version", "print the version");

  std::string app_id;
  auto* cursor = cli.add_subcommand("cursor", "print an app's topic head as a cursor");
  cursor->add_option("--config", config_path, config_help);
  cursor->add_option("--app", app_id, "the app id (required)");

  std::string dev_config = "examples/inventory/outlive.json";
  std::string data = ".outlive-dev";
  auto* dev = cli.add_subcommand("dev", "run on an embedded Postgres and NATS");
  dev->add_option("--config", dev_config, config_help)->capture_default_str();
  dev->add_option("--data", data, "the folder of the embedded servers' data")
      ->capture_default_str();

  // CLI11 would report a misspelled command as "a subcommand is required": name it instead.
  if (argc > 1 && argv[1][0] != '-') {
    const auto known = cli.get_subcommands([&](CLI::App* c) { return c->get_name() == argv[1]; });
    if (known.empty()) {
      std::cerr << "outlive: unknown command " << argv[1]
                << "\nRun with --help for more information.\n";
      return kExitConfig;
    }
  }
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 gives each parse error its own exit code; ours is 2 for every usage error.
    const int code = cli.exit(e);
    return code == 0 ? 0 : kExitConfig;
  }

  // Checked after parsing rather than with CLI11's required(), which would report a missing
  // --config before a misspelled flag (--confg) that is the actual mistake.
  const std::string command = cli.get_subcommands().front()->get_name();
  const bool needs_config = *serve || *check || *cursor;
  if ((needs_config && config_path.empty()) || (*cursor && app_id.empty())) {
    std::cerr << "outlive " << command << ": "
              << (config_path.empty() ? "--config FILE" : "--app APP")
              << " is required\nRun with --help for more information.\n";
    return kExitConfig;
  }

  // Block the stop signals in every thread; main waits for them with sigwait.
  sigset_t set = stop_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  try {
    if (*version) {
      std::cout << "outlive " OUTLIVE_VERSION "\n";
      return 0;
    }
    outlive::log::set_min_level(outlive::log::level_from_environment());
    if (*migrate) return cmd_migrate(database);
    if (*serve) return cmd_serve(config_path);
    if (*check) return cmd_check(config_path, nats_timeout_ms);
    if (*cursor) return cmd_cursor(config_path, app_id);
    if (*dev) return cmd_dev(dev_config, data);
    return kExitConfig;
  } catch (const outlive::Error& e) {
    // One JSON line, like every other line of a running command: a log collector would file a
    // plain-text copy as a second, unparsed event.
    outlive::log::error(e.what(), {{"command", command}});
    return e.code() == outlive::Errc::invalid_input ? kExitConfig : 1;
  } catch (const std::exception& e) {
    outlive::log::error(e.what(), {{"command", command}});
    return 1;
  }
}
