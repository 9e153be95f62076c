// fanout_bench: one key, N websocket subscribers, updates at fixed rates (issues 5 and 6).
//
// Everything runs on this machine in one run: an embedded PostgreSQL 15 and nats-server on loopback
// (src/harness), a real `outlive serve --config FILE` child process (the replica whose CPU is
// measured, from /proc/<pid>/stat), the minimal Node `ws` broadcast server of bench/ws_baseline
// (the baseline, measured the same way), and this process: the writers and the load client.
//
//   build/bench/fanout_bench [--sockets 5000] [--rates 1,5,20,100,500] [--seconds 5]
//                            [--no-baseline] [--no-auth] [--revocations 2] [--writers 2]
//                            [--sample-every 10] [--client-threads 1] [--drain-timeout 20]
//                            [--max-rss-mib 6144] [--log-dir DIR] [--floor-rounds 20]
//                            [--settle-load L] [--idle-before S1,S2,...] [--hook]
//
// --settle-load L waits (up to 180 s) before each phase, the floor and each revocation until the
// 1-minute load average is at most L (0.5 lets a 10 s phase on 2 busy cores end under the
// verdict's 1.0; without it a phase starts with the previous one's tail).
//
// --idle-before S1,S2,... leaves the replica idle for Si seconds before revocation i (after its
// subscribers are back), to measure a revocation after a pause: on the PVM guest these benches run
// on, a process that slept pays again for every page it touches (bench/retouch.hpp), and each
// revocation prints that cost for its own pause beside the authorize floor.
//
// A phase writes for --seconds, then waits until every frame arrived or --drain-timeout passed.
// A server that cannot keep up is measured up to that cut (frames/s delivered and CPU until then);
// its backlog is then dropped by closing and reopening that server's sockets, so it does not
// spill into the next phase.
//
// Per rate, phases run back to back (order alternates between rates, so load drift hits them
// alike):
//   outlive/open     channel "open": authorize() is a constant query, everyone may read ("off")
//   ws               the Node baseline, the same number of sockets and the same frame size
//   outlive/members  channel "members": authorize() per SPEC 6.1, a join on a membership table
//   ("on")
// Then the revocation: every subscriber of the key loses its membership in one transaction with
// an access update (SPEC 2.3); the time from that commit to the last `revoked` frame.
//
// The load client is a small epoll websocket client (bench/fanout_client.hpp; no Beast: Beast
// translation units take minutes to build here, and a client that reads large chunks and parses
// frame headers leaves more of the 2 cores to the servers). It answers pings, records every update
// frame per socket, and parses the commit time out of the frames of every --sample-every'th socket.
#include <sys/resource.h>
#include <unistd.h>

#include <dirent.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <pqxx/pqxx>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bench/common.hpp"
#include "bench/fanout_client.hpp"
#include "bench/floor.hpp"
#include "bench/load.hpp"
#include "bench/retouch.hpp"
#include "bench/wire.hpp"
#include "support/hook_server.hpp"
#include "common/log.hpp"
#include "harness/embedded_nats.hpp"
#include "harness/embedded_postgres.hpp"
#include "harness/process.hpp"
#include "outbox/migrate.hpp"

using namespace outlive;
using namespace outlive::bench;
using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;
using nlohmann::json;

namespace {

// ---------------------------------------------------------------------------------------------
// Flags

struct Flags {
  int sockets = 5000;
  std::vector<double> rates{1, 5, 20, 100, 500};
  double seconds = 5;
  bool baseline = true;
  bool auth = true;
  int revocations = 2;
  int writers = 2;
  int sample_every = 10;
  int client_threads = 1;
  int open_concurrency = 64;
  int floor_rounds = 20;
  int io_threads = 2;  // the replica's server.io_threads (the machine's cores by default)
  double drain_timeout = 20;
  double settle = 0;  // --settle-load: 0 = do not wait
  std::vector<double> idle_before;  // --idle-before: seconds before each revocation, 0 if missing
  bool hook = false;  // --hook: every second revocation through a hook channel (SPEC 5.4 rev 4)
  long max_rss_mib = 6144;
  std::string log_dir;
  std::string outlive = OUTLIVE_BINARY;  // another build's, to compare two in runs side by side
  std::string command;
};

[[noreturn]] void usage(const std::string& error) {
  std::cerr << "fanout_bench: " << error << "\n"
            << "usage: fanout_bench [--sockets N] [--rates R1,R2,...] [--seconds S] "
               "[--no-baseline] [--no-auth]\n"
               "                    [--revocations N] [--writers W] [--sample-every K] "
               "[--client-threads T]\n"
               "                    [--open-concurrency C] [--drain-timeout S] [--max-rss-mib M] "
               "[--log-dir DIR]\n"
               "                    [--io-threads N] [--outlive PATH] [--settle-load L] "
               "[--idle-before S1,S2,...] [--hook]\n";
  std::exit(2);
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  f.command = "build/bench/fanout_bench";
  for (int i = 1; i < argc; ++i) f.command += std::string(" ") + argv[i];
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) usage(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  auto integer = [&](const std::string& name, const std::string& v, long lo, long hi) {
    try {
      size_t used = 0;
      const long n = std::stol(v, &used);
      if (used != v.size() || n < lo || n > hi) throw std::out_of_range(v);
      return n;
    } catch (const std::exception&) {
      usage(name + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
            "], got " + v);
    }
  };
  auto real = [&](const std::string& name, const std::string& v) {
    try {
      const double d = std::stod(v);
      if (!(d > 0)) throw std::out_of_range(v);
      return d;
    } catch (const std::exception&) {
      usage(name + " must be a positive number, got " + v);
    }
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--sockets")
      f.sockets = static_cast<int>(integer(a, value(i), 1, 60000));
    else if (a == "--rates") {
      f.rates.clear();
      std::stringstream ss(value(i));
      for (std::string item; std::getline(ss, item, ',');) {
        if (!item.empty()) f.rates.push_back(real(a, item));
      }
      if (f.rates.empty()) usage("--rates needs at least one rate");
    } else if (a == "--seconds")
      f.seconds = real(a, value(i));
    else if (a == "--no-baseline")
      f.baseline = false;
    else if (a == "--no-auth")
      f.auth = false;
    else if (a == "--revocations")
      f.revocations = static_cast<int>(integer(a, value(i), 0, 20));
    else if (a == "--writers")
      f.writers = static_cast<int>(integer(a, value(i), 1, 16));
    else if (a == "--sample-every")
      f.sample_every = static_cast<int>(integer(a, value(i), 1, 100000));
    else if (a == "--client-threads")
      f.client_threads = static_cast<int>(integer(a, value(i), 1, 8));
    else if (a == "--open-concurrency")
      f.open_concurrency = static_cast<int>(integer(a, value(i), 1, 5000));
    else if (a == "--floor-rounds")
      f.floor_rounds = static_cast<int>(integer(a, value(i), 1, 1000));
    else if (a == "--drain-timeout")
      f.drain_timeout = real(a, value(i));
    else if (a == "--max-rss-mib")
      f.max_rss_mib = integer(a, value(i), 64, 1 << 20);
    else if (a == "--log-dir")
      f.log_dir = value(i);
    else if (a == "--outlive")
      f.outlive = value(i);
    else if (a == "--settle-load")
      f.settle = real(a, value(i));
    else if (a == "--idle-before") {
      std::stringstream ss(value(i));
      for (std::string item; std::getline(ss, item, ',');)
        f.idle_before.push_back(item == "0" ? 0.0 : real(a, item));
    } else if (a == "--io-threads")
      f.io_threads = static_cast<int>(integer(a, value(i), 1, 64));
    else if (a == "--hook")
      f.hook = true;
    else if (a == "--help" || a == "-h")
      usage("help");
    else
      usage("unknown flag " + a);
  }
  if (f.seconds > 600) usage("--seconds must be at most 600");
  return f;
}

// ---------------------------------------------------------------------------------------------
// Time, text, /proc

long rss_mib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6)) / 1024;
  }
  return 0;
}

// CPU seconds of everything involved, and of the whole machine (busy jiffies of all cores).
struct Cpu {
  double outlive = 0, baseline = 0, postgres = 0, nats = 0, client = 0, machine_busy = 0;
  Cpu operator-(const Cpu& o) const {
    return {outlive - o.outlive, baseline - o.baseline, postgres - o.postgres,
            nats - o.nats,       client - o.client,     machine_busy - o.machine_busy};
  }
};

double machine_busy_seconds() {
  static const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  std::ifstream in("/proc/stat");
  std::string cpu;
  double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  return (user + nice + system + irq + softirq + steal) / tick;
}

Cpu sample_cpu(pid_t outlive_pid, pid_t baseline_pid) {
  Cpu c;
  c.client = self_cpu_seconds();
  const auto procs = read_procs();
  for (const auto& p : procs) {
    if (p.pid == outlive_pid) c.outlive = p.own;
    if (p.pid == baseline_pid) c.baseline = p.own;
  }
  const ServiceCpu services = service_cpu(procs);
  c.postgres = services.postgres;
  c.nats = services.nats;
  c.machine_busy = machine_busy_seconds();
  return c;
}

