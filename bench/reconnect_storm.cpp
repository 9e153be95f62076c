// reconnect_storm: a replica stops under a full load of tabs, and they all come back to another one
// (issue 13, item 4).
//
// One embedded PostgreSQL and nats-server (src/harness), two real `outlive serve` replicas A and B
// on them, this process as the writer and the tabs. N sockets subscribe on A; updates are written
// at --rate per second throughout. A gets SIGTERM and closes every socket with 1012; each socket
// then waits a uniform random delay in [0, --jitter-ms) (full jitter, as clients/js/outlive.js does
// for its first retry) and opens a socket to B with its last cursor (SPEC 5.6: what it missed is
// replayed from B's window). Reported: the time from the last reconnect until every socket has
// received every update committed before its own reconnect, per-socket gaps (must be 0) and
// duplicates over the whole run, and B's CPU from the SIGTERM until all caught up.
//
//   build/bench/reconnect_storm [--sockets 5000] [--rate 20] [--jitter-ms 1000] [--warmup 3]
//                               [--after 3] [--catchup-timeout 20] [--log-dir DIR]
#include <sys/resource.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>
#include <random>
#include <thread>

#include "bench/common.hpp"
#include "bench/load.hpp"
#include "bench/storm_client.hpp"
#include "common/log.hpp"
#include "harness/embedded_nats.hpp"
#include "harness/embedded_postgres.hpp"
#include "harness/process.hpp"
#include "outbox/migrate.hpp"

using namespace outlive;
using namespace outlive::bench;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

struct Flags {
  int sockets = 5000;
  double rate = 20;
  int jitter_ms = 1000;
  double warmup = 3, after = 3, catchup_timeout = 20;
  std::string log_dir, command = "build/bench/reconnect_storm";
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) f.command += std::string(" ") + argv[i];
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--sockets")
      f.sockets = std::stoi(v);
    else if (a == "--rate")
      f.rate = std::stod(v);
    else if (a == "--jitter-ms")
      f.jitter_ms = std::stoi(v);
    else if (a == "--warmup")
      f.warmup = std::stod(v);
    else if (a == "--after")
      f.after = std::stod(v);
    else if (a == "--catchup-timeout")
      f.catchup_timeout = std::stod(v);
    else if (a == "--log-dir")
      f.log_dir = v;
    else {
      std::cerr << "reconnect_storm: unknown flag " << a << "\n";
      std::exit(2);
    }
  }
  if (argc % 2 == 0) {
    std::cerr << "reconnect_storm: every flag takes a value\n";
    std::exit(2);
  }
  return f;
}

void progress(const std::string& text) { std::cerr << "[reconnect_storm] " << text << std::endl; }

double cpu_of(pid_t pid) {
  const auto p = read_proc(std::to_string(pid));
  return p ? p->own : 0;
}

void wait_ready(int port, const std::string& log) {
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < deadline) {
    auto r = http_get(port, "/readyz");
    if (r && r->first == 200) return;
    std::this_thread::sleep_for(50ms);
  }
  throw std::runtime_error("replica on port " + std::to_string(port) + " not ready\n" +
                           harness::tail_of_file(log));
}

