// keyed_bench's workloads on shared keys (issue 46), on the harness of W1 (bench/keyed_harness.hpp:
// an embedded PostgreSQL 15 and nats-server on loopback, real `outlive serve` child processes, the
// epoll load client of bench/fanout_client.hpp in this process).
//
// Both use app "docs", channel "doc": socket i (viewer "user:u<i+1>", API key "key<i+1>") sends
// --subs subs (default 4), sub j with scope {"key": "doc:<(subs * i + j) % keys>"}, so each of the
// --keys keys (default 1,000) has sockets * subs / keys subscribers and a socket's keys are
// distinct. keys() returns the scope's key; authorize() returns the viewers that table bench.acl
// lists on the key (every subscriber is listed, so every update is delivered). Both go through
// PL/pgSQL functions, bench.keys and bench.authorize, which log each call (and its number of
// viewers) in bench.calls before answering: the statements run are counted by PostgreSQL, not by
// the replica (whose outlive_authorize_seconds count is printed beside, as a cross-check).
//
// W2, shared keys with access churn (--workload w2): --sockets (default 5,000) open and subscribe
// (the opening's keys() and authorize() calls are counted); then --rate updates/s (default 2,000)
// to random keys for --seconds (writers as W1's: every key's updates are numbered, and each sub
// checks it receives 1, 2, 3, ... of its key exactly once and in order), plus --access-rate
// access updates/s (default 5; `events.publish_live(app, key, NULL, true)`, SPEC 2.3) to random
// keys, each in a transaction that also adds or removes an ACL row of a viewer who is not
// subscribed (a real change of who may read the key; the subscribers keep access). Reported as
// W1: the replica's CPU per frame against the kernel's floor measured after the workload (same
// sockets, at the workload's cadence: a socket gets a frame every keys / (subs * rate) s), frames,
// latency, lost and out-of-order updates, and the calls during the opening and the writing.
//
// Storm (--workload storm): two replicas A and B on the same services. --sockets (default 5,000)
// subscribe on A; updates flow at --rate (default 20/s) to random keys from then on. A gets
// SIGTERM and closes every socket (1012); once all are closed the client opens them all again on B
// (cold: no decision cached) at once, or spread over --storm-jitter-ms, each sub carrying the last
// cursor it saw (subscribed, update, resync or progress, as clients/js/outlive.js keeps it), so B
// replays what each missed. Reported: the time from the reopen to the last `subscribed` frame,
// how many subs were answered, the keys() and authorize() statements B ran for them, and, once
// the writing stopped 3 s after the last `subscribed`, whether every sub holds every update of its
// key (numbered 1, 2, ... across A and B: no gap, no duplicate).
#include "bench/keyed_workloads.hpp"

#include <iostream>