// Postgres's CPU by what each process serves: the name its client gave (application_name: the
// replica's pool is "outlive-pool", its publisher "outlive-publisher") or its backend_type. Read
// from /proc/<pid>/schedstat (nanoseconds, exact; /proc/<pid>/stat counts 10 ms ticks, too coarse
// for a 100 ms window). Processes started after `labels` was read count as "started since".
struct PostgresShares {
  std::map<int, std::string> labels;  // pid -> label, from pg_stat_activity
  std::map<int, double> cpu;          // pid -> seconds on a CPU so far

  // Over `c`, open already: a backend's start and exit cost ~35 ms of CPU here, which would land
  // in the window being measured.
  static PostgresShares read(pqxx::connection& c) {
    PostgresShares s;
    for (const auto& row : pqxx::nontransaction(c).exec(
             "SELECT pid, coalesce(nullif(application_name, ''), backend_type) FROM "
             "pg_stat_activity"))
      s.labels[row[0].as<int>()] = row[1].c_str();
    s.sample();
    return s;
  }
  void sample() {
    cpu.clear();
    const auto procs = read_procs();
    const auto postmasters = postmasters_of(procs);
    for (const auto& p : procs) {
      if (std::find(postmasters.begin(), postmasters.end(), p.ppid) == postmasters.end()) continue;
      if (const auto s = on_cpu_seconds(p.pid)) cpu[p.pid] = *s;
    }
  }
  // "outlive-pool 41 ms, client backend 12 ms, ..." for the time since `before`, largest first.
  std::string since(const PostgresShares& before) const {
    std::map<std::string, double> by_label;
    for (const auto& [pid, seconds] : cpu) {
      auto b = before.cpu.find(pid);
      auto l = before.labels.find(pid);
      const std::string label = l != before.labels.end() ? l->second : "started since";
      by_label[label] += seconds - (b != before.cpu.end() ? b->second : 0.0);
    }
    std::vector<std::pair<double, std::string>> sorted;
    for (const auto& [label, seconds] : by_label)
      if (seconds >= 0.0005) sorted.emplace_back(seconds, label);
    std::sort(sorted.rbegin(), sorted.rend());
    std::string out;
    for (const auto& [seconds, label] : sorted)
      out += (out.empty() ? "" : ", ") + label + " " + fixed(seconds * 1e3, 0) + " ms";
    return out.empty() ? "none" : out;
  }
};

double percentile(std::vector<int64_t>& v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i =
      std::min(v.size() - 1, static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())) - 1));
  return static_cast<double>(v[i]) / 1000.0;  // ms
}

// ---------------------------------------------------------------------------------------------
// The run

const char* kApp = "fanout";
const char* kKey = "hot";
const char* kOpenAuthorize = "SELECT v->>'id' AS id FROM jsonb_array_elements($2) v";
const char* kMembersAuthorize =
    "SELECT v->>'id' AS id FROM jsonb_array_elements($2) v JOIN bench.members m ON m.key = $1 AND "
    "m.subject = "
    "v->>'accessSubject'";

enum class Target { outlive_open, baseline, outlive_members };

std::string target_short(Target t) {
  switch (t) {
    case Target::outlive_open:
      return "outlive/open";
    case Target::baseline:
      return "ws";
    case Target::outlive_members:
      return "outlive/members";
  }
  return "";
}

struct PhaseResult {
  Target target{};
  double rate = 0;
  int64_t sent = 0;
  double write_seconds = 0;
  double behind_ms = 0;  // how far the writers fell behind their schedule, at most
  int sockets = 0;
  int64_t expected = 0, delivered = 0;
  double span_s = 0;  // first write -> last frame
  double lag_s = 0;   // last write -> last frame
  Cpu cpu;
  double server_cpu = 0;
  double p50 = 0, p99 = 0, max = 0;
  size_t samples = 0;
  uint64_t per_socket_min = 0, per_socket_max = 0;
  uint64_t closes = 0;
  std::map<int, uint64_t> close_codes;
  long rss_peak = 0;
  double authorize_calls = 0;
  double rechecks = 0;  // the replica's credential re-checks during the phase (not ws's work)
  LoadWindow load;
  double others_cpu = 0;  // the machine's busy CPU less this run's processes: other people's work
  std::string note;
  bool complete = false;

  double delivered_fps() const { return span_s > 0 ? static_cast<double>(delivered) / span_s : 0; }
  double offered_fps() const { return rate * sockets; }
  double frames_per_cpu_s() const {
    return server_cpu > 0 ? static_cast<double>(delivered) / server_cpu : 0;
  }
  double cpu_per_million() const {
    return delivered > 0 ? server_cpu / (static_cast<double>(delivered) / 1e6) : 0;
  }
};

size_t file_size(const std::string& path) {
  std::ifstream in(path, std::ios::ate | std::ios::binary);
  return in ? static_cast<size_t>(in.tellg()) : 0;
}

struct Bench {
  const Flags& flags;
  harness::EmbeddedPostgres postgres;
  harness::EmbeddedNats nats;
  std::string db;
  std::string dir;
  int outlive_port = 0, baseline_port = 0;
  harness::ChildProcess replica;
  harness::ChildProcess node;
  std::unique_ptr<Client> client;
  std::unique_ptr<PublishSocket> publish;
  RetouchProbe retouch;  // what memory touched again after a revocation's pause costs (32 MiB)
  std::vector<std::unique_ptr<pqxx::connection>> writer_conns;
  int64_t next_n = 1;
  int sub_counter = 1;
  int node_starts = 0;
  double last_behind_ms = 0;
  std::string channel = "open";  // what the outlive sockets follow now
  std::string baseline_frame_prefix;
  int update_frame_bytes = 0;  // one update frame as outlive sends it, websocket header included

  explicit Bench(const Flags& f) : flags(f) {}

  pid_t outlive_pid() { return replica.pid(); }
  pid_t baseline_pid() { return flags.baseline ? node.pid() : -1; }

  void sql(const std::string& text) {
    pqxx::connection c(db);
    pqxx::work tx(c);
    tx.exec(text);
    tx.commit();
  }

  // --settle-load: the phase starts once the machine is quiet.
  void settle() const {
    settle_before_phase(flags.settle);
  }

  double metric(const std::string& name) {
    const auto started = Steady::now();
    auto r = http_get(outlive_port, "/metrics");
    // (a scrape is served on an io thread: what it takes there, its sockets wait)
    slowest_scrape_ms = std::max(slowest_scrape_ms, seconds_since(started) * 1e3);
    ++scrapes;
    return r && r->first == 200 ? metric_sum(r->second, name) : -1;
  }
  double slowest_scrape_ms = 0;
  int scrapes = 0;

  // --hook: the "members" channel again as a hook channel, answered in this process by the same
  // query the SQL channel runs (one statement per authorize call, on a connection per hook
  // thread), so the two revocations differ only by the HTTP hop and the hook's JSON.
  std::unique_ptr<testing::HookServer> hooks;
  void start_hook(json& config, const json& scope) {
    const std::string secret = "fanout_bench hook secret, 32 bytes at least";
    std::ofstream(dir + "/hook.secret") << secret << "\n";
    hooks = std::make_unique<testing::HookServer>(secret, [db = db](const testing::HookServer::Request& r) {
      const json q = json::parse(r.body);
      if (q.at("op") == "keys") return testing::HookServer::Answer{200, R"({"keys":["hot"]})"};
      thread_local std::unique_ptr<pqxx::connection> conn;
      if (!conn) conn = std::make_unique<pqxx::connection>(db);
      pqxx::nontransaction tx(*conn);
      json allowed = json::array();
      for (const auto& row : tx.exec_params(
               "SELECT v->>'id' FROM jsonb_array_elements($2::jsonb) v JOIN bench.members m ON "
               "m.key = $1 AND m.subject = v->>'accessSubject'",
               q.at("key").get<std::string>(), q.at("viewers").dump()))
        allowed.push_back(row[0].as<std::string>());
      return testing::HookServer::Answer{200, json{{"allowed", allowed}}.dump()};
    });
    config["hook_secret_file"] = dir + "/hook.secret";
    config["apps"][kApp]["channels"]["members_hook"] = {
        {"scope", scope}, {"hook", {{"url", hooks->url()}, {"timeout_ms", 10000}}}};
  }