std::string ms(double v) { return fixed(v, 0) + " ms"; }

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = parse(argc, argv);
  log::set_min_level(log::Level::warn);
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
  // The servers are our children and die with us; this ends a run that hangs.
  std::thread([] {
    std::this_thread::sleep_for(15min);
    std::cerr << "reconnect_storm: time limit passed\n";
    std::_Exit(3);
  }).detach();
  const double load_before = load_average();
  harness::EmbeddedPostgres postgres;
  harness::EmbeddedNats nats;
  const std::string dir =
      flags.log_dir.empty() ? harness::make_temp_dir("outlive-storm-") : flags.log_dir;
  std::filesystem::create_directories(dir);
  const std::string db = postgres.create_database("storm");
  outbox::migrate(db);
  {
    pqxx::connection c(db);
    pqxx::work tx(c);
    tx.exec("CREATE SCHEMA auth; CREATE TABLE auth.api_keys (key_sha256 text PRIMARY KEY, subject "
            "text, actor text, scopes text[], revoked_at timestamptz); INSERT INTO auth.api_keys "
            "SELECT encode(sha256(('key' || i)::bytea), 'hex'), 'user:u' || i, 'user:u' || i, "
            "'{read}', NULL FROM generate_series(1, " +
            std::to_string(flags.sockets) + ") i; ANALYZE auth.api_keys;");
    tx.commit();
  }
  int ports[2] = {harness::free_port(), 0};
  ports[1] = harness::free_port();
  harness::ChildProcess replicas[2];
  for (int r = 0; r < 2; ++r) {
    const std::string name = r == 0 ? "a" : "b";
    const json config = {
        {"replica", "storm-" + name},
        {"listen", "127.0.0.1:" + std::to_string(ports[r])},
        {"database", db},
        {"nats", {nats.url()}},
        {"auth",
         {{"api_keys",
           "SELECT subject, actor, scopes, false AS app_session FROM auth.api_keys WHERE "
           "key_sha256 = $1 AND revoked_at IS NULL"}}},
        {"apps",
         {{"storm",
           {{"channels",
             {{"open",
               {{"scope", {{"type", "object"}}},
                {"keys", "SELECT 'hot' AS key"},
                {"authorize", "SELECT v->>'id' AS id FROM jsonb_array_elements($2) v"}}}}}}}}}};
    std::ofstream(dir + "/" + name + ".json") << config.dump(2);
    replicas[r] =
        harness::ChildProcess({OUTLIVE_BINARY, "serve", "--config", dir + "/" + name + ".json"},
                              dir + "/" + name + ".log", std::nullopt, {"OUTLIVE_LOG_LEVEL=warn"});
  }
  for (int r = 0; r < 2; ++r) wait_ready(ports[r], dir + (r == 0 ? "/a.log" : "/b.log"));
  progress("replicas A (port " + std::to_string(ports[0]) + ") and B (port " +
           std::to_string(ports[1]) + ") ready; logs in " + dir);

  StormClient client(flags.sockets, ports[0], ports[1], "/api/storm/live", "open",
                     flags.jitter_ms);
  const auto opened = std::chrono::steady_clock::now();
  client.open_all();
  while (client.call([&] { return client.subscribed_on(0); }) < flags.sockets &&
         seconds_since(opened) < 60 + flags.sockets / 50.0)
    std::this_thread::sleep_for(100ms);
  const int on_a = client.call([&] { return client.subscribed_on(0); });
  progress(std::to_string(on_a) + " of " + std::to_string(flags.sockets) +
           " sockets subscribed on A in " + fixed(seconds_since(opened), 1) + " s");

  // The writer: one update per transaction at --rate per second, until told to stop.
  std::atomic<bool> stop_writing{false};
  std::atomic<int64_t> committed{0};
  std::string writer_error;
  std::thread writer([&] {
    try {
      pqxx::connection c(db);
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t n = 1; !stop_writing; ++n) {
        std::this_thread::sleep_until(t0 + std::chrono::duration_cast<std::chrono::nanoseconds>(
                                               std::chrono::duration<double>((n - 1) / flags.rate)));
        pqxx::nontransaction(c).exec(
            "BEGIN; SELECT events.publish_live('storm', 'hot', jsonb_build_object('n', " +
            std::to_string(n) +
            ", 't', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)); COMMIT; SELECT "
            "events.wake('storm')");
        committed = n;
        client.set_committed(n);
      }
    } catch (const std::exception& e) {
      writer_error = e.what();
    }
  });

  LoadSampler steady_load;
  std::this_thread::sleep_for(std::chrono::duration<double>(flags.warmup));
  const LoadWindow steady = steady_load.stop();

  // The storm.
  LoadSampler storm_load;
  const double b_cpu0 = cpu_of(replicas[1].pid());
  const int64_t sigterm_us = wall_us();
  progress("SIGTERM to A after " + std::to_string(committed.load()) + " updates");
  int a_status = 0;
  double a_exit_s = 0;
  std::thread stopper([&] {
    const auto t = std::chrono::steady_clock::now();
    a_status = replicas[0].stop(SIGTERM, 30s);
    a_exit_s = seconds_since(t);
  });
  const auto storm_start = std::chrono::steady_clock::now();
  StormClient::Summary s;
  double b_cpu_caught_up = -1;
  while (seconds_since(storm_start) < flags.catchup_timeout) {
    s = client.call([&] { return client.summary(); });
    if (s.caught_up == flags.sockets) {
      b_cpu_caught_up = cpu_of(replicas[1].pid()) - b_cpu0;
      break;
    }
    std::this_thread::sleep_for(5ms);
  }
  const LoadWindow storm = storm_load.stop();
  progress(std::to_string(s.caught_up) + " of " + std::to_string(flags.sockets) +
           " sockets caught up on B");

  // Live on B for a while, then every socket must hold every update written (1..last).
  LoadSampler after_load;
  std::this_thread::sleep_for(std::chrono::duration<double>(flags.after));
  stop_writing = true;
  writer.join();
  stopper.join();
  const int64_t last = committed.load();
  const auto drain = std::chrono::steady_clock::now();
  StormClient::Final f;
  while (seconds_since(drain) < 10) {
    f = client.call([&] { return client.final_count(last); });
    if (f.complete == flags.sockets) break;
    std::this_thread::sleep_for(50ms);
  }
  const LoadWindow after = after_load.stop();
  const double b_cpu_total = cpu_of(replicas[1].pid()) - b_cpu0;

  // ---- report
  const double last_reconnect_ms = (s.last_sub_us - sigterm_us) / 1000.0;
  const double catch_up_ms = (s.last_caught_up_us - s.last_sub_us) / 1000.0;
  const double reached_ms = (s.last_reached_us - s.last_sub_us) / 1000.0;
  const bool all = s.caught_up == flags.sockets && f.complete == flags.sockets;
  const int64_t gaps = f.holes + f.pending;
  std::vector<std::pair<std::string, LoadWindow>> loads{
      {"steady on A", steady}, {"storm", storm}, {"after", after}};
  std::string verdict = no_verdict(loads);
  if (verdict.empty())
    verdict = all && catch_up_ms <= 2000 && gaps == 0 ? "met" : "**missed**";
  std::cout << "\n### reconnect_storm, " << now_utc() << "\n\n- Machine: " << machine_line()
            << "; shared with other engineers\n"
            << "- Two `outlive serve` replicas on one PostgreSQL 15 and one nats-server "
               "(loopback); "
            << flags.sockets << " API-key sockets (127.x.y.z, 4 per address) on one key; "
            << fixed(flags.rate, 0) << " updates/s, one transaction each, " << fixed(flags.warmup, 0)
            << " s on A before its SIGTERM, " << fixed(flags.after, 0)
            << " s on B after the catch-up; reconnect delay uniform in [0, " << flags.jitter_ms
            << ") ms after the close\n"
            << "- Load average (1 min) start → end: steady " << fixed(steady.start, 2) << " → "
            << fixed(steady.end, 2) << ", storm " << fixed(storm.start, 2) << " → "
            << fixed(storm.end, 2) << ", after " << fixed(after.start, 2) << " → "
            << fixed(after.end, 2) << " (before the run " << fixed(load_before, 2) << ")\n"
            << "- A: exit status " << a_status << " " << fixed(a_exit_s, 2)
            << " s after SIGTERM; closes seen " << s.close_codes << "\n"
            << "- Command: `cmake --build build -j2 --target reconnect_storm outlive && "
            << flags.command << "`\n\n";
  std::cout << "| sockets | updates/s | subscribed on A | resubscribed on B | last reconnect "
               "after SIGTERM | **all caught up after the last reconnect** | all at the head after the "
               "last reconnect (holes aside) | per-socket catch-up "
               "p50 / p99 / max | connect + upgrade on B p50 / p99 / max | gaps: holes (sockets) + not "
               "arrived at the end (sockets) | duplicates | resyncs / errors / retries | B CPU s "
               "(SIGTERM → caught up / → end) | verdict (≤ 2 s, no gap) |\n"
               "|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|---|---|---|\n";
  std::cout << "| " << flags.sockets << " | " << fixed(flags.rate, 0) << " | " << on_a << " | "
            << s.subscribed_b << " | " << ms(last_reconnect_ms) << " | **"
            << (s.caught_up == flags.sockets ? ms(catch_up_ms)
                                             : "not all (" + std::to_string(s.caught_up) + ")")
            << "** | "
            << (s.reached == flags.sockets ? ms(reached_ms)
                                           : "not all (" + std::to_string(s.reached) + ")")
            << " | " << ms(s.p50_ms) << " / " << ms(s.p99_ms) << " / " << ms(s.max_ms) << " | "
            << ms(s.open_p50_ms) << " / " << ms(s.open_p99_ms) << " / " << ms(s.open_max_ms)
            << " | " << f.holes << " (" << f.with_hole << ") + " << f.pending << " ("
            << f.with_pending << ") | " << f.duplicates << " | " << s.resyncs
            << " / " << s.errors << " / " << s.retries << " | "
            << (b_cpu_caught_up >= 0 ? fixed(b_cpu_caught_up, 2) : std::string("-")) << " / "
            << fixed(b_cpu_total, 2) << " | " << verdict << " |\n";
  std::cout << "\nUpdates written: " << last << (writer_error.empty() ? "" : "; writer: " + writer_error)
            << ". *Caught up*: the socket's subscription on B is live and it holds every update "
               "committed before it sent its sub (n = 1.. without a hole). *Gaps* count updates "
               "1.." << last << " a socket never received by the end: *holes* below the newest "
               "update it holds, and updates after it that had not arrived 10 s after the last "
               "write; *duplicates*, updates a "
               "socket received twice. *Per-socket catch-up*: from its sub on B to caught up."
            << (s.first_error.empty() ? "" : " First error: " + s.first_error) << "\n";
  for (const auto& e : f.examples) std::cout << "- hole: " << e << "\n";
  return all && gaps == 0 ? 0 : 1;
}
