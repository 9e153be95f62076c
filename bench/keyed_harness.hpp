#pragma once
// What keyed_bench's workloads share (bench/keyed_bench.cpp: W1; bench/keyed_workloads.cpp: W2
// and the reconnect storm): the flags, the services (an embedded PostgreSQL 15 and nats-server on
// loopback, src/harness), real `outlive serve --config FILE` replicas as child processes, the
// writers that number every key's updates, and the kernel's floor per frame in the same run.
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <pqxx/pqxx>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/common.hpp"
#include "bench/fanout_client.hpp"
#include "bench/floor.hpp"
#include "bench/load.hpp"
#include "bench/wire.hpp"
#include "harness/embedded_nats.hpp"
#include "harness/embedded_postgres.hpp"
#include "harness/process.hpp"
#include "outbox/migrate.hpp"

namespace outlive::bench::keyed {

using Steady = std::chrono::steady_clock;
using nlohmann::json;
using namespace std::chrono_literals;

enum class Workload { w1, w2, storm };

struct Flags {
  Workload workload = Workload::w1;
  int sockets = 2000;
  double rate = 2000;  // updates/s (storm: 20, flowing through the storm)
  double seconds = 20;
  int keys = 1000;          // W2, storm: keys shared by the sockets
  int subs = 4;             // W2, storm: subscriptions per socket, each on its own key
  double access_rate = 5;   // W2: access updates/s
  int storm_jitter_ms = 0;  // storm: reconnects spread over [0, this) ms; 0: all at once
  int writers = 2;
  int batch_ms = 10;
  int sample_every = 1;
  int client_threads = 1;
  int open_concurrency = 64;
  int floor_rounds = 20;
  int io_threads = 2;
  double drain_timeout = 30;
  double settle = 0;
  json extra = json::object();  // --replica-config-extra
  std::optional<json> ab;       // --ab (W1)
  std::string ab_binary;        // --ab-binary (W1): B runs this `outlive` (another build)
  std::string log_dir;
  std::string command;
};

// ---------------------------------------------------------------------------------------------
// /proc and small helpers

inline long rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return 0;
}

inline double cpu_of(pid_t pid) {
  const auto p = read_proc(std::to_string(pid));
  return p ? p->own : 0;
}

// CPU-s per second the process `pid` spends once the work just done has settled (at most 30 s
// of looking, a second at a time), so an RSS read next is of an idle process.
inline double wait_idle_cpu(pid_t pid) {
  double per_s = 0;
  for (int i = 0; i < 30; ++i) {
    const double c0 = cpu_of(pid);
    std::this_thread::sleep_for(std::chrono::seconds(1));
    per_s = cpu_of(pid) - c0;
    if (per_s < 0.05) break;
  }
  return per_s;
}


// The CPU of the services around the replica: PostgreSQL (the postmaster, its backends and what it
// reaped), nats-server, and this process (writers and load client).
struct Around {
  double postgres = 0, nats = 0, self = 0;
  Around operator-(const Around& o) const {
    return {postgres - o.postgres, nats - o.nats, self - o.self};
  }
};

inline Around sample_around() {
  const ServiceCpu services = service_cpu(read_procs());
  return {services.postgres, services.nats, self_cpu_seconds()};
}

// p in [0, 1] of microseconds, in ms.
inline double percentile(std::vector<int64_t>& v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i =
      std::min(v.size() - 1, static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())) - 1));
  return static_cast<double>(v[i]) / 1000.0;
}

inline double d(long v) { return static_cast<double>(v); }
inline double d(unsigned long v) { return static_cast<double>(v); }
inline std::string kib(long v) { return thousands(static_cast<double>(v)) + " KiB"; }

// Waits until `done()` or `seconds` passed, polling every `poll`; returns done()'s last answer.
template <typename Done>
bool wait_until(Done&& done, double seconds, std::chrono::milliseconds poll = 20ms) {
  const auto start = Steady::now();
  for (;;) {
    if (done()) return true;
    if (seconds_since(start) > seconds) return false;
    std::this_thread::sleep_for(poll);
  }
}