  void setup() {
    dir = flags.log_dir.empty() ? harness::make_temp_dir("outlive-fanout-") : flags.log_dir;
    if (!flags.log_dir.empty()) std::system(("mkdir -p '" + dir + "'").c_str());
    db = postgres.create_database("fanout");
    outbox::migrate(db);
    const std::string n = std::to_string(flags.sockets);
    sql("CREATE SCHEMA auth;"
        "CREATE TABLE auth.api_keys (key_sha256 text PRIMARY KEY, subject text, actor text, scopes "
        "text[], "
        "revoked_at timestamptz);"
        "INSERT INTO auth.api_keys SELECT encode(sha256(('key' || i)::bytea), 'hex'), 'user:u' || "
        "i, 'user:u' || i,"
        " '{read}', NULL FROM generate_series(1, " +
        n +
        ") i;"
        "CREATE SCHEMA bench;"
        "CREATE TABLE bench.members (key text, subject text, PRIMARY KEY (key, subject));"
        "INSERT INTO bench.members SELECT 'hot', 'user:u' || i FROM generate_series(1, " +
        n +
        ") i;"
        "ANALYZE auth.api_keys; ANALYZE bench.members;");
    outlive_port = harness::free_port();
    const json any_scope = {{"type", "object"}};
    json config = {{"replica", "fanout"},
                   {"listen", "127.0.0.1:" + std::to_string(outlive_port)},
                   {"database", db},
                   {"nats", {nats.url()}},
                   {"server", {{"io_threads", flags.io_threads}}},
                   {"auth",
                    {{"api_keys",
                      "SELECT subject, actor, scopes, false AS app_session FROM auth.api_keys "
                      "WHERE key_sha256 = $1 AND "
                      "revoked_at IS NULL"}}},
                   {"apps",
                    {{kApp,
                      {{"channels",
                        {{"open",
                          {{"scope", any_scope},
                           {"keys", "SELECT 'hot' AS key"},
                           {"authorize", kOpenAuthorize}}},
                         {"members",
                          {{"scope", any_scope},
                           {"keys", "SELECT 'hot' AS key"},
                           {"authorize", kMembersAuthorize}}}}}}}}}};
    if (flags.hook) start_hook(config, any_scope);
    std::ofstream(dir + "/outlive.json") << config.dump(2);
    progress("starting outlive serve (" + flags.outlive + "), logs in " + dir);
    replica = harness::ChildProcess({flags.outlive, "serve", "--config", dir + "/outlive.json"},
                                    dir + "/replica.log", std::nullopt, {"OUTLIVE_LOG_LEVEL=warn"});
    wait_ready(outlive_port, "/readyz", "outlive", dir + "/replica.log");

    if (flags.baseline) {
      const std::string base = std::string(OUTLIVE_SOURCE_DIR) + "/bench/ws_baseline";
      std::ifstream probe(base + "/node_modules/ws/package.json");
      if (!probe) {
        progress("installing the baseline's npm packages: npm ci --prefix " + base);
        harness::run_checked({"npm", "ci", "--no-audit", "--no-fund", "--prefix", base},
                             dir + "/npm.log");
      }
      start_node();
    }
    for (int w = 0; w < flags.writers; ++w)
      writer_conns.push_back(std::make_unique<pqxx::connection>(db));
    client = std::make_unique<Client>(flags.client_threads, flags.open_concurrency);
  }

  void start_node() {
    const std::string base = std::string(OUTLIVE_SOURCE_DIR) + "/bench/ws_baseline";
    publish.reset();
    if (node.pid() > 0) node.stop(9, 1s);
    baseline_port = harness::free_port();
    node = harness::ChildProcess({"node", base + "/server.mjs", std::to_string(baseline_port)},
                                 dir + "/node-" + std::to_string(++node_starts) + ".log");
    wait_ready(baseline_port, "/healthz", "the Node baseline",
               dir + "/node-" + std::to_string(node_starts) + ".log");
    publish = std::make_unique<PublishSocket>(baseline_port);
  }

  void wait_ready(int port, const std::string& path, const std::string& what,
                  const std::string& log) {
    const auto deadline = Steady::now() + 60s;
    while (Steady::now() < deadline) {
      auto r = http_get(port, path);
      if (r && r->first == 200) return;
      std::this_thread::sleep_for(50ms);
    }
    throw std::runtime_error(what + " did not become ready on port " + std::to_string(port) + "\n" +
                             harness::tail_of_file(log));
  }

  // Opens the sockets of a group and waits for all of them to be subscribed.
  void open_group(int group, const std::string& follow = "open") {
    const auto started = Steady::now();
    const auto before = client->stats(group);
    const int port = group == kOutlive ? outlive_port : baseline_port;
    const std::string target = group == kOutlive ? std::string("/api/") + kApp + "/live" : "/live";
    client->open(
        group, flags.sockets, port, target,
        [&](int i) {
          return group == kOutlive ? "Authorization: Bearer key" + std::to_string(i + 1) + "\r\n"
                                   : "";
        },
        follow, flags.sample_every);
    const auto deadline = Steady::now() + std::chrono::seconds(60 + flags.sockets / 50);
    for (;;) {
      const auto s = client->stats(group);
      const uint64_t subscribed = s.subscribed - before.subscribed,
                     failed = s.failed - before.failed;
      if (static_cast<int>(subscribed + failed) >= flags.sockets || Steady::now() > deadline) {
        progress(
            std::string(group == kOutlive ? "outlive" : "ws baseline") + ": " +
            std::to_string(subscribed) + " of " + std::to_string(flags.sockets) +
            " sockets subscribed in " + fixed(seconds_since(started), 1) + " s" +
            (failed ? "; " + std::to_string(failed) + " failed, first: " + s.first_error : ""));
        break;
      }
      std::this_thread::sleep_for(100ms);
    }
  }

  // Drops a server's backlog after a cut phase: closes the group's sockets, waits until the server
  // is idle (outlive still runs what was queued for the closed sockets), opens them again. The
  // baseline is restarted instead: it would otherwise write its whole backlog to the closed sockets
  // first (minutes); it keeps no state.
  double reconnect(int group) {
    const auto started = Steady::now();
    client->close_group(group);
    if (group == kBaseline) start_node();
    if (group == kOutlive) {
      // What is still in the outbox (a publish that backed off) must not reach the next phase.
      pqxx::connection c(db);
      for (int i = 0; i < 600; ++i) {
        if (pqxx::nontransaction(c)
                .exec("SELECT count(*) FROM events.outbox")[0][0]
                .as<int64_t>() == 0)
          break;
        std::this_thread::sleep_for(500ms);
      }
    }
    const pid_t pid = group == kOutlive ? outlive_pid() : baseline_pid();
    auto cpu = [&] {
      const Cpu c = sample_cpu(outlive_pid(), baseline_pid());
      return group == kOutlive ? c.outlive : c.baseline;
    };
    (void)pid;
    for (int i = 0; i < 600; ++i) {
      const double c0 = cpu();
      std::this_thread::sleep_for(1s);
      if (cpu() - c0 < 0.15) break;
    }
    open_group(group, group == kOutlive ? channel : "open");
    return seconds_since(started);
  }

  // The outlive sockets follow `to` (unsub, then sub with a new id); returns seconds taken.
  double switch_channel(const std::string& to) {
    if (channel == to) return 0;
    const auto started = Steady::now();
    const std::string id = "s" + std::to_string(++sub_counter);
    const auto before = client->stats(kOutlive);
    resubscribe_paced(to, id, false);
    channel = to;
    const auto after = client->stats(kOutlive);
    progress("outlive sockets now follow channel \"" + to +
             "\": " + std::to_string(after.subscribed - before.subscribed) + " subscribed in " +
             fixed(seconds_since(started), 1) + " s");
    return seconds_since(started);
  }

  // 250 sockets at a time, each chunk subscribed before the next: the replica bounds the
  // authorize() work waiting for its pool and fails a check beyond it with 1011 (SPEC 5.8), so
  // 5,000 subs at once lose thousands of sockets. Tabs do not switch channels in one instant.
  void resubscribe_paced(const std::string& to, const std::string& id, bool only_inactive) {
    constexpr int kChunk = 250;
    for (int lo = 0; lo < flags.sockets; lo += kChunk) {
      client->resubscribe(kOutlive, to, id, only_inactive, lo, lo + kChunk);
      const auto deadline = Steady::now() + 30s;
      while (client->inactive_in(kOutlive, lo, lo + kChunk) > 0 && Steady::now() < deadline)
        std::this_thread::sleep_for(10ms);
    }
  }

  // Writes `count` updates at `rate` per second; returns (sent, seconds) and sets *stopped when
  // the RSS guard stopped it early.
  std::pair<int64_t, double> write_updates(Target target, double rate, int64_t count,
                                           int64_t first_n, Steady::time_point t0,
                                           std::atomic<bool>& stop, std::string& error) {
    std::atomic<int64_t> sent{0};
    std::atomic<int64_t> behind_us{0};
    std::vector<std::thread> threads;
    std::mutex error_mutex;
    const int writers = target == Target::baseline ? 1 : flags.writers;
    for (int w = 0; w < writers; ++w) {
      threads.emplace_back([&, w] {
        try {
          for (int64_t j = w; j < count && !stop; j += writers) {
            const auto due = t0 + std::chrono::duration_cast<Steady::duration>(
                                      std::chrono::duration<double>(static_cast<double>(j) / rate));
            std::this_thread::sleep_until(due);
            const int64_t late =
                std::chrono::duration_cast<std::chrono::microseconds>(Steady::now() - due).count();
            for (int64_t prev = behind_us.load();
                 late > prev && !behind_us.compare_exchange_weak(prev, late);) {
            }
            const int64_t n = first_n + j;
            if (target == Target::baseline) {
              publish->send(baseline_frame_prefix + "\"data\":{\"n\":" + std::to_string(n) +
                            ",\"t\":" + std::to_string(wall_us()) + "}}");
            } else {
              // The commit time goes in the data: clock_timestamp() in the writer's transaction,
              // which commits in the same round trip.
              pqxx::nontransaction(*writer_conns[static_cast<size_t>(w)])
                  .exec(
                      std::string("BEGIN; SELECT events.publish_live('") + kApp + "', '" + kKey +
                      "', jsonb_build_object('n', " + std::to_string(n) +
                      ", 't', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)); COMMIT; "
                      "SELECT events.wake('" +
                      kApp + "')");
            }
            sent++;
          }
        } catch (const std::exception& e) {
          std::lock_guard lock(error_mutex);
          error = e.what();
          stop = true;
        }
      });
    }
    for (auto& t : threads) t.join();
    last_behind_ms = static_cast<double>(behind_us.load()) / 1000.0;
    return {sent.load(), seconds_since(t0)};
  }

