// keyed_bench: a key per user (issue 46, workload W1): N sockets, each subscribed to its own key,
// updates written to random users' keys; the replica's CPU per update written and per frame,
// against the kernel's floor per frame measured in the same run. `--workload w2` (shared keys with
// access churn) and `--workload storm` (a reconnect storm with cursors) run on the same harness
// (bench/keyed_harness.hpp) and are described in bench/keyed_workloads.cpp.
//
// Everything runs on this machine in one run, as in fanout_bench: an embedded PostgreSQL 15 and
// nats-server on loopback (src/harness), a real `outlive serve --config FILE` child process (the
// replica whose CPU is measured, utime + stime from /proc/<pid>/stat), and this process: the
// writers and the load client (bench/fanout_client.hpp, epoll, no Beast).
//
//   build/bench/keyed_bench [--workload w1] [--sockets 2000] [--rate 2000] [--seconds 20] [--writers 2]
//                           [--batch-ms 10] [--sample-every 1] [--drain-timeout 30]
//                           [--floor-rounds 20] [--io-threads 2] [--log-dir DIR]
//                           [--settle-load L] [--replica-config-extra JSON] [--ab JSON]
//                           [--ab-binary PATH]
//
// The channel is "user" of app "keyed": keys() is the viewer's own key (`SELECT
// $2->>'accessSubject'`, "user:u<i>" for the API key of socket i), authorize() a constant query
// (everyone may read, as fanout_bench's "open" channel), so what a subscription costs in access
// checks is the per-key lookup and nothing the channel adds. Each socket sends one `sub` with an
// empty scope: one single-key subscription per socket, one socket per key.
//
// Writers (--writers connections) write --rate updates per second in all for --seconds, each to
// a random key among the sockets', in one transaction per --batch-ms tick (`publish_live` per
// update, then `wake`), so 2,000 updates/s fit on 2 cores. A key belongs to one writer, so its
// updates commit in the order they are numbered: the data carries "s" (the update's number among
// its key's), "n" (among all) and "t" (clock_timestamp() in the writing transaction, µs), padded
// to about 100 bytes. Every socket checks that it receives 1, 2, 3, ... of its key: lost updates
// and disorder are counted per socket, and must be 0, as must resync frames.
//
// --replica-config-extra JSON is merged (RFC 7386) into the replica's "server" section. --ab JSON
// runs the whole workload twice, each on a fresh replica (same PostgreSQL and NATS): once as
// configured, once with JSON merged into "server" as well, and prints both side by side with the
// ratio, e.g. --ab '{"progress_after_updates":1}'. --ab-binary PATH runs B with another build's
// `outlive` (e.g. the previous commit's, from a worktree), to compare code in the same run; with
// --workload storm it is the build replica B (the one the storm reopens on) runs.
//
// The kernel floor (bench/floor.hpp) comes after the workload, with the client's sockets closed
// (so 7,500 sockets fit the descriptor limit): as many loopback sockets from the same source
// addresses, one sendmsg of a frame of outlive's size per socket per round; back to back, and at
// W1's cadence (rounds N / rate seconds apart: each socket gets a frame as often as a user's key
// gets an update, after which its kernel state has left the caches).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <pqxx/pqxx>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/common.hpp"
#include "bench/fanout_client.hpp"
#include "bench/floor.hpp"
#include "bench/keyed_harness.hpp"
#include "bench/keyed_workloads.hpp"
#include "bench/load.hpp"
#include "bench/wire.hpp"
#include "common/log.hpp"

using namespace outlive;
using namespace outlive::bench;
using namespace outlive::bench::keyed;