// After the last update frame: the progress frames the last updates leave owed (at most one a
// second per socket) until none came for 1.2 s, 5 s at most; they are part of what a workload
// costs. Returns the client's stats at the end.
inline GroupStats wait_progress_quiet(Client& client, GroupStats now) {
  const auto tail = Steady::now();
  for (uint64_t last_progress = now.progress; seconds_since(tail) < 5;) {
    std::this_thread::sleep_for(1200ms);
    now = client.stats(kOutlive);
    if (now.progress == last_progress) break;
    last_progress = now.progress;
  }
  return now;
}

// ---------------------------------------------------------------------------------------------
// A real `outlive serve --config FILE` child process

struct Replica {
  int port = 0;
  std::string config_file, log_file;
  std::unique_ptr<harness::ChildProcess> process;

  pid_t pid() const { return process->pid(); }

  // Waits for /readyz (a replica that refused its configuration has exited: says why at once).
  void wait_ready() const {
    const auto deadline = Steady::now() + 60s;
    while (Steady::now() < deadline && process->running()) {
      auto r = http_get(port, "/readyz");
      if (r && r->first == 200) return;
      std::this_thread::sleep_for(50ms);
    }
    throw std::runtime_error("the replica did not become ready on port " + std::to_string(port) +
                             "\n" + harness::tail_of_file(log_file));
  }

  // The sum of a metric family on its /metrics (-1 when /metrics did not answer).
  double metric(const std::string& name) const {
    auto r = http_get(port, "/metrics");
    if (!r || r->first != 200) return -1;
    return metric_sum(r->second, name);
  }

  // The warnings it logged (log level warn) from byte `from` of its log on, by message:
  // "replica logged 3x \"...\"; ".
  std::string warnings_since(std::streamoff from) const {
    std::ifstream log(log_file);
    log.seekg(from);
    std::map<std::string, int> warnings;
    for (std::string line; std::getline(log, line);) {
      const auto j = json::parse(line, nullptr, false);
      warnings[j.is_object() ? j.value("msg", std::string("?")) : std::string("(not JSON)")]++;
    }
    std::string out;
    for (const auto& [msg, n] : warnings)
      out += "replica logged " + std::to_string(n) + "x \"" + msg + "\"; ";
    return out;
  }
  std::streamoff log_size() const {
    std::ifstream log(log_file, std::ios::ate);
    return log ? static_cast<std::streamoff>(log.tellg()) : 0;
  }
};

// ---------------------------------------------------------------------------------------------
// The services: PostgreSQL with the outbox and the API keys, nats-server

struct Services {
  const Flags& flags;
  harness::EmbeddedPostgres postgres;
  harness::EmbeddedNats nats;
  std::string db, dir;
  int replicas = 0;

  explicit Services(const Flags& f) : flags(f) {}

  void sql(const std::string& text) const {
    pqxx::connection c(db);
    pqxx::work tx(c);
    tx.exec(text);
    tx.commit();
  }

  std::string server_version() const {
    pqxx::connection c(db);
    return pqxx::nontransaction(c).exec("SHOW server_version")[0][0].as<std::string>();
  }

  void settle() const {
    settle_before_phase(flags.settle);
  }

  // A migrated database and one API key per socket: "key<i>" is viewer "user:u<i>" (i from 1).
  void setup() {
    dir = flags.log_dir.empty() ? harness::make_temp_dir("outlive-keyed-") : flags.log_dir;
    std::filesystem::create_directories(dir);
    db = postgres.create_database("keyed");
    outbox::migrate(db);
    sql("CREATE SCHEMA auth;"
        "CREATE TABLE auth.api_keys (key_sha256 text PRIMARY KEY, subject text, actor text, "
        "scopes text[], revoked_at timestamptz);"
        "INSERT INTO auth.api_keys SELECT encode(sha256(('key' || i)::bytea), 'hex'), "
        "'user:u' || i, 'user:u' || i, '{read}', NULL FROM generate_series(1, " +
        std::to_string(flags.sockets) + ") i; ANALYZE auth.api_keys;");
  }