  PhaseResult run_phase(Target target, double rate) {
    PhaseResult r;
    r.target = target;
    r.rate = rate;
    const int group = target == Target::baseline ? kBaseline : kOutlive;
    const pid_t server = target == Target::baseline ? baseline_pid() : outlive_pid();
    r.sockets = client->open_count(group, true);
    const int64_t count = std::max<int64_t>(1, std::llround(rate * flags.seconds));
    const int64_t first_n = next_n;
    next_n += count;
    progress(target_short(target) + " at " + fixed(rate, 0) + " updates/s: " +
             std::to_string(count) + " updates to " + std::to_string(r.sockets) + " sockets");
    client->mark(group);
    client->take_latencies(group);
    const auto before = client->stats(group);
    const double authorize_before = group == kOutlive ? metric("outlive_authorize_calls_total") : 0;
    const double rechecks_before = metric("outlive_credential_rechecks_total");
    const size_t log_at = file_size(dir + "/replica.log");
    settle();
    LoadSampler load_sampler;
    const Cpu cpu0 = sample_cpu(outlive_pid(), baseline_pid());
    const auto t0 = Steady::now() + 20ms;
    const int64_t t0_us = wall_us() + 20'000;
    std::atomic<bool> stop{false};
    std::string error;
    std::pair<int64_t, double> written{0, 0};
    std::thread writer(
        [&] { written = write_updates(target, rate, count, first_n, t0, stop, error); });
    // The RSS guard: a server that falls behind queues frames in memory; stop writing (and say so)
    // rather than let it take the machine.
    std::atomic<bool> writing{true};
    long rss_peak = 0;
    std::string guard_note;
    std::thread guard([&] {
      while (writing) {
        const long rss = rss_mib(server);
        rss_peak = std::max(rss_peak, rss);
        if (rss > flags.max_rss_mib && !stop) {
          stop = true;
          guard_note =
              "writing stopped early: server RSS " + std::to_string(rss) + " MiB > --max-rss-mib; ";
        }
        std::this_thread::sleep_for(100ms);
      }
    });
    writer.join();
    const int64_t last_write_us = wall_us();
    r.sent = written.first;
    r.write_seconds = written.second;
    r.behind_ms = last_behind_ms;
    if (!error.empty()) r.note += "writer error: " + error + "; ";
    r.expected = r.sent * r.sockets;
    // Drain: every frame arrived, or nothing new for 10 s, or --drain-timeout.
    GroupStats now_stats;
    const Drained drained = wait_drained(
        [&] {
          now_stats = client->stats(group);
          return now_stats.updates - before.updates;
        },
        r.expected, flags.drain_timeout, "frames");
    r.complete = drained.complete;
    r.note += drained.note;
    const Cpu cpu1 = sample_cpu(outlive_pid(), baseline_pid());
    writing = false;
    guard.join();
    r.note = guard_note + r.note;
    r.rss_peak = rss_peak;
    r.cpu = cpu1 - cpu0;
    r.server_cpu = target == Target::baseline ? r.cpu.baseline : r.cpu.outlive;
    r.delivered = static_cast<int64_t>(now_stats.updates - before.updates);
    // From the first write to the last frame, but never less than the writing schedule (count /
    // rate): frames/s delivered is then at most what was offered.
    r.span_s =
        std::max(now_stats.last_update_us > t0_us ? (now_stats.last_update_us - t0_us) / 1e6 : 0.0,
                 static_cast<double>(r.sent) / rate);
    r.lag_s = now_stats.last_update_us > last_write_us
                  ? (now_stats.last_update_us - last_write_us) / 1e6
                  : 0;
    r.closes = now_stats.closed - before.closed;
    for (const auto& [code, n] : now_stats.close_codes) {
      const auto it = before.close_codes.find(code);
      const uint64_t d = n - (it == before.close_codes.end() ? 0 : it->second);
      if (d) r.close_codes[code] = d;
    }
    // Only this phase's updates (n in [first_n, first_n + count)): a stalled update of an earlier
    // phase would otherwise count here.
    std::vector<int64_t> lat;
    int64_t foreign = 0;
    for (const auto& [seq, us] : client->take_latencies(group)) {
      if (seq >= first_n && seq < first_n + count) {
        lat.push_back(us);
      } else {
        ++foreign;
      }
    }
    if (foreign)
      r.note += std::to_string(foreign) +
                " sampled frames of earlier phases' updates arrived meanwhile; ";
    r.samples = lat.size();
    r.p50 = percentile(lat, 0.50);
    r.p99 = percentile(lat, 0.99);
    r.max = lat.empty() ? 0 : static_cast<double>(lat.back()) / 1000.0;
    const auto [lo, hi, open] = client->per_socket(group);
    r.per_socket_min = lo;
    r.per_socket_max = hi;
    if (group == kOutlive)
      r.authorize_calls = metric("outlive_authorize_calls_total") - authorize_before;
    r.rechecks = metric("outlive_credential_rechecks_total") - rechecks_before;
    r.load = load_sampler.stop();
    r.others_cpu = std::max(0.0, r.cpu.machine_busy - r.cpu.outlive - r.cpu.baseline -
                                     r.cpu.postgres - r.cpu.nats - r.cpu.client);
    if (group == kOutlive) {
      // The replica's warnings during the phase (log level warn), by message.
      std::ifstream log(dir + "/replica.log");
      log.seekg(static_cast<std::streamoff>(log_at));
      std::map<std::string, int> warnings;
      for (std::string line; std::getline(log, line);) {
        try {
          const auto j = json::parse(line);
          warnings[j.value("msg", std::string("?"))]++;
        } catch (const std::exception&) {
          warnings["(not JSON)"]++;
        }
      }
      for (const auto& [msg, n] : warnings)
        r.note += "replica logged " + std::to_string(n) + "x \"" + msg + "\"; ";
    }
    if (!r.complete) {
      // The rest of the backlog is dropped (not counted) so it does not spill into the next phase.
      const double took = reconnect(group);
      r.note += "cut at the drain timeout; latency of the frames delivered before it; backlog of " +
                thousands(static_cast<double>(r.expected - r.delivered)) +
                " frames dropped by reopening the sockets (" + fixed(took, 0) + " s); ";
    }
    if (target == Target::outlive_open && baseline_frame_prefix.empty()) {
      // The baseline broadcasts frames of the same shape and size as outlive's: same head, key and
      // cursor, only the data differ in the numbers.
      const std::string& text = now_stats.sample_update;
      const auto data = text.find(",\"data\":");
      if (data != std::string::npos) baseline_frame_prefix = text.substr(0, data + 1);
      update_frame_bytes = static_cast<int>(text.size() + (text.size() < 126 ? 2 : 4));
    }
    progress(target_short(target) + " at " + fixed(rate, 0) + "/s: delivered " +
             thousands(r.delivered) + " of " + thousands(r.expected) + " frames, " +
             thousands(r.delivered_fps()) + " frames/s, server CPU " + fixed(r.server_cpu, 2) +
             " s, " + thousands(r.frames_per_cpu_s()) + " frames per CPU-s, p50 " +
             fixed(r.p50, 1) + " ms p99 " + fixed(r.p99, 1) + " ms; " + r.note);
    return r;
  }