namespace outlive::bench::keyed {
namespace {

const char* kApp = "docs";
const char* kChannel = "doc";

std::string key_name(int k) { return "doc:" + std::to_string(k); }
int key_index(const std::string& name) { return std::stoi(name.substr(4)); }
int key_of(const Flags& f, int socket, int sub) {
  return static_cast<int>((static_cast<int64_t>(f.subs) * socket + sub) % f.keys);
}

// The channel's SQL and the call log (module comment).
void setup_shared_keys(Services& s) {
  const Flags& f = s.flags;
  s.sql(
      "CREATE SCHEMA bench;"
      "CREATE TABLE bench.acl (key text, subject text, PRIMARY KEY (key, subject));"
      "INSERT INTO bench.acl SELECT 'doc:' || ((" +
      std::to_string(f.subs) + "::bigint * (i - 1) + j) % " + std::to_string(f.keys) +
      "), 'user:u' || i FROM generate_series(1, " + std::to_string(f.sockets) +
      ") i, generate_series(0, " + std::to_string(f.subs - 1) +
      ") j ON CONFLICT DO NOTHING;"
      "ANALYZE bench.acl;"
      "CREATE TABLE bench.calls (fn text NOT NULL, viewers int NOT NULL, "
      "  at timestamptz NOT NULL DEFAULT clock_timestamp());"
      "CREATE FUNCTION bench.keys(scope jsonb, viewer jsonb) RETURNS SETOF text "
      "LANGUAGE plpgsql AS $$ BEGIN "
      "  INSERT INTO bench.calls (fn, viewers) VALUES ('keys', 1);"
      "  RETURN NEXT scope->>'key';"
      "END $$;"
      "CREATE FUNCTION bench.authorize(k text, viewers jsonb) RETURNS SETOF text "
      "LANGUAGE plpgsql AS $$ BEGIN "
      "  INSERT INTO bench.calls (fn, viewers) VALUES ('authorize', jsonb_array_length(viewers));"
      "  RETURN QUERY SELECT v->>'id' FROM jsonb_array_elements(viewers) v "
      "    JOIN bench.acl a ON a.key = k AND a.subject = v->>'accessSubject';"
      "END $$;");
}

json apps() {
  return {{kApp,
           {{"channels",
             {{kChannel,
               {{"scope",
                 {{"type", "object"},
                  {"properties", {{"key", {{"type", "string"}}}}},
                  {"required", {"key"}}}},
                {"keys", "SELECT k AS key FROM bench.keys($1, $2) k"},
                {"authorize", "SELECT id FROM bench.authorize($1, $2) id"}}}}}}}};
}

// keys() and authorize() statements PostgreSQL ran so far (bench.calls).
struct Calls {
  int64_t keys = 0, authorize = 0, viewers = 0;  // viewers: over the authorize calls
  Calls operator-(const Calls& o) const {
    return {keys - o.keys, authorize - o.authorize, viewers - o.viewers};
  }
  std::string text() const {
    return thousands(static_cast<double>(authorize)) + " authorize (" +
           (authorize ? fixed(static_cast<double>(viewers) / static_cast<double>(authorize), 1)
                      : std::string("-")) +
           " viewers each) / " + thousands(static_cast<double>(keys)) + " keys";
  }
};

Calls count_calls(const std::string& db) {
  pqxx::connection c(db);
  Calls out;
  for (const auto& row : pqxx::nontransaction(c).exec(
           "SELECT fn, count(*), coalesce(sum(viewers), 0) FROM bench.calls GROUP BY fn")) {
    if (row[0].as<std::string>() == "keys") out.keys = row[1].as<int64_t>();
    if (row[0].as<std::string>() == "authorize") {
      out.authorize = row[1].as<int64_t>();
      out.viewers = row[2].as<int64_t>();
    }
  }
  return out;
}

const char* kAuthorizeMetric = "outlive_authorize_seconds_count";

void open_sockets(Client& client, const Flags& f, int port) {
  client.open_multi(
      kOutlive, f.sockets, port, std::string("/api/") + kApp + "/live",
      [](int i) { return "Authorization: Bearer key" + std::to_string(i + 1) + "\r\n"; }, kChannel,
      [&f](int i) {
        std::vector<Client::SubSpec> subs;
        for (int j = 0; j < f.subs; ++j) {
          const std::string key = key_name(key_of(f, i, j));
          subs.emplace_back("w" + std::to_string(j), key, json{{"key", key}}.dump());
        }
        return subs;
      },
      f.sample_every);
}

// Waits until every sub of the `sockets` sockets was answered `subscribed`, or its socket failed
// or closed, at most `seconds`. Returns the stats at the end.
GroupStats wait_subscribed(Client& client, int sockets, int subs_per_socket, double seconds) {
  GroupStats s;
  const int64_t want = static_cast<int64_t>(sockets) * subs_per_socket;
  wait_until(
      [&] {
        s = client.stats(kOutlive);
        return static_cast<int64_t>(s.subscribed + (s.failed + s.closed) * subs_per_socket) >=
               want;
      },
      seconds, 50ms);
  return s;
}

// Per sub: updates written to its key that it did not receive, and those out of order or twice.
struct Check {
  int64_t expected = 0, lost = 0;
  uint64_t disorder = 0;
  int subs_short = 0, subs = 0;
};

Check check_subs(Client& client, const std::vector<int64_t>& written) {
  Check c;
  for (const auto& q : client.sub_sequences(kOutlive)) {
    const int64_t want = written[static_cast<size_t>(key_index(q.key))];
    const int64_t missing = want - static_cast<int64_t>(q.updates);
    ++c.subs;
    c.expected += want;
    if (missing > 0 || q.last_seq != want) ++c.subs_short;
    c.lost += std::max<int64_t>(0, missing);
    c.disorder += q.disorder;
  }
  return c;
}

int64_t expected_frames(const Flags& f, const std::vector<int64_t>& written) {
  int64_t n = 0;
  for (int i = 0; i < f.sockets; ++i)
    for (int j = 0; j < f.subs; ++j) n += written[static_cast<size_t>(key_of(f, i, j))];
  return n;
}

json server_section(const Flags& f) {
  json server = {{"io_threads", f.io_threads}};
  server.merge_patch(f.extra);
  return server;
}

std::string header(const std::string& title, const Flags& f, const Services& s,
                   const std::string& pg_version, double load_before, double load_after,
                   Steady::time_point started) {
  std::ostringstream out;
  out << "\n### keyed_bench (" << title << "), " << now_utc() << "\n\n";
  out << "- Machine: " << machine_line() << "; shared with other engineers\n";
  out << "- Services (same machine, loopback): PostgreSQL " << pg_version
      << " (harness settings: fsync=off, synchronous_commit=off), "
      << command_output("nats-server --version 2>&1")
      << "; the replica is a separate `outlive serve --config` process\n";
  out << "- Channel \"" << kChannel << "\": keys() returns the sub's scope key, authorize() "
      << "reads an ACL table (every subscriber allowed); both are PL/pgSQL functions that log "
         "each call in a table, so the statements are counted by PostgreSQL\n";
  out << "- Load average (1 min) before / after: " << fixed(load_before, 2) << " / "
      << fixed(load_after, 2) << "; total run " << fixed(seconds_since(started), 0) << " s\n";
  out << "- Logs and configs: " << s.dir << "\n";
  out << "- Command: `cmake --build build -j2 --target keyed_bench outlive && " << f.command
      << "`\n";
  return out.str();
}

// ---------------------------------------------------------------------------------------------
// W2

struct W2Result {
  int subscribed = 0, failed = 0;
  double subscribe_s = 0;
  Calls opening, writing;
  double opening_metric = -1, writing_metric = -1;  // the replica's outlive_authorize_seconds
  int64_t written = 0, transactions = 0, access_updates = 0;
  double write_seconds = 0, behind_ms = 0, lag_ms = 0;
  uint64_t updates = 0, progress = 0, resyncs = 0, revoked = 0, errors = 0, other = 0, closes = 0;
  Check check;
  bool complete = false;
  double p50 = 0, p99 = 0, max = 0;
  size_t samples = 0;
  double replica_cpu = 0, idle_cpu_per_s = 0;
  Around around;
  std::string threads, frame_sample, note;
  int frame_bytes = 0;
  long rss_start = 0, rss_idle = 0, rss_end = 0;
  LoadWindow load;