namespace {

const char* kApp = "keyed";
const char* kChannel = "user";

[[noreturn]] void usage(const std::string& error) {
  std::cerr << "keyed_bench: " << error << "\n"
            << "usage: keyed_bench [--workload w1|w2|storm] [--sockets N] [--rate U] [--seconds T]\n"
               "                   [--keys K] [--subs S] [--access-rate A | --no-access]\n"
               "                   [--storm-jitter-ms J]\n"
               "                   [--writers W] [--batch-ms MS]\n"
               "                   [--sample-every K] [--client-threads T] [--open-concurrency C]\n"
               "                   [--drain-timeout S] [--floor-rounds R] [--io-threads N] "
               "[--log-dir DIR]\n"
               "                   [--settle-load L] [--replica-config-extra JSON] [--ab JSON]\n"
               "                   [--ab-binary PATH]\n";
  std::exit(2);
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  f.command = "build/bench/keyed_bench";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    // JSON arguments quoted for a shell, so the line can be pasted back.
    f.command += a.find_first_of(" {\"'") == std::string::npos ? " " + a : " '" + a + "'";
  }
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) usage(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  auto integer = [&](const std::string& name, const std::string& v, long lo, long hi) {
    try {
      size_t used = 0;
      const long n = std::stol(v, &used);
      if (used != v.size() || n < lo || n > hi) throw std::out_of_range(v);
      return static_cast<int>(n);
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
  auto object = [&](const std::string& name, const std::string& v) {
    json j = json::parse(v, nullptr, false);
    if (!j.is_object()) usage(name + " must be a JSON object, got " + v);
    return j;
  };
  bool sockets_set = false, rate_set = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--workload") {
      const std::string w = value(i);
      if (w == "w1")
        f.workload = Workload::w1;
      else if (w == "w2")
        f.workload = Workload::w2;
      else if (w == "storm")
        f.workload = Workload::storm;
      else
        usage("--workload must be w1, w2 or storm, got " + w);
    } else if (a == "--keys")
      f.keys = integer(a, value(i), 4, 100000);
    else if (a == "--subs")
      f.subs = integer(a, value(i), 1, 16);
    else if (a == "--access-rate")
      f.access_rate = real(a, value(i));
    else if (a == "--no-access")
      f.access_rate = 0;
    else if (a == "--storm-jitter-ms")
      f.storm_jitter_ms = integer(a, value(i), 0, 60000);
    else if (a == "--sockets") {
      f.sockets = integer(a, value(i), 1, 60000);
      sockets_set = true;
    } else if (a == "--rate") {
      f.rate = real(a, value(i));
      rate_set = true;
    }
    else if (a == "--seconds")
      f.seconds = real(a, value(i));
    else if (a == "--writers")
      f.writers = integer(a, value(i), 1, 16);
    else if (a == "--batch-ms")
      f.batch_ms = integer(a, value(i), 1, 1000);
    else if (a == "--sample-every")
      f.sample_every = integer(a, value(i), 1, 100000);
    else if (a == "--client-threads")
      f.client_threads = integer(a, value(i), 1, 8);
    else if (a == "--open-concurrency")
      f.open_concurrency = integer(a, value(i), 1, 5000);
    else if (a == "--floor-rounds")
      f.floor_rounds = integer(a, value(i), 1, 1000);
    else if (a == "--io-threads")
      f.io_threads = integer(a, value(i), 1, 64);
    else if (a == "--drain-timeout")
      f.drain_timeout = real(a, value(i));
    else if (a == "--settle-load")
      f.settle = real(a, value(i));
    else if (a == "--log-dir")
      f.log_dir = value(i);
    else if (a == "--replica-config-extra")
      f.extra = object(a, value(i));
    else if (a == "--ab")
      f.ab = object(a, value(i));
    else if (a == "--ab-binary")
      f.ab_binary = value(i);
    else if (a == "--help" || a == "-h")
      usage("help");
    else
      usage("unknown flag " + a);
  }
  if (f.seconds > 600) usage("--seconds must be at most 600");
  // The workloads' own defaults (issue 46): W2 and the storm at 5,000 sockets, the storm's
  // updates at a low rate.
  if (f.workload != Workload::w1 && !sockets_set) f.sockets = 5000;
  if (f.workload == Workload::storm && !rate_set) f.rate = 20;
  if (f.workload != Workload::w1 && f.subs > f.keys) usage("--subs must be at most --keys");
  if (f.ab && f.workload != Workload::w1) usage("--ab is for --workload w1");
  if (!f.ab_binary.empty() && f.workload == Workload::w2)
    usage("--ab-binary is for --workload w1 or storm");
  return f;
}

// ---------------------------------------------------------------------------------------------
// One run of the workload on a fresh replica