  // The kernel floor in this run: the same number of sockets, from the same source addresses as
  // the outlive group, frames of the size outlive sent in the warm-up (websocket header included).
  // Its sockets are closed again before the servers' phases, so they cost those nothing.
  // Besides back-to-back rounds (the verdict's floor), the same at each rate's cadence: rounds
  // 1/rate s apart, as the server sends them, after which the sockets' kernel state has left the
  // caches that back-to-back rounds keep warm (loopback_floor --pause-ms: 3.3-3.6 µs back to back,
  // 4.3-4.5 µs 200 ms apart, 2026-12-02).
  struct Floor {
    FloorResult result;
    FloorResult uring;  // the same through io_uring, as outlive writes a round (frames 0: none)
    std::map<double, FloorResult> at_rate;
    // The same through io_uring at each rate's cadence: the least the kernel spends per frame
    // written outlive's way at that rate (frames 0: none).
    std::map<double, FloorResult> uring_at_rate;
    std::map<double, LatencyFloor> latency;  // rates <= 20/s: the p99 target's floor
    LoadWindow load;
    std::string error;
  };
  Floor run_floor(int frame_bytes) {
    Floor f;
    progress("kernel floor: " + std::to_string(flags.sockets) + " loopback sockets, frames of " +
             std::to_string(frame_bytes) + " bytes");
    settle();
    LoadSampler load_sampler;
    try {
      FloorSockets sockets(flags.sockets, kOutlive);
      f.result = sockets.measure(flags.floor_rounds, frame_bytes, 1, 3);
      f.uring = sockets.measure_uring(flags.floor_rounds, frame_bytes, 3);
      for (double rate : flags.rates) {
        const int pause_ms = static_cast<int>(1000.0 / rate);
        const int rounds = std::clamp(static_cast<int>(rate * 2), 5, flags.floor_rounds);
        f.at_rate[rate] = sockets.measure(rounds, frame_bytes, 1, 2, pause_ms);
        if (f.uring.frames > 0)
          f.uring_at_rate[rate] = sockets.measure_uring(rounds, frame_bytes, 2, pause_ms);
        if (rate <= 20)
          f.latency[rate] = sockets.measure_latency(std::max(rounds, 10), frame_bytes, pause_ms,
                                                    flags.io_threads, flags.sample_every);
      }
    } catch (const std::exception& e) {
      f.error = e.what();
    }
    f.load = load_sampler.stop();
    progress("kernel floor: " + fixed(f.result.us_per_frame(), 2) + " µs per frame" +
             (f.error.empty() ? "" : "; " + f.error));
    return f;
  }

  struct Revocation {
    int subscribers = 0;
    int64_t revoked = 0;
    double first_ms = 0, last_ms = 0, p50_ms = 0;
    double server_cpu = 0, postgres_cpu = 0;
    double authorize_calls = 0;
    double resubscribe_s = 0;
    double idle_s = 0;  // from the subscribers' return (the pool's last checks) to the commit
    // The same-run floor of its access checks (authorize_floor): wall ms and its backends' CPU ms
    // on rows just deleted (as the replica meets them), then warm once Postgres has seen them dead.
    double floor_ms = 0, floor_backend_ms = 0, warm_floor_ms = 0, floor_idle_s = 0;
    RetouchProbe::Touch retouch;  // the machine's price for memory touched again after idle_s
    LoadWindow load;
    std::string note;
  };

  // The floor's connections, kept from one revocation to the next so that, like the replica's
  // pool, their backends sleep between revocations (a fresh backend's cost is another matter).
  std::vector<std::unique_ptr<pqxx::connection>> floor_conns;
  std::vector<int> floor_pids;
  std::optional<Steady::time_point> floor_last_used;

  double floor_backends_cpu_ms() const {
    double ms = 0;
    for (int pid : floor_pids) ms += on_cpu_seconds(pid).value_or(0) * 1e3;
    return ms;
  }

  // The same-run floor of a revocation's access checks: the channel's authorize() for every
  // subscriber in calls of 500 viewers (as the replica batches them), all at once over as many
  // connections as the replica's pool (8), straight from libpq, with nothing else running. The
  // rows are put back and deleted again first, so the checks meet what the replica's met: rows
  // just deleted, which the first readers find dead and prune. The connections slept since the
  // previous floor as the pool slept since its last checks; that first (cold) run is the floor,
  // with its backends' CPU; the best of 2 more (warm) shows what the pause and the dead rows cost.
  void authorize_floor(Revocation& r) {
    std::vector<std::string> batches;
    for (int from = 1; from <= r.subscribers; from += 500) {
      nlohmann::json viewers = nlohmann::json::array();
      for (int i = from; i < std::min(r.subscribers + 1, from + 500); ++i) {
        const std::string id = "user:u" + std::to_string(i);
        viewers.push_back({{"id", id}, {"actor", id}, {"accessSubject", id}, {"scopes", {"read"}}});
      }
      batches.push_back(viewers.dump());
    }
    sql("INSERT INTO bench.members SELECT 'hot', 'user:u' || i FROM generate_series(1, " +
        std::to_string(flags.sockets) + ") i ON CONFLICT DO NOTHING");
    constexpr int kConnections = 8;
    if (floor_conns.empty()) {
      for (int i = 0; i < kConnections; ++i) {
        floor_conns.push_back(std::make_unique<pqxx::connection>(db));
        auto& c = *floor_conns.back();
        c.prepare("authorize", kMembersAuthorize);
        floor_pids.push_back(
            pqxx::nontransaction(c).exec("SELECT pg_backend_pid()")[0][0].as<int>());
        // (plans made and cached while the members are there, as the replica's were)
        for (int k = 0; k < 6; ++k)
          pqxx::nontransaction(c).exec_prepared("authorize", kKey, batches.front());
      }
    }
    r.floor_idle_s = floor_last_used ? seconds_since(*floor_last_used) : 0;
    sql("DELETE FROM bench.members WHERE key = 'hot'");
    r.warm_floor_ms = 1e9;
    for (int attempt = 0; attempt < 3; ++attempt) {
      std::atomic<size_t> next{0};
      const double cpu0 = floor_backends_cpu_ms();
      const auto started = Steady::now();
      std::vector<std::thread> threads;
      for (auto& c : floor_conns) {
        threads.emplace_back([&, conn = c.get()] {
          for (size_t b; (b = next++) < batches.size();)
            pqxx::nontransaction(*conn).exec_prepared("authorize", kKey, batches[b]);
        });
      }
      for (auto& t : threads) t.join();
      const double ms = seconds_since(started) * 1e3;
      if (attempt == 0) {
        r.floor_ms = ms;
        r.floor_backend_ms = floor_backends_cpu_ms() - cpu0;
      } else {
        r.warm_floor_ms = std::min(r.warm_floor_ms, ms);
      }
    }
    floor_last_used = Steady::now();
  }

  // When the previous revocation's window closed (printed beside each one; what counts for the
  // pool's backends is how long they slept, Revocation::idle_s).
  std::optional<Steady::time_point> last_revocation;