  uint64_t frames() const { return updates + progress; }
  double us_per_frame() const {
    return frames() ? replica_cpu / static_cast<double>(frames()) * 1e6 : 0;
  }
  double us_per_update() const {
    return written ? replica_cpu / static_cast<double>(written) * 1e6 : 0;
  }
};

// --access-rate access updates/s to random keys until `stop`, each with an ACL change of a
// viewer who is not subscribed (added, next time removed).
int64_t write_access_updates(const std::string& db, const Flags& f, const std::atomic<bool>& stop,
                             Steady::time_point t0, std::string& error) {
  int64_t n = 0;
  try {
    pqxx::connection conn(db);
    std::mt19937_64 random(0xacce55);
    std::uniform_int_distribution<int> pick(0, f.keys - 1);
    const auto period = std::chrono::duration<double>(1.0 / f.access_rate);
    for (int64_t i = 0; !stop; ++i) {
      std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Steady::duration>(period * i));
      if (stop) break;
      const std::string key = key_name(pick(random));
      const std::string subject = "user:outsider" + std::to_string(i / 2);
      const std::string change = i % 2 == 0
                                     ? "INSERT INTO bench.acl VALUES ('" + key + "', '" + subject +
                                           "') ON CONFLICT DO NOTHING;"
                                     : "DELETE FROM bench.acl WHERE subject = '" + subject + "';";
      pqxx::nontransaction(conn).exec("BEGIN; " + change + " SELECT events.publish_live('" +
                                      std::string(kApp) + "', '" + key +
                                      "', NULL, true); COMMIT; SELECT events.wake('" + kApp + "')");
      ++n;
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  return n;
}

W2Result w2_phase(Services& services) {
  const Flags& f = services.flags;
  W2Result r;
  Replica replica = services.start_replica("W2", server_section(f), apps());
  const pid_t pid = replica.pid();
  r.rss_start = rss_kib(pid);

  // Opening: every socket's subs, and the statements they cost.
  const Calls calls0 = count_calls(services.db);
  const double metric0 = replica.metric(kAuthorizeMetric);
  Client client(f.client_threads, f.open_concurrency);
  const auto opening = Steady::now();
  open_sockets(client, f, replica.port);
  const int64_t subs = static_cast<int64_t>(f.sockets) * f.subs;
  GroupStats s = wait_subscribed(client, f.sockets, f.subs, 60 + f.sockets / 25.0);
  r.subscribe_s = seconds_since(opening);
  r.subscribed = static_cast<int>(s.subscribed);
  r.failed = static_cast<int>(s.failed);
  const Calls calls1 = count_calls(services.db);
  const double metric1 = replica.metric(kAuthorizeMetric);
  r.opening = calls1 - calls0;
  r.opening_metric = metric1 - metric0;
  progress("W2: " + std::to_string(r.subscribed) + " of " + std::to_string(subs) +
           " subs answered `subscribed` in " + fixed(r.subscribe_s, 1) + " s; " + r.opening.text() +
           (r.failed ? "; " + std::to_string(r.failed) + " sockets failed, first: " + s.first_error
                     : ""));
  // Idle: the opening's work done, before the RSS is read.
  r.idle_cpu_per_s = wait_idle_cpu(pid);
  r.rss_idle = rss_kib(pid);

  // Writing: updates and access updates.
  services.settle();
  client.mark(kOutlive);
  client.take_latencies(kOutlive);
  const auto before = client.stats(kOutlive);
  const auto log_at = replica.log_size();
  const Calls calls2 = count_calls(services.db);
  const double metric2 = replica.metric(kAuthorizeMetric);
  LoadSampler load;
  progress("W2: writing " + thousands(f.rate * f.seconds) + " updates and " +
           thousands(f.access_rate * f.seconds) + " access updates over " + fixed(f.seconds, 0) +
           " s to " + std::to_string(f.keys) + " keys");
  const double cpu0 = cpu_of(pid);
  const Around around0 = sample_around();
  const auto threads0 = on_cpu_seconds_by_thread(pid);
  const auto t0 = Steady::now() + 20ms;
  std::atomic<bool> written{false};
  std::string access_error;
  std::thread access([&] {
    if (f.access_rate > 0)
      r.access_updates = write_access_updates(services.db, f, written, t0, access_error);
  });
  WritePlan plan;
  plan.app = kApp;
  plan.keys = f.keys;
  plan.key_name = key_name;
  plan.rate = f.rate;
  plan.seconds = f.seconds;
  plan.writers = f.writers;
  plan.batch_ms = f.batch_ms;
  const Writes writes = write_keyed_updates(services.db, plan, t0);
  written = true;
  access.join();
  const int64_t last_write_us = wall_us();
  r.written = writes.total;
  r.transactions = writes.transactions;
  r.write_seconds = writes.seconds;
  r.behind_ms = writes.behind_ms;
  if (!writes.error.empty()) r.note += "writer error: " + writes.error + "; ";
  if (!access_error.empty()) r.note += "access writer error: " + access_error + "; ";

  GroupStats now;
  const Drained drained = wait_drained(
      [&] {
        now = client.stats(kOutlive);
        return now.updates - before.updates;
      },
      expected_frames(f, writes.written), f.drain_timeout, "update frame");
  r.complete = drained.complete;
  r.note += drained.note;
  r.lag_ms = now.last_update_us > last_write_us ? (now.last_update_us - last_write_us) / 1e3 : 0;
  now = wait_progress_quiet(client, now);
  r.replica_cpu = cpu_of(pid) - cpu0;
  r.around = sample_around() - around0;
  r.threads = thread_cpu_since(threads0, on_cpu_seconds_by_thread(pid));
  r.load = load.stop();
  r.rss_end = rss_kib(pid);
  r.writing = count_calls(services.db) - calls2;
  r.writing_metric = replica.metric(kAuthorizeMetric) - metric2;

  r.updates = now.updates - before.updates;
  r.progress = now.progress - before.progress;
  r.resyncs = now.resyncs - before.resyncs;
  r.revoked = now.revoked - before.revoked;
  r.errors = now.errors - before.errors;
  r.other = now.other - before.other;
  r.closes = now.closed - before.closed;
  if (!now.first_error.empty()) r.note += "first error: " + now.first_error + "; ";
  r.check = check_subs(client, writes.written);
  std::vector<int64_t> lat;
  for (const auto& [n, us] : client.take_latencies(kOutlive)) lat.push_back(us);
  r.samples = lat.size();
  r.p50 = percentile(lat, 0.50);
  r.p99 = percentile(lat, 0.99);
  r.max = lat.empty() ? 0 : static_cast<double>(lat.back()) / 1000.0;
  r.frame_sample = now.sample_update;
  r.frame_bytes = static_cast<int>(r.frame_sample.size() + (r.frame_sample.size() < 126 ? 2 : 4));
  r.note += replica.warnings_since(log_at);
  progress("W2: " + thousands(d(r.written)) + " updates and " + std::to_string(r.access_updates) +
           " access updates written, " + thousands(d(r.updates)) + " update frames; replica " +
           fixed(r.replica_cpu, 2) + " CPU-s, " + fixed(r.us_per_frame(), 2) +
           " µs per frame; lost " + std::to_string(r.check.lost) + ", disorder " +
           std::to_string(r.check.disorder) + "; writing: " + r.writing.text());
  client.close_group(kOutlive);
  replica.process->stop(SIGTERM, 10s);
  return r;
}

}  // namespace

int run_w2(const Flags& f) {
  const auto started = Steady::now();
  const double load_before = load_average();
  progress("starting PostgreSQL 15 and nats-server on loopback");
  Services services(f);
  W2Result r;
  Floor floor;
  std::string pg_version, failure;
  bool ran = false;
  try {
    services.setup();
    setup_shared_keys(services);
    pg_version = services.server_version();
    r = w2_phase(services);
    ran = true;
    // A socket gets a frame every keys / (subs * rate) s.
    const int cadence_ms =
        static_cast<int>(std::clamp(1000.0 * f.keys / std::max(1.0, f.subs * f.rate), 0.0, 2000.0));
    floor = run_floor(services, f.sockets, r.frame_bytes > 2 ? r.frame_bytes : 200, cadence_ms);
  } catch (const std::exception& e) {
    failure = e.what();
    std::cerr << "keyed_bench: " << e.what() << "\n";
  }
  const double load_after = load_average();

  std::cout << header("W2, shared keys with access churn", f, services, pg_version, load_before,
                      load_after, started);
  std::cout << "- Load: " << f.sockets << " websocket sockets (API keys, one viewer each, from "
            << "127.x.y.z source addresses, 4 per address), each with " << f.subs
            << " subs on distinct keys of " << f.keys << " (" << f.sockets * f.subs / f.keys
            << " subscribers per key); " << fixed(f.rate, 0) << " updates/s to random keys for "
            << fixed(f.seconds, 0) << " s from " << f.writers << " writer connections in one "
            << "transaction per " << f.batch_ms << " ms, and " << fixed(f.access_rate, 0)
            << " access updates/s (`events.publish_live(app, key, NULL, true)` with an ACL "
               "change of a viewer who is not subscribed) to random keys; server "
            << server_section(f).dump() << "\n";
  if (!failure.empty()) std::cout << "- **Failed**: " << failure << "\n";
  if (!r.frame_sample.empty())
    std::cout << "- An update frame (" << r.frame_bytes << " bytes with its websocket header): `"
              << r.frame_sample << "`\n";
  std::cout << "\n";
  const double floor_us = floor.back_to_back.us_per_frame();
  const double cadence_us = floor.cadence.us_per_frame();
  auto ratio = [](double a, double b) { return b > 0 ? fixed(a / b, 2) + "x" : std::string("-"); };
  std::cout << "| W2 | |\n|---|---:|\n";
  std::cout << "| sockets × subs subscribed (s to open them) | " << f.sockets << " × " << f.subs
            << ": " << thousands(r.subscribed) << " (" << fixed(r.subscribe_s, 1) << " s)"
            << (r.failed ? ", " + std::to_string(r.failed) + " sockets failed" : "") << " |\n";
  std::cout << "| **statements while opening: authorize (viewers per call) / keys** | **"
            << r.opening.text() << "**; replica's outlive_authorize_seconds count "
            << fixed(r.opening_metric, 0) << " |\n";
  std::cout << "| **statements while writing: authorize (viewers per call) / keys** | **"
            << r.writing.text() << "**; replica's count " << fixed(r.writing_metric, 0)
            << "; access updates written " << r.access_updates << " |\n";
  std::cout << "| updates written (transactions) | " << thousands(d(r.written)) << " ("
            << thousands(d(r.transactions)) << ") |\n";
  std::cout << "| frames received: updates / progress (expected updates) | "
            << thousands(d(r.updates)) << " / " << thousands(d(r.progress)) << " ("
            << thousands(d(r.check.expected)) << ") |\n";
  std::cout << "| replica CPU s (write phase + drain); per update written, µs | "
            << fixed(r.replica_cpu, 2) << "; " << fixed(r.us_per_update(), 1) << " |\n";
  std::cout << "| **replica CPU per frame, µs** | **" << fixed(r.us_per_frame(), 2) << "** |\n";
  std::cout << "| kernel floor per frame, µs: back to back / at W2's cadence | "
            << fixed(floor_us, 2) << " / " << fixed(cadence_us, 2) << " |\n";
  std::cout << "| **ratio outlive / floor** (back to back / cadence) | **"
            << ratio(r.us_per_frame(), floor_us) << "** / " << ratio(r.us_per_frame(), cadence_us)
            << " |\n";
  std::cout << "| latency commit → receipt p50 / p99 / max, ms (" << thousands(d(r.samples))
            << " samples) | " << fixed(r.p50, 1) << " / " << fixed(r.p99, 1) << " / "
            << fixed(r.max, 1) << " |\n";
  std::cout << "| **lost updates** (subs short) / out of order or twice | **" << r.check.lost
            << "** (" << r.check.subs_short << ") / " << r.check.disorder << " |\n";
  std::cout << "| resync / revoked / errors / closes / other frames | " << r.resyncs << " / "
            << r.revoked << " / " << r.errors << " / " << r.closes << " / " << r.other << " |\n";
  std::cout << "| replica RSS before the sockets / subscribed, idle / at the end | "
            << kib(r.rss_start) << " / " << kib(r.rss_idle) << " / " << kib(r.rss_end) << " |\n";
  std::cout << "| CPU s around: postgres / nats / this process | " << fixed(r.around.postgres, 1)
            << " / " << fixed(r.around.nats, 1) << " / " << fixed(r.around.self, 1) << " |\n";
  std::cout << "| writing s; writers behind at most; last update after the last write | "
            << fixed(r.write_seconds, 1) << " s; " << fixed(r.behind_ms, 0) << " ms; "
            << fixed(r.lag_ms, 0) << " ms |\n";
  std::cout << "| load average start → end (write phase) | " << fixed(r.load.start, 2) << " → "
            << fixed(r.load.end, 2) << " |\n";
  std::cout << "| replica CPU by thread | " << r.threads << " |\n";
  std::cout << "| notes | " << (r.complete ? "" : "**incomplete**; ") << "idle replica "
            << fixed(r.idle_cpu_per_s * 1e3, 0) << " ms CPU/s before writing"
            << (r.note.empty() ? "" : "; " + r.note.substr(0, r.note.size() - 2)) << " |\n";
  std::cout << "\n**Kernel floor, same run** (after the workload, the client's sockets closed): "
            << floor.back_to_back.sockets << " loopback sockets, one `sendmsg` of a "
            << floor.back_to_back.frame_bytes << "-byte frame per socket per round; back to back "
            << f.floor_rounds << " rounds, best of 3: " << fixed(floor_us, 2)
            << " µs sender CPU per frame; at W2's cadence (5 rounds " << floor.cadence_ms
            << " ms apart, best of 2): " << fixed(cadence_us, 2) << " µs; load "
            << fixed(floor.load.start, 2) << " → " << fixed(floor.load.end, 2)
            << (floor.error.empty() ? "" : "; " + floor.error) << "\n";
  std::cout << "\n*Statements* are counted in PostgreSQL (rows the channel's functions logged "
               "in bench.calls): *while opening* from the first socket's connect to the last "
               "`subscribed`, *while writing* from the first write to the end of the drain. "
               "*Lost*: per sub, updates written to its key that it did not receive (each sub "
               "must receive its key's updates 1, 2, ... exactly once, in order). Per frame = "
               "replica CPU / (update + progress frames).\n";
  const bool ok = ran && failure.empty() && r.complete && r.check.lost == 0 &&
                  r.check.disorder == 0 && r.resyncs == 0 && r.subscribed == f.sockets * f.subs;
  return ok ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------
// Storm

namespace {
std::string codes(const GroupStats& s) {
  std::string out;
  for (const auto& [code, n] : s.close_codes)
    out += (out.empty() ? "" : ", ") + std::to_string(n) + "×" + std::to_string(code);
  return out.empty() ? "none" : out;
}
}  // namespace

int run_storm(const Flags& f) {
  const auto started = Steady::now();
  const double load_before = load_average();
  progress("starting PostgreSQL 15 and nats-server on loopback");
  Services services(f);
  std::string pg_version, failure, note;
  const int64_t subs = static_cast<int64_t>(f.sockets) * f.subs;
  // Figures
  int on_a = 0, reopened = 0, answered = 0;
  double open_a_s = 0, a_exit_s = 0, closed_s = 0, storm_ms = 0, b_cpu = 0;
  int a_status = 0;
  Calls opening_a, storm, after;
  double storm_metric = -1;
  GroupStats at_storm, at_end, before_reopen;
  Check check;
  Writes writes;
  bool complete = false;
  LoadWindow storm_load;
  std::string b_threads;
  try {
    services.setup();
    setup_shared_keys(services);
    pg_version = services.server_version();
    const json server = server_section(f);
    Replica a = services.start_replica("storm A", server, apps());
    Replica b = services.start_replica("storm B", server, apps(),
                                       f.ab_binary.empty() ? OUTLIVE_BINARY : f.ab_binary);

    const Calls calls0 = count_calls(services.db);
    Client client(f.client_threads, f.open_concurrency);
    const auto opening = Steady::now();
    open_sockets(client, f, a.port);
    GroupStats s = wait_subscribed(client, f.sockets, f.subs, 60 + f.sockets / 25.0);
    open_a_s = seconds_since(opening);
    on_a = static_cast<int>(s.subscribed);
    opening_a = count_calls(services.db) - calls0;
    progress("storm: " + std::to_string(on_a) + " of " + std::to_string(subs) +
             " subs subscribed on A in " + fixed(open_a_s, 1) + " s; " + opening_a.text());
    if (on_a < subs) throw std::runtime_error("not every sub was answered on A: " + s.first_error);

    // Updates flow from now until 3 s after the storm.
    services.settle();
    client.mark(kOutlive);
    const auto before = client.stats(kOutlive);
    std::atomic<bool> stop{false};
    WritePlan plan;
    plan.app = kApp;
    plan.keys = f.keys;
    plan.key_name = key_name;
    plan.rate = f.rate;
    plan.seconds = 0;
    plan.writers = 1;
    plan.batch_ms = std::max(f.batch_ms, static_cast<int>(1000 / std::max(1.0, f.rate)));
    plan.stop = &stop;
    std::thread writer([&] { writes = write_keyed_updates(services.db, plan, Steady::now()); });
    // A few updates delivered on A first (each sub's cursor then is an update's or a progress').
    std::this_thread::sleep_for(2s);

    // A stops: every socket is closed (1012).
    progress("storm: SIGTERM to A");
    const auto stopping = Steady::now();
    std::thread stopper([&] {
      a_status = a.process->stop(SIGTERM, 30s);
      a_exit_s = seconds_since(stopping);
    });
    const bool all_closed =
        wait_until([&] { return client.open_count(kOutlive, false) == 0; }, 30, 10ms);
    closed_s = seconds_since(stopping);
    stopper.join();
    if (!all_closed) note += "not every socket was closed by A within 30 s; ";

    // The storm: every socket to B at once, each sub from its cursor.
    before_reopen = client.stats(kOutlive);
    const Calls calls1 = count_calls(services.db);
    const double metric1 = b.metric(kAuthorizeMetric);
    const double b_cpu0 = cpu_of(b.pid());
    const auto b_threads0 = on_cpu_seconds_by_thread(b.pid());
    LoadSampler load;
    const int64_t reopen_us = wall_us();
    reopened = client.reopen(kOutlive, b.port, f.storm_jitter_ms);
    progress("storm: " + std::to_string(reopened) + " sockets reopening on B");
    // Every sub confirmed on an open socket (those closed by B, 1011, come back as the browser
    // client does: Loop::retry).
    wait_until([&] { return client.confirmed(kOutlive) >= subs; }, 60, 10ms);
    at_storm = client.stats(kOutlive);
    answered = static_cast<int>(client.confirmed(kOutlive));
    storm_ms = at_storm.last_subscribed_us > reopen_us
                   ? (at_storm.last_subscribed_us - reopen_us) / 1e3
                   : 0;
    b_cpu = cpu_of(b.pid()) - b_cpu0;
    b_threads = thread_cpu_since(b_threads0, on_cpu_seconds_by_thread(b.pid()));
    storm_load = load.stop();
    storm = count_calls(services.db) - calls1;
    storm_metric = b.metric(kAuthorizeMetric) - metric1;
    progress("storm: " + std::to_string(answered) + " of " + std::to_string(subs) +
             " subs answered on B, the last " + fixed(storm_ms, 0) + " ms after the reopen; " +
             storm.text());

    // Updates keep flowing 3 s, then every sub must hold every update of its key.
    std::this_thread::sleep_for(3s);
    stop = true;
    writer.join();
    if (!writes.error.empty()) note += "writer error: " + writes.error + "; ";
    const Calls calls2 = count_calls(services.db);
    complete = wait_drained(
                   [&] {
                     at_end = client.stats(kOutlive);
                     return at_end.updates - before.updates;
                   },
                   expected_frames(f, writes.written), f.drain_timeout, "update frame")
                   .complete;
    after = count_calls(services.db) - calls2;
    check = check_subs(client, writes.written);
    note += b.warnings_since(0);
    client.close_group(kOutlive);
    b.process->stop(SIGTERM, 10s);
  } catch (const std::exception& e) {
    failure = e.what();
    std::cerr << "keyed_bench: " << e.what() << "\n";
  }
  const double load_after = load_average();

  std::cout << header("reconnect storm", f, services, pg_version, load_before, load_after, started);
  std::cout << "- Load: two replicas A and B; " << f.sockets << " websocket sockets (API keys, "
            << "127.x.y.z, 4 per address), each with " << f.subs << " subs on distinct keys of "
            << f.keys << ", subscribed on A (" << fixed(open_a_s, 1) << " s; " << opening_a.text()
            << "); " << fixed(f.rate, 0) << " updates/s to random keys "
            << "throughout; A gets SIGTERM (exit status " << a_status << " after "
            << fixed(a_exit_s, 2) << " s, every socket closed after " << fixed(closed_s, 2)
            << " s), then every socket reopens on B "
            << (f.storm_jitter_ms > 0 ? "within " + std::to_string(f.storm_jitter_ms) + " ms"
                                      : std::string("at once"))
            << ", each sub with its last cursor (a socket B closes comes back after the browser "
               "client's backoff: uniform in [0, 500 ms × 2^attempt), at least 5 s after 1013); "
               "server "
            << server_section(f).dump() << "\n";
  if (!failure.empty()) std::cout << "- **Failed**: " << failure << "\n";
  std::cout << "\n| sockets × subs | reopened | **subs answered `subscribed` on B** | **reopen → "
               "last `subscribed`** | **statements on B: authorize (viewers per call) / keys** | "
               "replica's authorize count | **lost** (subs short) / out of order or twice | "
               "resync / errors / sockets closed or failed on B (reconnects) | B CPU s (reopen → "
               "last subscribed) | load |\n"
               "|---|---:|---:|---:|---|---:|---|---|---:|---|\n";
  std::cout << "| " << f.sockets << " × " << f.subs << " | " << reopened << " | **" << answered
            << " of " << subs << "** | **" << fixed(storm_ms, 0) << " ms** | **" << storm.text()
            << "** | " << fixed(storm_metric, 0) << " | **" << check.lost << "** ("
            << check.subs_short << ") / " << check.disorder << " | "
            << (at_end.resyncs - before_reopen.resyncs) << " / "
            << (at_end.errors - before_reopen.errors) << " / "
            << (at_end.closed + at_end.failed - before_reopen.closed - before_reopen.failed) << " ("
            << (at_end.retries - before_reopen.retries) << ") | " << fixed(b_cpu, 2) << " | "
            << fixed(storm_load.start, 2) << " → " << fixed(storm_load.end, 2) << " |\n";
  std::cout << "\nUpdates written: " << thousands(d(writes.total)) << " over "
            << fixed(writes.seconds, 1) << " s (before, during and 3 s after the storm); update "
            << "frames expected " << thousands(d(check.expected)) << ", received "
            << thousands(d(at_end.updates)) << (complete ? "" : " (**incomplete**)")
            << "; statements after the storm: " << after.text() << ". B's CPU by thread during "
            << "the storm: " << b_threads << ". Close codes over the run: " << codes(at_end)
            << (at_end.first_error.empty() ? "" : "; first error: " + at_end.first_error) << ".";
  if (!note.empty()) std::cout << " Notes: " << note.substr(0, note.size() - 2) << ".";
  std::cout << "\n\n*Reopen → last `subscribed`*: from the moment the client began reopening "
               "(every connect() issued at once unless --storm-jitter-ms) to the arrival of the "
               "last `subscribed` frame on B, once every sub is confirmed on an open socket "
               "(reconnects included). *Statements*: rows the channel's functions logged "
               "in PostgreSQL's bench.calls from the reopen to the last `subscribed` (reconnects "
               "included). *Lost*: per "
               "sub, updates written to its key (1, 2, ... across A and B) it never received; "
               "*out of order or twice*: an update whose number was not the previous one + 1.\n";
  const bool ok =
      failure.empty() && answered == subs && complete && check.lost == 0 && check.disorder == 0;
  return ok ? 0 : 1;
}

}  // namespace outlive::bench::keyed