struct Phase {
  std::string name;
  json server;         // the replica's "server" section
  std::string binary;  // the `outlive` it ran
  // written
  int64_t written = 0, transactions = 0;
  double write_seconds = 0, behind_ms = 0;
  std::string writer_error;
  // received
  int subscribed = 0, failed = 0;
  double subscribe_s = 0;
  uint64_t updates = 0, progress = 0, resyncs = 0, errors = 0, other = 0, closes = 0;
  int64_t lost = 0;        // updates written to a socket's key that it never received
  uint64_t disorder = 0;   // updates out of order or twice
  int sockets_short = 0;   // sockets missing at least one update
  double window_s = 0;     // first write -> end of the drain (the CPU's window)
  double lag_ms = 0;       // last write -> last update frame
  bool complete = false;
  double p50 = 0, p99 = 0, max = 0;
  size_t samples = 0;
  // cost
  double replica_cpu = 0;
  Around around;
  std::string threads;  // the replica's CPU by thread name
  long rss_start = 0, rss_idle = 0, rss_end = 0;  // KiB
  double idle_cpu_per_s = 0;  // the replica's CPU per second once the sockets were subscribed
  std::string frame_sample;
  int frame_bytes = 0;  // one update frame as sent, websocket header included
  LoadWindow load;
  std::string note;

  uint64_t frames() const { return updates + progress; }
  double us_per_update() const {
    return written > 0 ? replica_cpu / static_cast<double>(written) * 1e6 : 0;
  }
  double us_per_frame() const {
    return frames() > 0 ? replica_cpu / static_cast<double>(frames()) * 1e6 : 0;
  }
  // Over the writing: the frames the updates cause, tail included, at the rate they were written
  // (the window's own tail is mostly the 1.2 s wait for the last progress frame).
  double frames_per_s() const {
    return write_seconds > 0 ? static_cast<double>(frames()) / write_seconds : 0;
  }
};

// W1 on the services: the channel (module comment) and one run per column.
struct W1 {
  const Flags& flags;
  Services& services;

  json apps() const {
    return {{kApp,
             {{"channels",
               {{kChannel,
                 {{"scope", {{"type", "object"}}},
                  {"keys", "SELECT $2->>'accessSubject' AS key"},
                  {"authorize", "SELECT v->>'id' AS id FROM jsonb_array_elements($2) v"}}}}}}}};
  }