  Revocation revoke(int round) {
    Revocation r;
    // With --hook, every second revocation goes through the hook channel.
    const std::string members = flags.hook && round % 2 == 1 ? "members_hook" : "members";
    if (members != "members") r.note = "authorize through the hook (SPEC 5.4 rev 4); ";
    if (round > 0 || channel != members) {
      // Members back (with an access update, so the key's cached "no" decisions are forgotten),
      // then every socket subscribes to "members" again.
      if (round > 0) {
        sql(std::string(
                "INSERT INTO bench.members SELECT 'hot', 'user:u' || i FROM generate_series(1, ") +
            std::to_string(flags.sockets) +
            ") i ON CONFLICT DO NOTHING; SELECT events.publish_live('" + kApp +
            "', 'hot', NULL, true); SELECT events.wake('" + kApp + "')");
        std::this_thread::sleep_for(2s);  // the replica reads the access update before the subs
      }
      const auto started = Steady::now();
      if (channel != members) {
        switch_channel(members);
      } else {
        const std::string id = "s" + std::to_string(++sub_counter);
        resubscribe_paced(members, id, true);
      }
      r.resubscribe_s = seconds_since(started);
    }
    // The pool's last checks were the subscribers' (and any credential re-check since): from here
    // its backends sleep, and the probe sleeps alongside.
    const auto idle_from = Steady::now();
    retouch.touch();
    if (const size_t i = static_cast<size_t>(round);
        i < flags.idle_before.size() && flags.idle_before[i] > 0) {
      progress("revocation " + std::to_string(round + 1) + ": leaving the replica idle for " +
               fixed(flags.idle_before[i], 0) + " s (--idle-before)");
      std::this_thread::sleep_for(std::chrono::duration<double>(flags.idle_before[i]));
    }
    r.subscribers = client->open_count(kOutlive, true);
    client->take_revoked_times(kOutlive);
    const auto before = client->stats(kOutlive);
    const double authorize_before = metric("outlive_authorize_calls_total");
    const double authorize_s_before = metric("outlive_authorize_seconds_sum");
    // Opened before the window and closed after it: the bench's own backend does not start or
    // exit inside it.
    pqxx::connection revoker(db);
    settle();
    LoadSampler load_sampler;
    const PostgresShares shares0 = PostgresShares::read(revoker);
    const Cpu cpu0 = sample_cpu(outlive_pid(), baseline_pid());
    const auto threads0 = on_cpu_seconds_by_thread(outlive_pid());
    // Credential re-checks share the pool with the revocation's checks (sockets opened together
    // fall due together, every recheck_seconds).
    const double rechecks_before = metric("outlive_credential_rechecks_total");
    const double pause_s = last_revocation ? seconds_since(*last_revocation) : -1;
    int64_t access_us = 0;
    {
      pqxx::nontransaction tx(revoker);
      // One transaction: every member leaves the key, the access update, the commit; then wake.
      tx.exec(
          std::string(
              "BEGIN; DELETE FROM bench.members WHERE key = 'hot'; SELECT events.publish_live('") +
          kApp + "', 'hot', NULL, true); COMMIT;");
      access_us = wall_us();  // the commit returned
      r.idle_s = seconds_since(idle_from);
      tx.exec(std::string("SELECT events.wake('") + kApp + "')");
    }
    // (the commit's system-clock time lines it up with `perf record -k CLOCK_REALTIME`)
    progress("revocation " + std::to_string(round + 1) + ": access update committed at " +
             fixed(static_cast<double>(access_us) / 1e6, 6) + " s since the epoch; waiting for " +
             std::to_string(r.subscribers) + " revoked frames");
    const auto deadline = Steady::now() + 120s;
    GroupStats s;
    for (;;) {
      s = client->stats(kOutlive);
      if (static_cast<int>(s.revoked - before.revoked) >= r.subscribers) break;
      if (Steady::now() > deadline) {
        r.note += "timed out after 120 s; ";
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
    const Cpu cpu = sample_cpu(outlive_pid(), baseline_pid()) - cpu0;
    const std::string by_thread =
        thread_cpu_since(threads0, on_cpu_seconds_by_thread(outlive_pid()));
    PostgresShares shares = shares0;
    shares.sample();
    r.note += "replica CPU by thread: " + by_thread + "; ";
    r.note += "postgres CPU by process: " + shares.since(shares0) + "; ";
    r.revoked = static_cast<int64_t>(s.revoked - before.revoked);
    auto times = client->take_revoked_times(kOutlive);
    std::vector<int64_t> since;
    for (auto t : times) since.push_back(t - access_us);
    r.p50_ms = percentile(since, 0.5);
    r.first_ms = since.empty() ? 0 : static_cast<double>(since.front()) / 1000.0;
    r.last_ms = since.empty() ? 0 : static_cast<double>(since.back()) / 1000.0;
    r.server_cpu = cpu.outlive;
    r.postgres_cpu = cpu.postgres;
    if (pause_s >= 0) r.note += fixed(pause_s, 1) + " s after the previous one; ";
    last_revocation = Steady::now();
    const double rechecks = metric("outlive_credential_rechecks_total") - rechecks_before;
    if (rechecks > 0) r.note += thousands(rechecks) + " credential re-checks meanwhile; ";
    r.authorize_calls = metric("outlive_authorize_calls_total") - authorize_before;
    if (r.authorize_calls > 0) {
      // Where the time before the first `revoked` goes: the calls run side by side on the pool.
      const double mean_ms =
          (metric("outlive_authorize_seconds_sum") - authorize_s_before) / r.authorize_calls * 1e3;
      r.note += "authorize() " + fixed(mean_ms, 1) + " ms per call on average; ";
    }
    r.load = load_sampler.stop();
    r.retouch = retouch.touch();
    authorize_floor(r);
    const int closes = static_cast<int>(s.closed - before.closed);
    if (closes) r.note += std::to_string(closes) + " sockets closed; ";
    progress("revocation " + std::to_string(round + 1) + ": " + std::to_string(r.revoked) +
             " revoked, first " + fixed(r.first_ms, 1) + " ms, last " + fixed(r.last_ms, 1) +
             " ms after the commit; " + r.note + "idle " + fixed(r.idle_s, 1) +
             " s before it, memory re-touched after it " + fixed(r.retouch.after_sleep_us, 2) +
             " µs per page (warm " + fixed(r.retouch.warm_us, 2) + "); authorize floor " +
             fixed(r.floor_ms, 1) + " ms (its backends' CPU " + fixed(r.floor_backend_ms, 1) +
             " ms, idle " + fixed(r.floor_idle_s, 1) + " s before)");
    return r;
  }
};

std::string close_text(const std::map<int, uint64_t>& codes) {
  std::string s;
  for (const auto& [code, n] : codes)
    s += (s.empty() ? "" : ", ") + std::to_string(n) + "×" + std::to_string(code);
  return s;
}

void print_phase(const PhaseResult& r) {
  const bool outlive = r.target != Target::baseline;
  std::ostringstream notes;
  notes << "written " << thousands(static_cast<double>(r.sent)) << " (writers at most "
        << fixed(r.behind_ms, 0) << " ms behind schedule); span " << fixed(r.span_s, 2)
        << " s, last frame " << fixed(r.lag_s * 1000, 0) << " ms after the last write; per socket "
        << r.per_socket_min << ".." << r.per_socket_max << "; CPU pg/nats/client "
        << fixed(r.cpu.postgres, 1) << "/" << fixed(r.cpu.nats, 1) << "/" << fixed(r.cpu.client, 1)
        << " s, machine " << fixed(r.cpu.machine_busy, 1) << " s; RSS peak " << r.rss_peak
        << " MiB";
  if (outlive) notes << "; authorize calls " << thousands(r.authorize_calls);
  // (during a ws phase too: the replica's sockets stay open and take CPU beside the baseline)
  notes << "; outlive's credential re-checks " << thousands(r.rechecks);
  if (r.closes || !r.close_codes.empty())
    notes << "; closes " << r.closes << " (" << close_text(r.close_codes) << ")";
  notes << "; load " << fixed(r.load.start, 2) << " → " << fixed(r.load.end, 2) << ", others' CPU "
        << fixed(r.others_cpu, 1) << " s";
  if (!r.note.empty()) notes << "; " << r.note;
  std::cout << "| " << fixed(r.rate, 0) << " | " << target_short(r.target) << " | "
            << thousands(r.offered_fps()) << " | " << (r.complete ? "" : "**")
            << thousands(r.delivered_fps()) << (r.complete ? "" : "** (incomplete)") << " | "
            << thousands(static_cast<double>(r.delivered)) << " / "
            << thousands(static_cast<double>(r.expected)) << " | " << fixed(r.server_cpu, 2)
            << " | **" << thousands(r.frames_per_cpu_s()) << "** | "
            << fixed(r.cpu_per_million(), 2) << " | " << fixed(r.p50, 1) << " / " << fixed(r.p99, 1)
            << " / " << fixed(r.max, 1) << " | " << notes.str() << " |\n";
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = parse_flags(argc, argv);
  log::set_min_level(log::Level::warn);
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
  // The outlive group and the floor's pairs, or two groups of client sockets.
  if (static_cast<long>(limit.rlim_cur) < 3L * flags.sockets + 1000) {
    std::cerr << "fanout_bench: the open file limit (" << limit.rlim_cur << ") is too low for "
              << flags.sockets << " sockets per server\n";
    return 2;
  }
  // Backstop: every wait below has its own limit; this ends the run whatever happens (the
  // servers are our children and die with us).
  const double per_phase = flags.seconds + flags.drain_timeout + 200;
  const double limit_s =
      600 + per_phase * static_cast<double>(flags.rates.size()) * 3 + 300.0 * flags.revocations;
  std::thread([limit_s] {
    std::this_thread::sleep_for(std::chrono::duration<double>(limit_s));
    std::cerr << "fanout_bench: overall time limit of " << limit_s << " s passed, exiting\n";
    std::_Exit(3);
  }).detach();

  const auto started = Steady::now();
  const double load_before = load_average();
  progress("starting PostgreSQL 15 and nats-server on loopback");
  Bench b(flags);
  std::vector<PhaseResult> results;
  std::vector<Bench::Revocation> revocations;
  Bench::Floor floor;
  std::string pg_version, nats_version;
  try {
    b.setup();
    {
      pqxx::connection c(b.db);
      pg_version = pqxx::nontransaction(c).exec("SHOW server_version")[0][0].as<std::string>();
    }
    nats_version = command_output("nats-server --version 2>&1");
    b.open_group(kOutlive);
    // One update first, so the baseline's frames can copy the shape and size of outlive's.
    b.run_phase(Target::outlive_open, 2);
    if (b.baseline_frame_prefix.empty())
      b.baseline_frame_prefix =
          R"({"type":"update","ids":["s1"],"key":"hot","cursor":"0000000000000000000000000000000",)";
    floor = b.run_floor(b.update_frame_bytes > 0 ? b.update_frame_bytes : 200);
    // The baseline's sockets only after the floor's are closed: both at once would need 4 file
    // descriptors per socket in this process.
    if (flags.baseline) b.open_group(kBaseline);

    for (size_t i = 0; i < flags.rates.size(); ++i) {
      const double rate = flags.rates[i];
      std::vector<Target> order;
      if (!flags.auth) {
        order = {Target::outlive_open};
      } else if (b.channel == "open") {
        order = {Target::outlive_open, Target::outlive_members};
      } else {
        order = {Target::outlive_members, Target::outlive_open};
      }
      if (flags.baseline) order.insert(order.begin() + 1, Target::baseline);
      for (Target t : order) {
        if (t == Target::outlive_open) b.switch_channel("open");
        if (t == Target::outlive_members) b.switch_channel("members");
        results.push_back(b.run_phase(t, rate));
      }
    }
    if (flags.auth) {
      for (int r = 0; r < flags.revocations; ++r) revocations.push_back(b.revoke(r));
    }
  } catch (const std::exception& e) {
    std::cerr << "fanout_bench: " << e.what() << "\n";
    if (!b.dir.empty())
      std::cerr << "replica log tail:\n" << harness::tail_of_file(b.dir + "/replica.log") << "\n";
  }
  const double load_after = load_average();

  // ---- report
  std::cout << "\n### fanout_bench, " << now_utc() << "\n\n";
  std::cout << "- Machine: " << machine_line() << "; shared with other engineers\n";
  std::cout << "- Services (same machine, loopback): PostgreSQL " << pg_version
            << " (harness settings: fsync=off, synchronous_commit=off), " << nats_version
            << "; the replica is a separate `outlive serve --config` process (io_threads "
            << flags.io_threads
            << "); the "
               "baseline is "
            << command_output("node --version") << " with ws "
            << command_output(
                   std::string("node -p \"require('") + OUTLIVE_SOURCE_DIR +
                   "/bench/ws_baseline/node_modules/ws/package.json').version\" 2>/dev/null")
            << " (bench/ws_baseline/server.mjs)\n";
  std::cout << "- Load: " << flags.sockets
            << " websocket sockets per server (API keys, one viewer each, from 127.x.y.z"
            << " source addresses, 4 per address), all subscribed to one key; " << flags.seconds
            << " s of updates per phase at each rate; " << flags.writers
            << " writer connections, each update its own transaction (`publish_live` + `wake`); "
               "the load client is "
            << flags.client_threads << " epoll thread(s) in this process\n";
  std::cout << "- Latency: commit (clock_timestamp() in the writing transaction; for ws, the "
               "driver's clock when it sends) "
               "to the frame's arrival at the client, on every "
            << flags.sample_every << "th socket ("
            << (flags.sockets + flags.sample_every - 1) / flags.sample_every << " sockets)\n";
  std::cout << "- Load average (1 min) before / after: " << fixed(load_before, 2) << " / "
            << fixed(load_after, 2) << "; total run " << fixed(seconds_since(started), 0)
            << " s; per phase in the notes (start → end); a verdict needs every phase it rests on "
               "at <= "
            << fixed(kLoadLimit, 1) << "\n";
  std::cout << "- The bench's " << b.scrapes << " scrapes of the replica's /metrics (up to "
            << flags.sockets << " sockets open) took " << fixed(b.slowest_scrape_ms, 1)
            << " ms at most\n";
  std::cout << "- Command: `cmake --build build -j2 --target fanout_bench outlive && "
            << flags.command << "`\n";
  std::cout << "- outlive: " << flags.outlive << "\n\n";
  std::cout << "| updates/s | server | offered frames/s | delivered frames/s | frames delivered / "
               "expected | server CPU s "
               "| frames per CPU-s | CPU s per 10⁶ frames | latency p50 / p99 / max ms | notes |\n";
  std::cout << "|---:|---|---:|---:|---:|---:|---:|---:|---|---|\n";
  for (const auto& r : results) print_phase(r);

  auto find = [&](Target t, double rate) -> const PhaseResult* {
    for (const auto& r : results) {
      if (r.target == t && r.rate == rate) return &r;
    }
    return nullptr;
  };
  // A phase cut at the drain timeout: its CPU includes work for frames still queued at the cut.
  auto cut = [](const PhaseResult* r) { return r->complete ? std::string() : std::string(" †"); };
  bool any_cut = false;
  for (const auto& r : results) any_cut = any_cut || !r.complete;
  const char* dagger = !any_cut ? ""
                                : "\n† cut at the drain timeout (the server could not keep up): "
                                  "frames per CPU-s counts only the frames "
                                  "delivered before the cut, while the CPU includes the work "
                                  "already done for frames still queued, so it "
                                  "understates that server's efficiency.\n";
  std::cout << "\n**Kernel floor, same run**: " << floor.result.sockets << " loopback sockets from "
            << "the outlive group's source addresses, one `sendmsg` of a "
            << floor.result.frame_bytes << "-byte frame per socket per round, "
            << flags.floor_rounds << " rounds, best of 3: **"
            << fixed(floor.result.us_per_frame(), 2) << " µs** sender CPU per frame ("
            << thousands(floor.result.frames_per_cpu_s()) << " frames per CPU-s); load "
            << fixed(floor.load.start, 2) << " → " << fixed(floor.load.end, 2)
            << (floor.error.empty() ? "" : "; " + floor.error) << "\n";
  if (floor.uring.frames > 0)
    std::cout
        << "\nThe same frames through io_uring (one sendmsg per socket, 128 per submission, as "
           "outlive writes a round): **"
        << fixed(floor.uring.us_per_frame(), 2) << " µs** per frame ("
        << fixed(floor.uring.us_per_frame() / std::max(1e-9, floor.result.us_per_frame()), 2)
        << "x the sendmsg floor)\n";
  if (!floor.at_rate.empty()) {
    std::cout << "\nThe same at each rate's cadence (rounds 1/rate s apart, best of 2):";
    for (const auto& [rate, r] : floor.at_rate) {
      std::cout << " " << fixed(rate, 0) << "/s " << fixed(r.us_per_frame(), 2) << " µs";
      auto u = floor.uring_at_rate.find(rate);
      if (u != floor.uring_at_rate.end() && u->second.frames > 0)
        std::cout << " (io_uring " << fixed(u->second.us_per_frame(), 2) << " µs)";
      std::cout << ";";
    }
    std::cout << "\n";
  }
  if (!floor.latency.empty()) {
    std::cout << "\n**Latency floor, same run** (the least commit-to-frame latency these two cores "
                 "allow: rounds at the rate's cadence sent by "
              << flags.io_threads
              << " threads, one sendmsg per socket, read by one epoll thread; from the round's "
                 "start to the frame's arrival, every "
              << flags.sample_every << "th socket):";
    for (const auto& [rate, l] : floor.latency)
      std::cout << " " << fixed(rate, 0) << "/s p50 " << fixed(l.p50_ms, 1) << " / p99 "
                << fixed(l.p99_ms, 1) << " / max " << fixed(l.max_ms, 1)
                << " ms (CPU per round: " << fixed(l.sender_cpu_s * 1e3, 1) << " ms sending, "
                << fixed(l.reader_cpu_s * 1e3, 1) << " ms reading);";
    std::cout << "\n";
  }
  if (flags.baseline) {
    std::cout << "\n**Issue 13: outlive against ws and against the kernel floor** (targets: 1, 5, "
                 "20 updates/s: >= 2x ws frames per CPU-s and CPU per frame <= 1.6x the floor; "
                 "100/s: >= 4x ws; p99 < 20 ms at 20/s; issue 5: p99 < 50 ms at 500/s)\n\n";
    std::cout
        << "| updates/s | outlive/open frames per CPU-s | outlive/members | ws | ratio open / "
           "ws | ratio members / ws | outlive/open µs per frame | floor µs per frame | "
           "**ratio outlive / floor** | floor at this rate's cadence µs (ratio) | ratio outlive / "
           "io_uring floor | io_uring floor at this rate's cadence µs (ratio) | the most open / ws "
           "can be here | p99 outlive/open | p99 ws | verdict |\n";
    std::cout
        << "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
    const double floor_us = floor.result.us_per_frame();
    auto cadence_floor = [&](double rate, double us) -> std::string {
      auto it = floor.at_rate.find(rate);
      if (it == floor.at_rate.end() || it->second.us_per_frame() <= 0) return "-";
      const double f = it->second.us_per_frame();
      return fixed(f, 2) + " (" + fixed(us / f, 2) + "x)";
    };
    // What the kernel alone spends per frame written as outlive writes (io_uring) at this rate's
    // cadence: no server can spend less, so ws's CPU per frame over it bounds the ratio to ws that
    // is physically possible in this run, and it over the back-to-back floor bounds the floor
    // ratio from below.
    auto uring_cadence_us = [&](double rate) {
      auto it = floor.uring_at_rate.find(rate);
      return it == floor.uring_at_rate.end() ? 0.0 : it->second.us_per_frame();
    };
    for (double rate : flags.rates) {
      const auto* o = find(Target::outlive_open, rate);
      const auto* m = find(Target::outlive_members, rate);
      const auto* w = find(Target::baseline, rate);
      if (!o || !w) continue;
      const double vs_ws = o->frames_per_cpu_s() / std::max(1.0, w->frames_per_cpu_s());
      const double us =
          o->delivered > 0 ? o->server_cpu / static_cast<double>(o->delivered) * 1e6 : 0;
      const double vs_floor = floor_us > 0 ? us / floor_us : 0;
      std::vector<std::pair<std::string, LoadWindow>> loads{
          {"floor", floor.load},
          {"outlive/open " + fixed(rate, 0) + "/s", o->load},
          {"ws " + fixed(rate, 0) + "/s", w->load}};
      if (m) loads.emplace_back("outlive/members " + fixed(rate, 0) + "/s", m->load);
      std::string verdict = no_verdict(loads);
      if (verdict.empty()) {
        std::vector<std::string> missed;
        bool any = false;
        auto check = [&](bool met, const std::string& what) {
          any = true;
          if (!met) missed.push_back(what);
        };
        if (rate <= 20) {
          const double k = uring_cadence_us(rate);
          const double ws_us = 1e6 / std::max(1.0, w->frames_per_cpu_s());
          check(vs_ws >= 2, k > 0 && ws_us / k < 2
                                ? "ws ratio < 2x (out of reach here: ws spent " +
                                      fixed(ws_us / k, 2) + "x the io_uring floor at this cadence)"
                                : "ws ratio < 2x");
          check(floor_us > 0 && vs_floor <= 1.6,
                k > 0 && k / floor_us > 1.6
                    ? "floor ratio > 1.6x (out of reach here: the io_uring floor at this cadence "
                      "is " +
                          fixed(k / floor_us, 2) + "x the floor)"
                    : "floor ratio > 1.6x");
        }
        if (rate == 20) {
          auto l = floor.latency.find(rate);
          if (l != floor.latency.end() && l->second.p99_ms >= 20)
            check(false, "p99 >= 20 ms (out of reach here: the latency floor's own p99 is " +
                             fixed(l->second.p99_ms, 1) + " ms)");
          else
            check(o->p99 < 20, "p99 >= 20 ms");
        }
        if (rate == 100) check(vs_ws >= 4, "ws ratio < 4x");
        if (rate == 500) check(o->p99 < 50, "p99 >= 50 ms");
        if (!o->complete) check(false, "incomplete");
        verdict = !any ? "no target" : missed.empty() ? "met" : "**missed**: ";
        for (size_t k = 0; k < missed.size(); ++k) verdict += (k ? ", " : "") + missed[k];
      }
      std::cout << "| " << fixed(rate, 0) << " | " << thousands(o->frames_per_cpu_s()) << cut(o)
                << " | " << (m ? thousands(m->frames_per_cpu_s()) + cut(m) : "-") << " | "
                << thousands(w->frames_per_cpu_s()) << cut(w) << " | **" << fixed(vs_ws, 2)
                << "x** | "
                << (m ? fixed(m->frames_per_cpu_s() / std::max(1.0, w->frames_per_cpu_s()), 2) + "x"
                      : "-")
                << " | " << fixed(us, 2) << " | " << fixed(floor_us, 2) << " | **"
                << fixed(vs_floor, 2) << "x** | " << cadence_floor(rate, us) << " | "
                << (floor.uring.frames > 0 ? fixed(us / floor.uring.us_per_frame(), 2) + "x" : "-")
                << " | "
                << (uring_cadence_us(rate) > 0 ? fixed(uring_cadence_us(rate), 2) + " (" +
                                                     fixed(us / uring_cadence_us(rate), 2) + "x)"
                                               : "-")
                << " | "
                << (uring_cadence_us(rate) > 0
                        ? fixed(1e6 / std::max(1.0, w->frames_per_cpu_s()) / uring_cadence_us(rate),
                                2) +
                              "x"
                        : "-")
                << " | " << fixed(o->p99, 1) << " ms | " << fixed(w->p99, 1) << " ms | " << verdict
                << " |\n";
    }
    std::cout << dagger;
  }
  if (flags.auth) {
    std::cout
        << "\n**Issue 6: cost of authorization** (1 - frames per CPU-s on / off; target < 15%)\n\n";
    std::cout << "| updates/s | off: frames per CPU-s | on: frames per CPU-s | cost | delivered "
                 "frames/s off / on | p99 off / on |\n";
    std::cout << "|---:|---:|---:|---:|---|---|\n";
    for (double rate : flags.rates) {
      const auto* o = find(Target::outlive_open, rate);
      const auto* m = find(Target::outlive_members, rate);
      if (!o || !m) continue;
      const double cost = 1 - m->frames_per_cpu_s() / std::max(1.0, o->frames_per_cpu_s());
      std::cout << "| " << fixed(rate, 0) << " | " << thousands(o->frames_per_cpu_s()) << cut(o)
                << " | " << thousands(m->frames_per_cpu_s()) << cut(m) << " | **"
                << fixed(cost * 100, 1) << "%** | " << thousands(o->delivered_fps()) << " / "
                << thousands(m->delivered_fps()) << " | " << fixed(o->p99, 1) << " / "
                << fixed(m->p99, 1) << " ms |\n";
    }
    std::cout << dagger;
    if (!revocations.empty()) {
      std::cout << "\n**Revocation**: every subscriber's membership removed in one transaction "
                   "with an access update "
                   "(`DELETE FROM bench.members WHERE key = 'hot'; SELECT "
                   "events.publish_live('fanout', 'hot', NULL, true)`), "
                   "time from the commit's return to the `revoked` frames\n\n";
      std::cout << "Authorize floor (same run, right after each revocation): the members put back "
                   "and deleted again, then the channel's authorize() for every subscriber in "
                   "calls of 500 viewers, all at once over 8 connections (as many as the "
                   "replica's pool, kept open and asleep between revocations as the pool's are) "
                   "straight from libpq — the least time the access checks of a revocation take "
                   "on this machine, before any update is read or frame sent (cold: the first run "
                   "after the delete and the pause, as the replica meets it, with its backends' "
                   "CPU; warm: best of the next 2). Idle: from the subscribers' return (the "
                   "pool's last checks) to the commit; re-touch: what a process that slept as "
                   "long pays per 4 KiB page it reads again (bench/retouch.hpp), warm in "
                   "brackets.\n\n";
      // A revocation's floor from the two same-run floors: the checks (authorize floor) and one
      // round of frames to every subscriber (the latency floor at the lowest rate, whose round
      // arrives whole by its max). Overlapped at best — both on the same cores, so their CPU
      // divided by the cores — and in sequence at worst.
      const LatencyFloor* round_floor =
          floor.latency.empty() ? nullptr : &floor.latency.begin()->second;
      const double cores = std::max(1u, std::thread::hardware_concurrency());
      if (round_floor)
        std::cout << "Revocation floor: overlapped = (the authorize floor's backend CPU + one "
                     "round's CPU in the latency floor, "
                  << fixed((round_floor->sender_cpu_s + round_floor->reader_cpu_s) * 1e3, 1)
                  << " ms) / " << fixed(cores, 0)
                  << " cores; in sequence = authorize floor cold + the latency floor's max ("
                  << fixed(round_floor->max_ms, 1)
                  << " ms). A revocation can do no better than the first, and the checks and "
                     "frames overlap only in part (a batch's frames go once it is answered).\n\n";
      std::cout << "| # | subscribers | revoked | first / median / last revoked after the commit | "
                   "idle s / re-touch µs per page (warm) | authorize floor cold ms (its "
                   "backends' CPU ms) / warm ms | revocation floor ms, overlapped – in sequence | "
                   "replica CPU s | postgres CPU s | "
                   "authorize calls | verdict (last < 50 ms) | notes |\n";
      std::cout << "|---:|---:|---:|---|---|---:|---|---:|---:|---:|---|---|\n";
      for (size_t i = 0; i < revocations.size(); ++i) {
        const auto& r = revocations[i];
        std::cout << "| " << i + 1 << " | " << r.subscribers << " | " << r.revoked << " | "
                  << fixed(r.first_ms, 1) << " / " << fixed(r.p50_ms, 1) << " / **"
                  << fixed(r.last_ms, 1) << " ms** | " << fixed(r.idle_s, 1) << " / "
                  << fixed(r.retouch.after_sleep_us, 2) << " (" << fixed(r.retouch.warm_us, 2)
                  << ") | " << fixed(r.floor_ms, 1) << " (" << fixed(r.floor_backend_ms, 1)
                  << ") / " << fixed(r.warm_floor_ms, 1) << " | "
                  << (round_floor
                          ? fixed((r.floor_backend_ms +
                                   (round_floor->sender_cpu_s + round_floor->reader_cpu_s) * 1e3) /
                                      cores,
                                  1) +
                                " – " + fixed(r.floor_ms + round_floor->max_ms, 1)
                          : std::string("-"))
                  << " | " << fixed(r.server_cpu, 2) << " | " << fixed(r.postgres_cpu, 2) << " | "
                  << thousands(r.authorize_calls) << " | "
                  << (!r.load.quiet() ? "no verdict: load " + fixed(r.load.max(), 2) +
                                            " during revocation " + std::to_string(i + 1)
                      : r.last_ms < 50 && r.revoked == r.subscribers ? std::string("met")
                                                                     : std::string("**missed**"))
                  << " | "
                  << (r.resubscribe_s > 0 ? "resubscribed in " + fixed(r.resubscribe_s, 1) + " s; "
                                          : "")
                  << "load " << fixed(r.load.start, 2) << " → " << fixed(r.load.end, 2)
                  << (r.note.empty() ? "" : "; " + r.note) << " |\n";
      }
    }
  }
  std::cout << "\nColumns: *offered* = updates/s x sockets; *delivered frames/s* = update frames "
               "received / (first write "
               "to last frame, at least the writing schedule); *server CPU s* = utime + stime of "
               "the server process (/proc/<pid>/stat) from the first "
               "write until the last frame arrived; for outlive that includes its publisher, NATS "
               "reader and "
               "credential rechecks. The machine has "
            << std::thread::hardware_concurrency() << " cores ("
            << std::thread::hardware_concurrency()
            << " CPU-s per second for everything, other engineers' work included).\n";
  bool ok = !results.empty();
  for (const auto& r : results) ok = ok && r.complete;
  return ok ? 0 : 1;
}