  // A replica's configuration: these services, API keys, `apps` and the "server" section.
  json config(int port, const json& server, const json& apps) const {
    return {{"replica", "keyed-" + std::to_string(replicas)},
            {"listen", "127.0.0.1:" + std::to_string(port)},
            {"database", db},
            {"nats", {nats.url()}},
            {"server", server},
            {"auth",
             {{"api_keys",
               "SELECT subject, actor, scopes, false AS app_session FROM auth.api_keys WHERE "
               "key_sha256 = $1 AND revoked_at IS NULL"}}},
            {"apps", apps}};
  }

  // Starts a replica (log level warn) and waits until it is ready.
  Replica start_replica(const std::string& label, const json& server, const json& apps,
                        const std::string& binary = OUTLIVE_BINARY) {
    ++replicas;
    Replica r;
    r.port = harness::free_port();
    const std::string tag = "replica-" + std::to_string(replicas);
    r.config_file = dir + "/" + tag + ".json";
    r.log_file = dir + "/" + tag + ".log";
    std::ofstream(r.config_file) << config(r.port, server, apps).dump(2);
    progress(label + ": starting " + binary + " serve, config " + r.config_file + ", server " +
             server.dump());
    r.process = std::make_unique<harness::ChildProcess>(
        std::vector<std::string>{binary, "serve", "--config", r.config_file}, r.log_file,
        std::nullopt, std::vector<std::string>{"OUTLIVE_LOG_LEVEL=warn"});
    r.wait_ready();
    return r;
  }
};

// ---------------------------------------------------------------------------------------------
// The writers

// Updates to random keys among `keys` at `rate` per second, from `writers` connections, in one
// transaction per `batch_ms` tick (`publish_live` per update, then `wake`), for `seconds` or, when
// `seconds` <= 0, until `stop`. A key belongs to one writer (k % writers), so its updates commit
// in the order they are numbered: the data carries "s" (the update's number among its key's), "n"
// (among all) and "t" (clock_timestamp() in the writing transaction, µs), padded to about 100
// bytes, and every subscriber checks that it receives 1, 2, 3, ... of each key it follows.
struct WritePlan {
  std::string app;
  int keys = 0;
  std::function<std::string(int)> key_name;  // of key k in [0, keys)
  double rate = 0, seconds = 0;
  int writers = 1, batch_ms = 10;
  const std::atomic<bool>* stop = nullptr;  // with seconds <= 0
};

struct Writes {
  std::vector<int64_t> written;  // per key: its updates committed (its last "s")
  int64_t total = 0, transactions = 0;
  double seconds = 0, behind_ms = 0;  // writing; the latest a tick started
  std::string error;
};