  Phase run(const std::string& name, const json& server,
            const std::string& binary = OUTLIVE_BINARY) {
    Phase p;
    p.name = name;
    p.server = server;
    p.binary = binary;
    Replica replica = services.start_replica(name, server, apps(), binary);
    const int port = replica.port;
    const pid_t pid = replica.pid();
    p.rss_start = rss_kib(pid);

    Client client(flags.client_threads, flags.open_concurrency);
    const auto opening = Steady::now();
    client.open(
        kOutlive, flags.sockets, port, std::string("/api/") + kApp + "/live",
        [](int i) { return "Authorization: Bearer key" + std::to_string(i + 1) + "\r\n"; },
        kChannel, flags.sample_every, true);
    const auto deadline = Steady::now() + std::chrono::seconds(60 + flags.sockets / 50);
    GroupStats s;
    for (;;) {
      s = client.stats(kOutlive);
      if (static_cast<int>(s.subscribed + s.failed) >= flags.sockets || Steady::now() > deadline)
        break;
      std::this_thread::sleep_for(100ms);
    }
    p.subscribed = static_cast<int>(s.subscribed);
    p.failed = static_cast<int>(s.failed);
    p.subscribe_s = seconds_since(opening);
    progress(name + ": " + std::to_string(p.subscribed) + " of " + std::to_string(flags.sockets) +
             " sockets subscribed in " + fixed(p.subscribe_s, 1) + " s" +
             (p.failed ? "; " + std::to_string(p.failed) + " failed, first: " + s.first_error
                       : ""));
    // Idle: the opening's work (credential checks, pool, pings) done, before the RSS is read.
    p.idle_cpu_per_s = wait_idle_cpu(pid);
    p.rss_idle = rss_kib(pid);

    services.settle();
    client.mark(kOutlive);
    client.take_latencies(kOutlive);
    const auto before = client.stats(kOutlive);
    const auto log_at = replica.log_size();
    LoadSampler load;
    progress(name + ": writing " + thousands(flags.rate * flags.seconds) + " updates over " +
             fixed(flags.seconds, 0) + " s to " + std::to_string(flags.sockets) + " keys");
    const double cpu0 = cpu_of(pid);
    const Around around0 = sample_around();
    const auto threads0 = on_cpu_seconds_by_thread(pid);
    const auto t0 = Steady::now() + 20ms;
    WritePlan plan;
    plan.app = kApp;
    plan.keys = flags.sockets;  // socket k's key is user:u<k + 1>
    plan.key_name = [](int k) { return "user:u" + std::to_string(k + 1); };
    plan.rate = flags.rate;
    plan.seconds = flags.seconds;
    plan.writers = flags.writers;
    plan.batch_ms = flags.batch_ms;
    const Writes writes = write_keyed_updates(services.db, plan, t0);
    const std::vector<int64_t>& written = writes.written;
    p.written = writes.total;
    p.transactions = writes.transactions;
    p.behind_ms = writes.behind_ms;
    p.writer_error = writes.error;
    p.write_seconds = writes.seconds;
    const int64_t last_write_us = wall_us();
    if (!p.writer_error.empty()) p.note += "writer error: " + p.writer_error + "; ";

    // Drain: every update arrived (or nothing new for 10 s, or --drain-timeout); then the progress
    // frames the last updates leave owed (at most one a second per socket) until none came for
    // 1.2 s: they are part of what the workload costs.
    GroupStats now;
    const Drained drained = wait_drained(
        [&] {
          now = client.stats(kOutlive);
          return now.updates - before.updates;
        },
        p.written, flags.drain_timeout, "update frame");
    p.complete = drained.complete;
    p.note += drained.note;
    p.lag_ms = now.last_update_us > last_write_us ? (now.last_update_us - last_write_us) / 1e3 : 0;
    now = wait_progress_quiet(client, now);
    p.replica_cpu = cpu_of(pid) - cpu0;
    p.around = sample_around() - around0;
    p.threads = thread_cpu_since(threads0, on_cpu_seconds_by_thread(pid));
    p.window_s = seconds_since(t0);
    p.load = load.stop();
    p.rss_end = rss_kib(pid);

    p.updates = now.updates - before.updates;
    p.progress = now.progress - before.progress;
    p.resyncs = now.resyncs - before.resyncs;
    p.errors = now.errors - before.errors;
    p.other = now.other - before.other;
    p.closes = now.closed - before.closed;
    if (!now.first_error.empty()) p.note += "first error: " + now.first_error + "; ";
    for (const auto& q : client.sequences(kOutlive)) {
      const int64_t want = written[static_cast<size_t>(q.index)];
      const int64_t missing = want - static_cast<int64_t>(q.updates);
      if (missing > 0 || q.last_seq != want) ++p.sockets_short;
      p.lost += std::max<int64_t>(0, missing);
      p.disorder += q.disorder;
    }
    std::vector<int64_t> lat;
    for (const auto& [n, us] : client.take_latencies(kOutlive)) lat.push_back(us);
    p.samples = lat.size();
    p.p50 = percentile(lat, 0.50);
    p.p99 = percentile(lat, 0.99);
    p.max = lat.empty() ? 0 : static_cast<double>(lat.back()) / 1000.0;
    p.frame_sample = now.sample_update;
    p.frame_bytes =
        static_cast<int>(p.frame_sample.size() + (p.frame_sample.size() < 126 ? 2 : 4));

    // The replica's warnings during the phase (log level warn), by message.
    p.note += replica.warnings_since(log_at);

    progress(name + ": " + thousands(static_cast<double>(p.written)) + " written, " +
             thousands(static_cast<double>(p.updates)) + " update frames and " +
             thousands(static_cast<double>(p.progress)) + " progress frames received; replica " +
             fixed(p.replica_cpu, 2) + " CPU-s, " + fixed(p.us_per_update(), 1) +
             " µs per update; lost " + std::to_string(p.lost) + ", disorder " +
             std::to_string(p.disorder) + ", resyncs " + std::to_string(p.resyncs));
    client.close_group(kOutlive);
    replica.process->stop(SIGTERM, 10s);
    return p;
  }
};

// W1: the run (twice with --ab), the floor, the report; 0 when nothing was lost.
int run_w1(const Flags& flags) {
  const auto started = Steady::now();
  const double load_before = load_average();
  progress("starting PostgreSQL 15 and nats-server on loopback");
  Services b(flags);
  W1 w1{flags, b};
  std::vector<Phase> phases;
  Floor floor;
  std::string pg_version, nats_version, failure;
  try {
    b.setup();
    pg_version = b.server_version();
    nats_version = command_output("nats-server --version 2>&1");
    json server = {{"io_threads", flags.io_threads}};
    server.merge_patch(flags.extra);
    phases.push_back(w1.run("A", server));
    if (flags.ab || !flags.ab_binary.empty()) {
      json with = server;
      if (flags.ab) with.merge_patch(*flags.ab);
      try {
        phases.push_back(w1.run("B", with,
                                flags.ab_binary.empty() ? OUTLIVE_BINARY : flags.ab_binary));
      } catch (const std::exception& e) {
        // A's figures still stand against the floor.
        failure = std::string("B (server ") + with.dump() + "): " + e.what();
        std::cerr << "keyed_bench: " << failure << "\n";
      }
    }
    // A socket gets a frame every N / rate seconds in W1; rounds that far apart (at most 2 s, to
    // keep the run short) leave each socket's kernel state as cold as the replica finds it.
    const int cadence_ms = static_cast<int>(
        std::clamp(1000.0 * flags.sockets / std::max(1.0, flags.rate), 0.0, 2000.0));
    floor = run_floor(b, flags.sockets,
                      phases.front().frame_bytes > 0 ? phases.front().frame_bytes : 200, cadence_ms);
  } catch (const std::exception& e) {
    failure += (failure.empty() ? "" : "; ") + std::string(e.what());
    std::cerr << "keyed_bench: " << e.what() << "\n";
  }
  const double load_after = load_average();

  // ---- report
  std::cout << "\n### keyed_bench (W1, a key per user), " << now_utc() << "\n\n";
  std::cout << "- Machine: " << machine_line() << "; shared with other engineers\n";
  std::cout << "- Services (same machine, loopback): PostgreSQL " << pg_version
            << " (harness settings: fsync=off, synchronous_commit=off), " << nats_version
            << "; the replica is a separate `outlive serve --config` process, fresh for each "
               "column\n";
  std::cout << "- Load: " << flags.sockets
            << " websocket sockets (API keys, one viewer each, from 127.x.y.z source addresses, "
               "4 per address), each with one `sub` of channel \""
            << kChannel << "\" (keys(): the viewer's own key; authorize(): constant, everyone "
            << "may read); " << fixed(flags.rate, 0) << " updates/s for " << fixed(flags.seconds, 0)
            << " s, each to a random socket's key, from " << flags.writers
            << " writer connections in one transaction per " << flags.batch_ms
            << " ms (`publish_live` per update, then `wake`); the load client is "
            << flags.client_threads << " epoll thread(s) in this process\n";
  std::cout << "- Latency: commit (clock_timestamp() in the writing transaction) to the frame's "
               "arrival at the client, "
            << (flags.sample_every == 1 ? std::string("every socket")
                                        : "every " + std::to_string(flags.sample_every) +
                                              "th socket")
            << "\n";
  std::cout << "- Load average (1 min) before / after: " << fixed(load_before, 2) << " / "
            << fixed(load_after, 2) << "; total run " << fixed(seconds_since(started), 0) << " s\n";
  std::cout << "- Logs and configs: " << b.dir << "\n";
  std::cout << "- Command: `cmake --build build -j2 --target keyed_bench outlive && "
            << flags.command << "`\n";
  if (!failure.empty()) std::cout << "- **Failed**: " << failure << "\n";
  if (!phases.empty() && !phases.front().frame_sample.empty())
    std::cout << "- An update frame (" << phases.front().frame_bytes
              << " bytes with its websocket header): `" << phases.front().frame_sample << "`\n";
  std::cout << "\n";

  const double floor_us = floor.back_to_back.us_per_frame();
  const double cadence_us = floor.cadence.us_per_frame();
  const bool ab = phases.size() == 2;
  std::cout << "| | A: server " << (phases.empty() ? "" : phases[0].server.dump());
  if (ab) {
    std::cout << " | B: server " << phases[1].server.dump();
    if (phases[1].binary != phases[0].binary) std::cout << ", `" << phases[1].binary << "`";
    std::cout << " | B / A";
  }
  std::cout << " |\n|---|---:" << (ab ? "|---:|---:" : "") << "|\n";
  auto row = [&](const std::string& label, auto value, auto number) {
    std::cout << "| " << label;
    for (const auto& p : phases) std::cout << " | " << value(p);
    if (ab) {
      const double a = number(phases[0]), bb = number(phases[1]);
      std::cout << " | " << (a != 0 ? fixed(bb / a, 2) + "x" : std::string("-"));
    }
    std::cout << " |\n";
  };
  auto text_row = [&](const std::string& label, auto value) {
    std::cout << "| " << label;
    for (const auto& p : phases) std::cout << " | " << value(p);
    if (ab) std::cout << " | ";
    std::cout << " |\n";
  };
  row("**replica CPU per update written, µs**", [](const Phase& p) {
        return "**" + fixed(p.us_per_update(), 1) + "**";
      },
      [](const Phase& p) { return p.us_per_update(); });
  row("replica CPU s (write phase + drain)", [](const Phase& p) { return fixed(p.replica_cpu, 2); },
      [](const Phase& p) { return p.replica_cpu; });
  row("updates written (transactions)",
      [](const Phase& p) {
        return thousands(d(p.written)) + " (" + thousands(d(p.transactions)) + ")";
      },
      [&](const Phase& p) { return d(p.written); });
  row("frames received: updates", [&](const Phase& p) { return thousands(d(p.updates)); },
      [&](const Phase& p) { return d(p.updates); });
  row("frames received: progress", [&](const Phase& p) { return thousands(d(p.progress)); },
      [&](const Phase& p) { return d(p.progress); });
  row("frames/s (updates + progress, per second of writing)",
      [](const Phase& p) { return thousands(p.frames_per_s()); },
      [](const Phase& p) { return p.frames_per_s(); });
  row("**replica CPU per frame, µs**",
      [](const Phase& p) { return "**" + fixed(p.us_per_frame(), 2) + "**"; },
      [](const Phase& p) { return p.us_per_frame(); });
  row("kernel floor per frame, µs: back to back / at W1's cadence",
      [&](const Phase&) { return fixed(floor_us, 2) + " / " + fixed(cadence_us, 2); },
      [&](const Phase&) { return floor_us; });
  row("**ratio outlive / floor** (back to back / cadence)",
      [&](const Phase& p) {
        return "**" + (floor_us > 0 ? fixed(p.us_per_frame() / floor_us, 1) : std::string("-")) +
               "x** / " +
               (cadence_us > 0 ? fixed(p.us_per_frame() / cadence_us, 1) : std::string("-")) + "x";
      },
      [&](const Phase& p) { return floor_us > 0 ? p.us_per_frame() / floor_us : 0; });
  row("latency commit → receipt p50 / p99 / max, ms",
      [](const Phase& p) {
        return fixed(p.p50, 1) + " / " + fixed(p.p99, 1) + " / " + fixed(p.max, 1);
      },
      [](const Phase& p) { return p.p99; });
  row("**lost updates** (sockets short) / out of order or twice",
      [](const Phase& p) {
        return "**" + std::to_string(p.lost) + "** (" + std::to_string(p.sockets_short) + ") / " +
               std::to_string(p.disorder);
      },
      [](const Phase& p) { return d(p.lost); });
  row("**resync frames** / errors / closes",
      [](const Phase& p) {
        return "**" + std::to_string(p.resyncs) + "** / " + std::to_string(p.errors) + " / " +
               std::to_string(p.closes);
      },
      [](const Phase& p) { return d(p.resyncs); });
  row("replica RSS before the sockets", [](const Phase& p) { return kib(p.rss_start); },
      [](const Phase& p) { return d(p.rss_start); });
  row("replica RSS subscribed, idle (per socket)",
      [&](const Phase& p) {
        return kib(p.rss_idle) + " (" +
               fixed(d(p.rss_idle - p.rss_start) / std::max(1, p.subscribed), 1) + " KiB)";
      },
      [](const Phase& p) { return d(p.rss_idle - p.rss_start); });
  row("replica RSS at the end", [](const Phase& p) { return kib(p.rss_end); },
      [](const Phase& p) { return d(p.rss_end); });
  row("CPU s around: postgres / nats / this process",
      [](const Phase& p) {
        return fixed(p.around.postgres, 1) + " / " + fixed(p.around.nats, 1) + " / " +
               fixed(p.around.self, 1);
      },
      [](const Phase& p) { return p.around.postgres; });
  text_row("sockets subscribed (s to open them)", [](const Phase& p) {
    return std::to_string(p.subscribed) + " (" + fixed(p.subscribe_s, 1) + " s)" +
           (p.failed ? ", " + std::to_string(p.failed) + " failed" : "");
  });
  text_row("window: writing / whole s; writers behind at most; last update after the last write",
           [](const Phase& p) {
             return fixed(p.write_seconds, 1) + " / " + fixed(p.window_s, 1) + " s; " +
                    fixed(p.behind_ms, 0) + " ms; " + fixed(p.lag_ms, 0) + " ms";
           });
  text_row("load average start → end", [](const Phase& p) {
    return fixed(p.load.start, 2) + " → " + fixed(p.load.end, 2);
  });
  text_row("replica CPU by thread", [](const Phase& p) { return p.threads; });
  text_row("notes", [](const Phase& p) {
    return (p.complete ? std::string() : std::string("**incomplete**; ")) +
           "idle replica " + fixed(p.idle_cpu_per_s * 1e3, 0) + " ms CPU/s before writing" +
           (p.note.empty() ? "" : "; " + p.note.substr(0, p.note.size() - 2));
  });
  std::cout << "\n**Kernel floor, same run** (after the workload, the client's sockets closed): "
            << floor.back_to_back.sockets << " loopback sockets from the client's source "
            << "addresses, one `sendmsg` of a " << floor.back_to_back.frame_bytes
            << "-byte frame per socket per round; back to back " << flags.floor_rounds
            << " rounds, best of 3: " << fixed(floor_us, 2) << " µs sender CPU per frame; at W1's "
            << "cadence (5 rounds " << floor.cadence_ms << " ms apart, best of 2): "
            << fixed(cadence_us, 2) << " µs; load " << fixed(floor.load.start, 2) << " → "
            << fixed(floor.load.end, 2) << (floor.error.empty() ? "" : "; " + floor.error) << "\n";
  std::cout << "\nColumns: *replica CPU* = utime + stime of the `outlive serve` process "
               "(/proc/<pid>/stat, 10 ms ticks) from the first write until every update arrived "
               "and the progress frames stopped (1.2 s without one); per update written = that / "
               "updates committed; per frame = that / (update + progress frames received). "
               "*Lost*: per socket, updates written to its key that it did not receive (each "
               "socket must receive its key's updates 1, 2, ... exactly once, in order). RSS: "
               "VmRSS of the replica; per socket = (subscribed and idle - before the sockets) / "
               "sockets subscribed. The machine has "
            << std::thread::hardware_concurrency() << " cores.\n";
  bool ok = failure.empty() && !phases.empty();
  for (const auto& p : phases)
    ok = ok && p.complete && p.lost == 0 && p.disorder == 0 && p.resyncs == 0 &&
         p.subscribed == flags.sockets;
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = parse_flags(argc, argv);
  progress_name = "keyed_bench";
  log::set_min_level(log::Level::warn);
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
  // The client's sockets, then (closed first) the floor's pairs.
  if (static_cast<long>(limit.rlim_cur) < 2L * flags.sockets + 1000) {
    std::cerr << "keyed_bench: the open file limit (" << limit.rlim_cur << ") is too low for "
              << flags.sockets << " sockets\n";
    return 2;
  }
  // Backstop: every wait below has its own limit; this ends the run whatever happens (the
  // services are our children and die with us).
  const double per_phase = flags.seconds + flags.drain_timeout + 60 + 180 + flags.sockets / 50.0 +
                           (flags.workload == Workload::w1 ? 0 : 120);
  const double limit_s = 300 + per_phase * (flags.ab || !flags.ab_binary.empty() ? 2 : 1) + 240;
  std::thread([limit_s] {
    std::this_thread::sleep_for(std::chrono::duration<double>(limit_s));
    std::cerr << "keyed_bench: overall time limit of " << limit_s << " s passed, exiting\n";
    std::_Exit(3);
  }).detach();

  switch (flags.workload) {
    case Workload::w1:
      return run_w1(flags);
    case Workload::w2:
      return run_w2(flags);
    case Workload::storm:
      return run_storm(flags);
  }
  return 2;
}