inline Writes write_keyed_updates(const std::string& db, const WritePlan& plan,
                                  Steady::time_point t0) {
  Writes out;
  out.written.assign(static_cast<size_t>(plan.keys), 0);
  const int writers = plan.writers;
  const bool timed = plan.seconds > 0;
  const int64_t total = timed ? std::llround(plan.rate * plan.seconds) : INT64_MAX;
  std::atomic<int64_t> transactions{0}, behind_us{0}, next_n{1};
  std::mutex error_mutex;
  std::atomic<bool> failed{false};
  const std::string pad(40, 'x');
  std::vector<std::thread> threads;
  for (int w = 0; w < writers; ++w) {
    threads.emplace_back([&, w] {
      try {
        pqxx::connection conn(db);
        std::vector<int> keys;  // writer w's: k % writers == w
        for (int k = w; k < plan.keys; k += writers) keys.push_back(k);
        if (keys.empty()) return;
        const int64_t mine = timed ? total / writers + (w < total % writers ? 1 : 0) : INT64_MAX;
        const double my_rate = plan.rate / writers;
        std::mt19937_64 random(0x5eed + static_cast<uint64_t>(w));
        std::uniform_int_distribution<size_t> pick(0, keys.size() - 1);
        std::vector<int64_t> seq(static_cast<size_t>(plan.keys), 0);
        int64_t done = 0;
        auto stopped = [&] { return failed || (plan.stop != nullptr && *plan.stop); };
        for (int64_t tick = 1; done < mine && !stopped(); ++tick) {
          const auto due = t0 + std::chrono::milliseconds(tick * plan.batch_ms);
          std::this_thread::sleep_until(due);
          const int64_t late =
              std::chrono::duration_cast<std::chrono::microseconds>(Steady::now() - due).count();
          for (int64_t prev = behind_us.load();
               late > prev && !behind_us.compare_exchange_weak(prev, late);) {
          }
          // Everything due by now (a late tick writes a larger batch).
          const double elapsed = std::chrono::duration<double>(Steady::now() - t0).count();
          const int64_t target =
              std::min(mine, static_cast<int64_t>(std::floor(elapsed * my_rate)));
          if (target <= done) continue;
          std::string text = "BEGIN;";
          std::vector<int> touched;
          for (int64_t j = done; j < target; ++j) {
            const int k = keys[pick(random)];
            const int64_t s = ++seq[static_cast<size_t>(k)];
            touched.push_back(k);
            text += " SELECT events.publish_live('" + plan.app + "', '" + plan.key_name(k) +
                    "', jsonb_build_object('n', " + std::to_string(next_n++) + ", 's', " +
                    std::to_string(s) +
                    ", 't', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, 'p', '" +
                    pad + "'));";
          }
          text += " COMMIT; SELECT events.wake('" + plan.app + "')";
          pqxx::nontransaction(conn).exec(text);
          ++transactions;
          done = target;
          // Committed: the counts become the subscribers' expectations.
          for (int k : touched) out.written[static_cast<size_t>(k)] = seq[static_cast<size_t>(k)];
        }
      } catch (const std::exception& e) {
        std::lock_guard lock(error_mutex);
        out.error = e.what();
        failed = true;
      }
    });
  }
  for (auto& t : threads) t.join();
  out.seconds = seconds_since(t0);
  out.transactions = transactions.load();
  out.behind_ms = static_cast<double>(behind_us.load()) / 1000.0;
  for (int64_t n : out.written) out.total += n;
  return out;
}

// ---------------------------------------------------------------------------------------------
// The kernel's floor, after the workload with the client's sockets closed (so 7,500 sockets fit
// the descriptor limit): as many loopback sockets from the same source addresses, one sendmsg of a
// frame of outlive's size per socket per round; back to back, and at the workload's cadence
// (rounds `cadence_ms` apart: as often as a socket gets a frame, after which its kernel state has
// left the caches).

struct Floor {
  FloorResult back_to_back, cadence;
  int cadence_ms = 0;
  LoadWindow load;
  std::string error;
};

inline Floor run_floor(const Services& services, int sockets, int frame_bytes, int cadence_ms) {
  Floor f;
  f.cadence_ms = cadence_ms;
  progress("kernel floor: " + std::to_string(sockets) + " loopback sockets, frames of " +
           std::to_string(frame_bytes) + " bytes");
  services.settle();
  LoadSampler load;
  try {
    FloorSockets floor_sockets(sockets, kOutlive);
    f.back_to_back = floor_sockets.measure(services.flags.floor_rounds, frame_bytes, 1, 3);
    f.cadence = floor_sockets.measure(5, frame_bytes, 1, 2, f.cadence_ms);
  } catch (const std::exception& e) {
    f.error = e.what();
  }
  f.load = load.stop();
  progress("kernel floor: " + fixed(f.back_to_back.us_per_frame(), 2) + " µs per frame back to " +
           "back, " + fixed(f.cadence.us_per_frame(), 2) + " µs at the workload's cadence" +
           (f.error.empty() ? "" : "; " + f.error));
  return f;
}

}  // namespace outlive::bench::keyed
