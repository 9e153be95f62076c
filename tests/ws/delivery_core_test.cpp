// The serving core of rev 2 end to end (issue 12; SPEC 1, 5.5, 5.7, 5.8): a slow authorize() of one
// key holds up only that key; a burst reaches fast and slow readers in order within bounded memory,
// a reader that takes nothing for 30 s is dropped 1013 and one that falls out of the window
// resyncs; pings drop a silent tab (1001) and keep a healthy one; re-checks never swallow a sub; a
// failed PREPARE does not poison its pool connection; the decision cache stays bounded and correct;
// under 3x overload memory stays bounded, every socket ends in order or resynced, and delivery
// recovers. Real in-process replicas on real PostgreSQL and nats-server, real websocket clients; no
// mocks, every wait has a deadline.
#include <poll.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <pqxx/pqxx>
#include <sstream>
#include <thread>

#include "config/config.hpp"
#include "replica/replica.hpp"
#include "support/frames.hpp"
#include "support/inventory.hpp"
#include "support/raw_ws.hpp"
#include "support/services.hpp"
#include "support/sql.hpp"
#include "support/ws_client.hpp"
#include "topic/client.hpp"
#include "topic/cursor.hpp"

using namespace outlive;
using namespace outlive::testing;
using namespace std::chrono_literals;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using Headers = std::vector<std::pair<std::string, std::string>>;

namespace {

// People crowd-0 .. crowd-<kPeople - 1> (sessions "crowd-<i>", viewer user:crowd<i>), t.members
// (key, subject) for channel "member", switches for channel "gated", and nothing of t.late: channel
// "late" names a table created by a test.
constexpr int kPeople = 5000;

const std::string kSchema = kInventoryTables + R"SQL(
INSERT INTO auth.sessions SELECT encode(sha256(('crowd-' || i)::bytea), 'hex'), 'user:crowd' || i,
  'user:crowd' || i, false, now() + interval '1 hour' FROM generate_series(0, )SQL" +
                            std::to_string(kPeople - 1) + R"SQL() i;
CREATE SCHEMA t;
CREATE TABLE t.flags (name text PRIMARY KEY, enabled boolean NOT NULL);
INSERT INTO t.flags VALUES ('slow', false);
CREATE SEQUENCE t.slow_shots;
CREATE TABLE t.auth_calls (n bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE t.members (key text NOT NULL, subject text NOT NULL, PRIMARY KEY (key, subject));
CREATE FUNCTION t.flag(f text) RETURNS boolean LANGUAGE sql VOLATILE AS $$ SELECT enabled FROM t.flags WHERE name = f $$;
-- authorize of channel "gated": the first check of key A after flag "slow" is set sleeps 5 s (a
-- sequence is not rolled back, so only that one check sleeps).
CREATE FUNCTION t.gate(k text) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF k = 'A' AND t.flag('slow') THEN
    IF nextval('t.slow_shots') = 1 THEN PERFORM pg_sleep(5); END IF;
  END IF;
  RETURN true;
END $$;
)SQL";

const json kKScope = {{"type", "object"},
                      {"properties", {{"k", {{"type", "string"}}}}},
                      {"required", {"k"}},
                      {"additionalProperties", false}};

const char* kEveryone = "SELECT v->>'id' AS id FROM jsonb_array_elements($2) v";

// `patch` is merged into the replica's config (RFC 7386), e.g. {"server": {...}}.
json config_json(const std::string& db, const std::string& nats, const json& patch) {
  json channels = {
      // Everyone may read key k.
      {"open", {{"scope", kKScope}, {"keys", "SELECT $1->>'k' AS key"}, {"authorize", kEveryone}}},
      {"tick",
       {{"scope", {{"type", "object"}}},
        {"keys", "SELECT 'tick' AS key"},
        {"authorize", kEveryone}}},
      // Everyone may read, but key A's first check after the flag sleeps 5 s.
      {"gated",
       {{"scope", kKScope},
        {"keys", "SELECT $1->>'k' AS key"},
        {"authorize", std::string(kEveryone) + " WHERE t.gate($1)"}}},
      // Members of key k (t.members).
      {"member",
       {{"scope", kKScope},
        {"keys", "SELECT $1->>'k' AS key"},
        {"authorize",
         "SELECT v->>'id' AS id FROM jsonb_array_elements($2) v JOIN t.members m ON m.key = $1 "
         "AND m.subject = v->>'accessSubject'"}}},
      // keys() reads t.late, which does not exist when the replica starts.
      {"late",
       {{"scope", kKScope},
        {"keys", "SELECT k AS key FROM t.late WHERE k = $1->>'k'"},
        {"authorize", kEveryone}}},
  };
  json c = inventory_replica_config(db, nats, "r1", channels);
  c.merge_patch(patch);
  return c;
}

std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    out += c;
    if (c == '\'') out += '\'';
  }
  return out + "'";
}

struct Fixture {
  explicit Fixture(const json& patch = json::object()) : db(fresh_database()) {
    sql(kSchema);
    replica = std::make_unique<replica::Replica>(config::parse(config_json(db, nats.url(), patch)));
    REQUIRE(eventually([&] { return http_get(port(), "/readyz").first == 200; }, 30s, 20ms));
  }

  int port() const { return replica->port(); }

  WsClient open(int person, int receive_buffer = 0) {
    return WsClient(port(), "/api/inventory/live",
                    {{"Cookie", "session=crowd-" + std::to_string(person)}}, "127.0.0.1",
                    receive_buffer);
  }

  void tx(const std::vector<std::string>& statements) { run_tx(db, statements); }
  void sql(const std::string& statement) { run_sql(db, statement); }
  int64_t scalar(const std::string& query) { return query_scalar(db, query); }

  std::string db;
  harness::EmbeddedNats nats;
  std::unique_ptr<replica::Replica> replica;
};

std::string publish_sql(const std::string& key, const json& data) {
  return "SELECT events.publish_live('inventory', " + quoted(key) + ", " + quoted(data.dump()) +
         "::jsonb)";
}
std::string access_sql(const std::string& key, const std::optional<json>& data = std::nullopt) {
  return "SELECT events.publish_live('inventory', " + quoted(key) + ", " +
         (data ? quoted(data->dump()) + "::jsonb" : std::string("NULL")) + ", true)";
}

json sub(const std::string& id, const std::string& channel, const json& scope = json::object()) {
  return {{"type", "sub"}, {"id", id}, {"channel", channel}, {"scope", scope}};
}

json subscribe(WsClient& ws, const json& message) {
  ws.send(message.dump());
  const json j = next_frame(ws, 15s);
  INFO(j.dump());
  REQUIRE(j["type"] == "subscribed");
  REQUIRE(j["id"] == message["id"]);
  return j;
}

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch())
      .count();
}
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[i];
}

long rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  }
  return 0;
}

// The number "n" of an update frame's data, read from its text ({"n":N} ends the data: nlohmann
// writes keys in order, "blob" < "n").
int64_t n_of(const std::string& text) {
  const auto at = text.rfind(R"("n":)");
  return at == std::string::npos ? -1 : std::strtoll(text.c_str() + at + 4, nullptr, 10);
}

const std::string kSockets = R"(outlive_sockets{app="inventory"})";
const std::string kClosed1001 = R"(outlive_socket_closes_total{code="1001"})";
const std::string kClosed1013 = R"(outlive_socket_closes_total{code="1013"})";
const std::string kDecisions = "outlive_access_decisions";

// What one reader of a stream of updates n = 1, 2, 3, ... of one key saw.
struct Tally {
  int64_t last = 0;
  int64_t updates = 0;
  int64_t out_of_order = 0;  // gaps or duplicates
  int64_t resyncs = 0;
  std::string resync_reason;
  int64_t after_resync = 0;  // updates received after a resync
  int close_code = -1;       // -1: open at the end
  std::string failure;
  std::string first_problem;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// 1. Keys (SPEC 5.8): a 5 s authorize() of key A holds up only key A

TEST_CASE(
    "isolation: while authorize of key A sleeps 5 s, 200 updates of key B arrive in order within "
    "100 ms p99, then A's arrive complete") {
  Fixture f;
  auto a = f.open(0);
  subscribe(a, sub("a", "gated", {{"k", "A"}}));
  std::vector<WsClient> bs;
  for (int i = 1; i <= 3; ++i) {
    bs.push_back(f.open(i));
    subscribe(bs.back(), sub("b", "gated", {{"k", "B"}}));
  }
  // Warm: both keys deliver and their decisions are cached.
  f.tx({publish_sql("A", {{"n", 0}}), publish_sql("B", {{"n", 0}})});
  CHECK(next_frame(a)["data"]["n"] == 0);
  for (auto& b : bs) CHECK(next_frame(b)["data"]["n"] == 0);

  // Control: B's latency on this machine, now, with nothing asleep. A loaded machine (a parallel
  // build) can push any latency past 100 ms; holding B up behind A's 5 s would push it past 1 s.
  std::vector<double> control_ms;
  for (int n = 1; n <= 100; ++n) {
    f.tx({publish_sql("B", {{"n", -n}, {"t", now_us()}})});
    for (auto& b : bs) {
      const json j = next_frame(b);
      REQUIRE(j["data"]["n"] == -n);
      control_ms.push_back(double(now_us() - j["data"]["t"].get<int64_t>()) / 1000.0);
    }
  }
  const double control_p99 = percentile(control_ms, 0.99);

  // The access update forgets A's decisions: the next check of A (before A's n = 1) sleeps 5 s.
  f.tx({"UPDATE t.flags SET enabled = true WHERE name = 'slow'", access_sql("A"),
        publish_sql("A", {{"n", 1}})});
  REQUIRE(eventually(
      [&] {
        return f.scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'") == 1;
      },
      5s, 5ms));
  const auto slow_started = Clock::now();

  // A's reader records when A's updates arrive.
  std::vector<int64_t> a_seen;
  Clock::time_point a_first_at{};
  int64_t a_first_us = 0;
  std::string a_failure;
  std::thread a_reader([&] {
    try {
      while (a_seen.size() < 5) {
        auto r = a.next(20s);
        if (r.timed_out || r.closed) {
          a_failure = r.closed ? "closed " + std::to_string(r.close_code) : "timed out";
          return;
        }
        const auto j = r.json();
        if (j["type"] == "progress") continue;
        if (j["type"] != "update") {
          a_failure = "unexpected " + r.text;
          return;
        }
        if (a_seen.empty()) {
          a_first_at = Clock::now();
          a_first_us = now_us();
        }
        a_seen.push_back(j["data"]["n"].get<int64_t>());
      }
    } catch (const std::exception& e) {
      a_failure = e.what();
    }
  });

  // B's readers: latency from just before the writer's transaction to receipt.
  constexpr int kB = 200;
  std::vector<std::vector<double>> latency_ms(bs.size());
  std::vector<std::vector<int64_t>> b_seen(bs.size());
  std::vector<std::vector<std::pair<int64_t, int64_t>>> b_times(bs.size());  // written, read (µs)
  std::vector<std::string> b_failure(bs.size());
  std::vector<Clock::time_point> b_done_at(bs.size());
  std::vector<std::thread> b_readers;
  for (size_t i = 0; i < bs.size(); ++i) {
    b_readers.emplace_back([&, i] {
      try {
        while (b_seen[i].size() < kB) {
          auto r = bs[i].next(20s);
          if (r.timed_out || r.closed) {
            b_failure[i] = r.closed ? "closed " + std::to_string(r.close_code) : "timed out";
            return;
          }
          const auto j = r.json();
          if (j["type"] == "progress") continue;
          if (j["type"] != "update") {
            b_failure[i] = "unexpected " + r.text;
            return;
          }
          const int64_t read_us = now_us(), written_us = j["data"]["t"].get<int64_t>();
          latency_ms[i].push_back(double(read_us - written_us) / 1000.0);
          b_times[i].emplace_back(written_us, read_us);
          b_seen[i].push_back(j["data"]["n"].get<int64_t>());
        }
        b_done_at[i] = Clock::now();
      } catch (const std::exception& e) {
        b_failure[i] = e.what();
      }
    });
  }
  // The writer: 200 updates of B, one transaction each, and A's n = 2..5 among them.
  for (int n = 1; n <= kB; ++n) {
    std::vector<std::string> st{publish_sql("B", {{"n", n}, {"t", now_us()}})};
    if (n % 50 == 0) st.push_back(publish_sql("A", {{"n", 1 + n / 50}}));
    f.tx(st);
  }
  const double wrote_in = seconds_since(slow_started);
  for (auto& t : b_readers) t.join();
  const double b_done = seconds_since(slow_started);
  a_reader.join();

  // B was served while A's check slept: every update of B written well before A's first update
  // (half a second before it) was read before it. How many that is depends on how fast this
  // machine lets the writer go, not on the replica.
  int64_t b_before_a = 0, b_late = 0;
  for (const auto& times : b_times) {
    for (const auto& [written_us, read_us] : times) {
      if (a_first_us == 0 || written_us >= a_first_us - 500'000) continue;
      ++b_before_a;
      if (read_us >= a_first_us) ++b_late;
    }
  }
  std::vector<double> all;
  for (size_t i = 0; i < bs.size(); ++i) {
    INFO("B socket " << i);
    CHECK(b_failure[i].empty());
    std::vector<int64_t> expected(kB);
    for (int n = 0; n < kB; ++n) expected[n] = n + 1;
    CHECK(b_seen[i] == expected);
    all.insert(all.end(), latency_ms[i].begin(), latency_ms[i].end());
  }
  const double p50 = percentile(all, 0.50), p99 = percentile(all, 0.99);
  const double a_first = a_first_at == Clock::time_point{}
                             ? -1
                             : std::chrono::duration<double>(a_first_at - slow_started).count();
  WARN("isolation: 200 updates of B written in "
       << wrote_in << " s, all read " << b_done << " s after A's check began sleeping; B p50 "
       << p50 << " ms, p99 " << p99 << " ms, max " << percentile(all, 1.0)
       << " ms; A's first update arrived after " << a_first << " s; control p99 " << control_p99
       << " ms; " << b_before_a << " reads of B written before A's first update, " << b_late
       << " of them read after it");
  // Under 100 ms (the target); on a machine too busy for that, no slower than B with nothing
  // asleep.
  CHECK(p99 < std::max(100.0, 3 * control_p99));
  CHECK(b_before_a >= 3 * 20);  // at least 20 updates of B written during the sleep
  CHECK(b_late == 0);
  CHECK(a_failure.empty());
  CHECK(a_seen == std::vector<int64_t>{1, 2, 3, 4, 5});
  CHECK(a_first > 4.0);  // A waited for its check: its updates keep their place behind it
}

// ---------------------------------------------------------------------------------------------
// 2. Readers and memory (SPEC 5.7 catching up, 5.8): a burst of 30 KB updates

namespace {

constexpr int kBurstUpdates = 1400;  // 28 transactions of 50, one a second (42 MB)

// Reads `ws` until update kBurstUpdates, a close, or the deadline. `pace` > 0 throttles to that
// many bytes per second; `pause` reads nothing at first.
void read_burst(WsClient& ws, Tally& t, double pace, std::chrono::milliseconds pause,
                Clock::time_point deadline) {
  if (pause.count() > 0) std::this_thread::sleep_for(pause);
  const auto start = Clock::now();
  double bytes = 0;
  try {
    while (t.last < kBurstUpdates) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        t.failure = "deadline after update " + std::to_string(t.last);
        return;
      }
      auto r = ws.next(left);
      if (r.timed_out) {
        t.failure = "timed out after update " + std::to_string(t.last);
        return;
      }
      if (r.closed) {
        t.close_code = r.close_code;
        t.failure =
            "closed " + std::to_string(r.close_code) + " after update " + std::to_string(t.last);
        return;
      }
      const std::string& s = r.text;
      bytes += double(s.size());
      if (s.find(R"("type":"update")") != std::string::npos) {
        // Every update follows the last, except the first after a resync (live from the head).
        const int64_t n = n_of(s);
        const bool first_after_resync = t.resyncs > 0 && t.after_resync == 0;
        if (first_after_resync ? n <= t.last : n != t.last + 1) {
          ++t.out_of_order;
          if (t.first_problem.empty())
            t.first_problem = "got " + std::to_string(n) + " after " + std::to_string(t.last);
        }
        if (t.resyncs > 0) ++t.after_resync;
        t.last = n;
        ++t.updates;
      } else if (s.find(R"("type":"resync")") != std::string::npos) {
        ++t.resyncs;
        t.resync_reason = json::parse(s).value("reason", "");
      } else if (s.find(R"("type":"progress")") == std::string::npos) {
        if (t.first_problem.empty()) t.first_problem = "unexpected " + s.substr(0, 200);
        ++t.out_of_order;
      }
      if (pace > 0) {
        const auto due = start + std::chrono::microseconds(int64_t(bytes / pace * 1e6));
        std::this_thread::sleep_until(due);
      }
    }
  } catch (const std::exception& e) {
    t.failure = e.what();
  }
}

}  // namespace

TEST_CASE(
    "burst: 1400 updates of 30 KB reach 50 fast and 5 slow readers in order within 200 MiB, a "
    "reader that takes nothing is closed 1013 and one that falls out of the window resyncs") {
  Fixture f;
  const json scope = {{"k", "burst"}};
  constexpr int kFast = 50, kSlow = 5;
  std::vector<WsClient> fast, slow;
  for (int i = 0; i < kFast; ++i) {
    fast.push_back(f.open(i));
    subscribe(fast.back(), sub("w", "open", scope));
  }
  for (int i = 0; i < kSlow; ++i) {
    slow.push_back(f.open(100 + i, 64 * 1024));
    subscribe(slow.back(), sub("w", "open", scope));
  }
  // Reads nothing at all; and one that reads nothing for 25 s (past the window), then at full
  // speed.
  auto dead = f.open(200, 4096);
  subscribe(dead, sub("w", "open", scope));
  auto behind = f.open(201, 4096);
  subscribe(behind, sub("w", "open", scope));
  REQUIRE(metric(f.port(), kSockets) == kFast + kSlow + 2);
  const double closed_1013_before = metric_or_zero(f.port(), kClosed1013);
  const long rss_before = rss_kib();

  const auto start = Clock::now();
  const auto deadline = start + 120s;
  std::vector<Tally> fast_t(kFast), slow_t(kSlow);
  Tally behind_t;
  std::vector<std::thread> readers;
  constexpr int kFastThreads = 10;
  for (int th = 0; th < kFastThreads; ++th) {
    readers.emplace_back([&, th] {
      // Round-robin over this thread's sockets, one frame at a time, until all are done.
      std::vector<int> mine;
      for (int i = th; i < kFast; i += kFastThreads) mine.push_back(i);
      bool any = true;
      while (any) {
        any = false;
        for (int i : mine) {
          Tally& t = fast_t[i];
          if (t.last >= kBurstUpdates || !t.failure.empty()) continue;
          any = true;
          auto r = fast[i].next(15s);  // one frame
          if (r.timed_out || r.closed) {
            t.close_code = r.closed ? r.close_code : -1;
            t.failure = (r.closed ? "closed " + std::to_string(r.close_code) : "timed out") +
                        " after update " + std::to_string(t.last);
            continue;
          }
          const std::string& s = r.text;
          if (s.find(R"("type":"update")") != std::string::npos) {
            const int64_t n = n_of(s);
            if (n != t.last + 1) {
              ++t.out_of_order;
              if (t.first_problem.empty())
                t.first_problem = "got " + std::to_string(n) + " after " + std::to_string(t.last);
            }
            t.last = n;
            ++t.updates;
          } else if (s.find(R"("type":"progress")") == std::string::npos) {
            ++t.out_of_order;
            if (t.first_problem.empty()) t.first_problem = "unexpected " + s.substr(0, 200);
          }
        }
      }
    });
  }
  for (int i = 0; i < kSlow; ++i)
    readers.emplace_back(
        [&, i] { read_burst(slow[i], slow_t[i], 1024.0 * 1024.0, 0ms, deadline); });
  readers.emplace_back([&] { read_burst(behind, behind_t, 0, 25s, deadline); });

  // 28 transactions of 50 updates, one a second; RSS sampled meanwhile.
  std::atomic<long> rss_max{rss_before};
  std::atomic<bool> writing{true};
  std::thread sampler([&] {
    while (writing) {
      rss_max = std::max(rss_max.load(), rss_kib());
      std::this_thread::sleep_for(100ms);
    }
  });
  std::optional<double> dead_closed_at;
  for (int t = 0; t < kBurstUpdates / 50; ++t) {
    std::this_thread::sleep_until(start + std::chrono::seconds(t));
    pqxx::connection c(f.db);
    pqxx::work w(c);
    w.exec(
        "SELECT events.publish_live('inventory', 'burst', jsonb_build_object('n', i, 'blob', "
        "repeat('x', 30000))) FROM generate_series(" +
        std::to_string(t * 50 + 1) + ", " + std::to_string(t * 50 + 50) + ") i");
    w.commit();
    pqxx::nontransaction(c).exec("SELECT events.wake('inventory')");
  }
  const double wrote_in = seconds_since(start);
  // The reader that takes nothing: 30 s after the kernel stopped taking its bytes (at the start).
  REQUIRE(eventually(
      [&] {
        rss_max = std::max(rss_max.load(), rss_kib());
        return metric_or_zero(f.port(), kClosed1013) >= closed_1013_before + 1;
      },
      45s, 50ms));
  dead_closed_at = seconds_since(start);
  // Its connection is gone (the 1013 frame itself may not have fitted in its full buffers).
  bool dead_ended = false;
  for (;;) {
    auto r = dead.next(5s);
    if (r.timed_out) break;
    if (r.closed) {
      dead_ended = true;
      break;
    }
  }
  CHECK(dead_ended);
  for (auto& r : readers) r.join();
  writing = false;
  sampler.join();
  const double read_in = seconds_since(start);

  int fast_ok = 0, slow_ok = 0;
  for (int i = 0; i < kFast; ++i) {
    INFO("fast reader " << i << ": " << fast_t[i].failure << " " << fast_t[i].first_problem);
    CHECK(fast_t[i].failure.empty());
    CHECK(fast_t[i].out_of_order == 0);
    CHECK(fast_t[i].updates == kBurstUpdates);
    fast_ok += (fast_t[i].failure.empty() && fast_t[i].out_of_order == 0 &&
                fast_t[i].updates == kBurstUpdates);
  }
  for (int i = 0; i < kSlow; ++i) {
    INFO("slow reader " << i << ": " << slow_t[i].failure << " " << slow_t[i].first_problem);
    CHECK(slow_t[i].failure.empty());
    CHECK(slow_t[i].out_of_order == 0);
    CHECK(slow_t[i].resyncs == 0);
    CHECK(slow_t[i].updates == kBurstUpdates);
    slow_ok += (slow_t[i].failure.empty() && slow_t[i].out_of_order == 0 &&
                slow_t[i].updates == kBurstUpdates && slow_t[i].resyncs == 0);
  }
  {
    INFO("the reader behind the window: " << behind_t.failure << " " << behind_t.first_problem);
    CHECK(behind_t.failure.empty());
    CHECK(behind_t.close_code == -1);
    CHECK(behind_t.resyncs >= 1);
    CHECK(behind_t.resync_reason == "window");
    CHECK(behind_t.after_resync > 0);  // live again after the resync
    CHECK(behind_t.last == kBurstUpdates);
  }
  // Only the reader that took nothing was closed.
  CHECK(metric_or_zero(f.port(), kClosed1013) == closed_1013_before + 1);
  CHECK(eventually([&] { return metric(f.port(), kSockets) == kFast + kSlow + 1; }, 5s, 20ms));
  WARN("burst: " << kBurstUpdates << " x 30 KB written in " << wrote_in << " s, all read in "
                 << read_in << " s; fast ok " << fast_ok << "/" << kFast << ", slow ok " << slow_ok
                 << "/" << kSlow << "; behind: " << behind_t.updates << " updates, "
                 << behind_t.resyncs << " resync (" << behind_t.resync_reason << "), "
                 << behind_t.after_resync << " after it; silent reader closed 1013 at "
                 << *dead_closed_at << " s; RSS " << rss_before / 1024 << " MiB before, max "
                 << rss_max.load() / 1024 << " MiB (test process: replica + clients)");
  CHECK(rss_max.load() < 200 * 1024);
}

TEST_CASE(
    "burst: a reader at 64 KiB/s that falls out of the window is resynced once, to a cursor the "
    "window still holds when the frame arrives") {
  // Issue 47: 12,000 updates of 2 KiB in a few seconds to one key. The resync was decided when
  // the pass fell behind but queued behind 512 KiB for the tab (8 s at 64 KiB/s); by the time it
  // arrived its cursor had left the window, so the tab reloaded twice and a fresh socket with
  // that cursor was told resync as well.
  Fixture f;
  constexpr int kUpdates = 12000;
  auto reader = f.open(300, 64 * 1024);
  subscribe(reader, sub("w", "open", {{"k", "flood"}}));

  std::mutex mutex;
  std::vector<std::string> resync_cursors;  // in arrival order
  int64_t last = 0, after_resync = 0;
  std::string failure;
  std::atomic<bool> resynced{false};
  std::thread reading([&] {
    const auto start = Clock::now();
    const auto deadline = start + 150s;
    double bytes = 0;
    for (;;) {
      auto r = reader.next(
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
      std::unique_lock lock(mutex);
      if (r.timed_out || r.closed) {
        failure = (r.closed ? "closed " + std::to_string(r.close_code) : "timed out") +
                  " after update " + std::to_string(last);
        return;
      }
      bytes += double(r.text.size());
      const auto j = json::parse(r.text);
      const std::string type = j.value("type", "");
      if (type == "resync") {
        resync_cursors.push_back(j.value("cursor", ""));
        if (j.value("reason", "") != "window") failure = "resync " + j.value("reason", "");
        resynced = true;
      } else if (type == "update") {
        const int64_t n = j["data"]["n"].get<int64_t>();
        // In order, except the first after a resync (live from its cursor).
        if (resync_cursors.empty() || after_resync > 0 ? n != last + 1 : n <= last)
          failure = "got " + std::to_string(n) + " after " + std::to_string(last);
        if (!resync_cursors.empty()) ++after_resync;
        last = n;
        if (n == kUpdates + 1 || !failure.empty()) return;
      }
      lock.unlock();
      std::this_thread::sleep_until(start +
                                    std::chrono::microseconds(int64_t(bytes / 65536.0 * 1e6)));
    }
  });
  const auto start = Clock::now();
  for (int b = 0; b < kUpdates / 1000; ++b) {
    f.tx({"SELECT events.publish_live('inventory', 'flood', jsonb_build_object('n', i, 'blob', "
          "repeat('x', 2000))) FROM generate_series(" +
          std::to_string(b * 1000 + 1) + ", " + std::to_string(b * 1000 + 1000) + ") i"});
  }
  const double wrote_in = seconds_since(start);
  REQUIRE(eventually([&] { return resynced.load(); }, 120s, 20ms));
  std::string first;
  {
    std::lock_guard lock(mutex);
    first = resync_cursors.front();
  }
  // Asked once the burst is in the window: the head of the resync must still be there.
  json back = sub("b", "open", {{"k", "flood"}});
  back["cursor"] = first;
  auto fresh = f.open(301);
  fresh.send(back.dump());
  const auto answer = next_frame(fresh, 15s);
  INFO(answer.dump());
  CHECK(answer["type"] == "subscribed");

  f.tx({publish_sql("flood", {{"n", kUpdates + 1}})});
  reading.join();
  const double read_in = seconds_since(start);
  INFO(failure);
  CHECK(failure.empty());
  CHECK(last == kUpdates + 1);
  CHECK(resync_cursors.size() == 1);  // the tab reloads once
  WARN(kUpdates << " x 2 KiB written in " << wrote_in << " s; the 64 KiB/s reader had "
                << resync_cursors.size() << " resync, " << after_resync
                << " updates after it, done in " << read_in << " s");
}

// ---------------------------------------------------------------------------------------------
// 3. Liveness (SPEC 5.7 rev 2): pings every second, silence for 3 s drops the tab with 1001

TEST_CASE(
    "liveness: a tab that never answers pings is dropped with 1001 within 4 s and a tab that "
    "answers stays 30 s") {
  Fixture f(json{{"server", {{"ping_interval_ms", 1000}, {"idle_timeout_ms", 3000}}}});
  const double closed_1001_before = metric_or_zero(f.port(), kClosed1001);

  // A raw tab that sends nothing and never answers a ping.
  const auto opened = Clock::now();
  RawWs silent(f.port(), "/api/inventory/live", "Cookie: session=crowd-0\r\n");
  REQUIRE(eventually([&] { return metric(f.port(), kSockets) == 1; }, 5s, 10ms));
  int pings = 0;
  std::optional<uint16_t> close_code;
  while (!silent.eof()) {
    auto frame = silent.next(6s);
    if (!frame) break;
    if (frame->opcode == 0x9) ++pings;
    if (frame->opcode == 0x8) close_code = frame->close_code();
  }
  const bool dropped = silent.eof() || silent.wait_eof(1s);
  const double dropped_after = seconds_since(opened);
  CHECK(dropped);
  CHECK(pings >= 2);  // at 1 s and 2 s
  CHECK(close_code == std::optional<uint16_t>(1001));
  CHECK(dropped_after >= 2.9);
  CHECK(dropped_after < 4.0);
  CHECK(eventually([&] { return metric(f.port(), kSockets) == 0; }, 2s, 10ms));
  CHECK(metric_or_zero(f.port(), kClosed1001) == closed_1001_before + 1);

  // A healthy tab (Beast answers pings while it reads) and one receiving updates steadily (it
  // sends nothing after its sub but pongs). Both are read from here on.
  auto healthy = f.open(1);
  auto receiver = f.open(2);
  subscribe(receiver, sub("s", "open", {{"k", "steady"}}));

  // 30 s: the healthy tab reads (answering pings) and the receiver gets an update every 200 ms.
  std::atomic<bool> stop{false};
  std::atomic<int64_t> written{0};
  std::string writer_failure;
  std::thread writer([&] {
    try {
      int n = 1;
      for (; !stop; ++n) {
        f.tx({publish_sql("steady", {{"n", n}})});
        written = n;
        std::this_thread::sleep_for(200ms);
      }
      f.tx({publish_sql("steady", {{"n", n}, {"end", true}})});  // the reader stops at it
    } catch (const std::exception& e) {
      writer_failure = e.what();
    }
  });
  int64_t received = 0;
  std::string receiver_failure;
  const auto phase = Clock::now();
  std::thread reader([&] {
    // Until the writer's last update (a read that times out would abandon the socket).
    for (bool end = false; !end;) {
      auto r = receiver.next(5s);
      if (r.timed_out || r.closed) {
        receiver_failure =
            (r.closed ? "closed " + std::to_string(r.close_code) : "timed out") + " after " +
            std::to_string(received) + " of " + std::to_string(written.load()) + " updates, stop " +
            std::to_string(stop.load()) + ", at " + std::to_string(seconds_since(phase)) + " s";
        return;
      }
      const auto j = r.json();
      if (j["type"] == "update") {
        CHECK(j["data"]["n"] == received + 1);
        ++received;
        end = j["data"].value("end", false);
      }
    }
  });
  const auto r = healthy.next(30s);  // nothing is sent to it but pings
  stop = true;
  writer.join();
  reader.join();
  INFO("receiver: " << receiver_failure << "; writer: " << writer_failure);
  CHECK(r.timed_out);  // not closed
  CHECK_FALSE(r.closed);
  CHECK(receiver_failure.empty());
  CHECK(writer_failure.empty());
  CHECK(received > 100);
  CHECK(metric(f.port(), kSockets) == 2);
  CHECK(metric_or_zero(f.port(), kClosed1001) == closed_1001_before + 1);
  WARN("liveness: silent tab dropped after "
       << dropped_after << " s (" << pings << " pings, close " << close_code.value_or(0)
       << "); healthy and receiving tabs stayed 30 s, " << received << " updates received");
}

// ---------------------------------------------------------------------------------------------
// 4. Re-checks racing subs (SPEC 5.5 rev 2): every sub is answered

TEST_CASE(
    "re-check racing subs: with a 1 s credential re-check taking 100 ms, 200 subs on 20 sockets "
    "are all answered") {
  // The session query takes 100 ms, so re-checks (every second on each socket) overlap the subs.
  json auth = inventory_auth(1);
  // Every lookup is logged in t.auth_calls.
  auth["sessions"] =
      "WITH logged AS (INSERT INTO t.auth_calls DEFAULT VALUES RETURNING 1) "
      "SELECT subject, actor, NULL::text[] AS scopes, app_session FROM auth.sessions, "
      "(SELECT pg_sleep(0.1)) nap, logged WHERE token_sha256 = $1 AND expires_at > now()";
  Fixture f(json{{"auth", auth}});
  constexpr int kSocketsN = 20, kSubs = 10;
  std::vector<WsClient> ws;
  for (int s = 0; s < kSocketsN; ++s) ws.push_back(f.open(s));
  const auto start = Clock::now();
  const int64_t lookups_before = f.scalar("SELECT count(*) FROM t.auth_calls");
  int answered = 0, subscribed = 0, errors = 0;
  std::vector<std::string> problems;
  // Rounds: every socket sends one sub (a distinct id and key), then the answers are read; the
  // rounds last over 3 s, so every socket re-checks its credential several times meanwhile.
  for (int k = 0; k < kSubs; ++k) {
    for (int s = 0; s < kSocketsN; ++s) {
      const std::string id = "s" + std::to_string(k);
      // Odd rounds on a fresh key (authorize runs), even rounds on a shared one.
      const std::string key = k % 2 ? "k" + std::to_string(s) + "-" + std::to_string(k) : "shared";
      ws[s].send(sub(id, "open", {{"k", key}}).dump());
    }
    for (int s = 0; s < kSocketsN; ++s) {
      const std::string id = "s" + std::to_string(k);
      auto r = ws[s].next(15s);
      while (!r.timed_out && !r.closed && r.json()["type"] == "progress") r = ws[s].next(15s);
      if (r.timed_out || r.closed) {
        problems.push_back("socket " + std::to_string(s) + " sub " + id + ": " +
                           (r.closed ? "closed " + std::to_string(r.close_code) : "no answer"));
        continue;
      }
      const auto j = r.json();
      ++answered;
      if (j["type"] == "subscribed" && j["id"] == id) {
        ++subscribed;
      } else if (j["type"] == "error" && j.value("id", "") == id) {
        ++errors;
      } else {
        problems.push_back("socket " + std::to_string(s) + " sub " + id + ": " + j.dump());
      }
    }
    std::this_thread::sleep_for(350ms);
  }
  const double took = seconds_since(start);
  const int64_t rechecks = f.scalar("SELECT count(*) FROM t.auth_calls") - lookups_before;
  // The re-checks did run meanwhile and the sockets are still served.
  CHECK(metric(f.port(), kSockets) == kSocketsN);
  WARN("re-check racing subs: " << answered << " of " << kSocketsN * kSubs << " answered ("
                                << subscribed << " subscribed, " << errors << " errors) in " << took
                                << " s, with " << rechecks << " credential re-checks meanwhile");
  for (const auto& p : problems) UNSCOPED_INFO(p);
  CHECK(problems.empty());
  CHECK(answered == kSocketsN * kSubs);
  CHECK(subscribed == kSocketsN * kSubs);
  CHECK(took > 3.0);  // spans at least 3 re-checks per socket
  CHECK(rechecks >= kSocketsN * 2);
}

// ---------------------------------------------------------------------------------------------
// 5. A PREPARE that fails once (SPEC 5.8, db pool)

TEST_CASE(
    "a keys query whose table is missing fails the sub and once the table exists a new socket's "
    "sub "
    "succeeds on the same pool connection") {
  Fixture f(json{{"server", {{"db_pool_size", 1}}}});
  auto first = f.open(0);
  first.send(sub("l", "late", {{"k", "x"}}).dump());
  const auto answer = first.next(15s);
  REQUIRE_FALSE(answer.timed_out);
  if (answer.closed) {
    CHECK(answer.close_code == 1011);
  } else {
    const auto j = answer.json();
    INFO(j.dump());
    CHECK(j["type"] == "error");
    if (j["type"] == "error") {
      const int code = first.wait_closed(15s);
      CHECK((code == 1011 || code == 0));
      WARN("failing keys(): error " << j.dump() << ", then close " << code);
    }
  }
  f.sql("CREATE TABLE t.late (k text); INSERT INTO t.late VALUES ('x')");
  // The same (only) pool connection serves the credential lookup, keys() and authorize() now.
  auto second = f.open(1);
  subscribe(second, sub("l", "late", {{"k", "x"}}));
  subscribe(second, sub("o", "open", {{"k", "y"}}));
  f.tx({publish_sql("x", {{"n", 1}})});
  const auto u = next_frame(second);
  CHECK(u["type"] == "update");
  CHECK(u["ids"] == json{"l"});
  CHECK(u["data"]["n"] == 1);
  // And a third socket, to be sure the statement is prepared for good.
  auto third = f.open(2);
  subscribe(third, sub("l", "late", {{"k", "x"}}));
}

// ---------------------------------------------------------------------------------------------
// 6. The decision cache (SPEC 5.5 rev 2): bounded by access.max_decisions, still correct

TEST_CASE(
    "decision cache bounded at 1000: 5000 viewers subscribe over time, every one is served "
    "correctly and revoked ones are revoked") {
  Fixture f(json{{"access", {{"max_decisions", 1000}}}});
  const std::string key = "G";
  const json scope = {{"k", key}};
  // Members of G: every person except those whose number ends in 7.
  f.sql("INSERT INTO t.members SELECT 'G', 'user:crowd' || i FROM generate_series(0, " +
        std::to_string(kPeople - 1) + ") i WHERE i % 10 <> 7");
  constexpr int kRound = 500, kRounds = kPeople / kRound, kKeep = 50;
  struct Keeper {
    int person;
    WsClient ws;
  };
  std::vector<Keeper> keepers;  // 50 of every round stay open to the end
  double max_decisions = 0;
  int refused = 0;
  const auto start = Clock::now();
  for (int r = 0; r < kRounds; ++r) {
    INFO("round " << r);
    std::vector<std::pair<int, WsClient>> round;
    for (int i = 0; i < kRound; ++i) {
      const int person = r * kRound + i;
      round.emplace_back(person, f.open(person));
      round.back().second.send(sub("g", "member", scope).dump());
      round.back().second.send(sub("t", "tick").dump());
    }
    for (auto& [person, ws] : round) {
      INFO("person " << person);
      const auto j = next_frame(ws, 20s);
      if (person % 10 == 7) {
        CHECK(j["type"] == "error");
        CHECK(j["code"] == "not_found");
        ++refused;
      } else {
        CHECK(j["type"] == "subscribed");
        CHECK(j["id"] == "g");
      }
      CHECK(next_frame(ws, 20s)["type"] == "subscribed");  // t
    }
    // One update of G: every member's socket open now (this round and the keepers) receives it.
    f.tx({publish_sql(key, {{"n", r}})});
    for (auto& [person, ws] : round) {
      if (person % 10 == 7) continue;
      INFO("person " << person);
      const auto j = next_frame(ws, 20s);
      CHECK(j["type"] == "update");
      CHECK(j["data"]["n"] == r);
    }
    for (auto& k : keepers) {
      if (k.person % 10 == 7) continue;
      INFO("keeper " << k.person);
      const auto j = next_frame(k.ws, 20s);
      CHECK(j["type"] == "update");
      CHECK(j["data"]["n"] == r);
    }
    const double d = metric(f.port(), kDecisions);
    max_decisions = std::max(max_decisions, d);
    CHECK(d <= 1000);
    for (int i = 0; i < kKeep; ++i) {
      keepers.push_back(Keeper{round[i].first, std::move(round[i].second)});
    }
  }
  const double subs_took = seconds_since(start);
  // The keepers' decisions were evicted long ago. Half the members among them lose G with an
  // access update; then data of G and a marker on tick.
  std::vector<std::string> statements;
  for (const auto& k : keepers) {
    if (k.person % 2 == 0)
      statements.push_back("DELETE FROM t.members WHERE key = 'G' AND subject = 'user:crowd" +
                           std::to_string(k.person) + "'");
  }
  statements.push_back(access_sql(key, json{{"phase", "access"}}));
  statements.push_back(publish_sql(key, {{"phase", "after"}}));
  f.tx(statements);
  f.tx({publish_sql("tick", {{"phase", "marker"}})});
  int kept = 0, revoked = 0;
  for (auto& k : keepers) {
    INFO("keeper " << k.person);
    if (k.person % 10 == 7) {  // never subscribed to G: only the marker
      const auto j = next_frame(k.ws, 20s);
      CHECK(j["key"] == "tick");
      continue;
    }
    // Order holds per key, not across keys: G waits for its authorize() after the access update
    // while the marker of "tick" may go out first (SPEC 5.8). Reads `n` frames: G's, and the ticks.
    const auto read_split = [&](int n) {
      std::pair<std::vector<json>, int> out;  // G's frames in order, ticks
      for (int i = 0; i < n; ++i) {
        const auto j = next_frame(k.ws, 20s);
        if (j.value("key", "") == "tick") {
          ++out.second;
        } else {
          out.first.push_back(j);
        }
      }
      return out;
    };
    if (k.person % 2 == 0) {
      const auto [of_g, ticks] = read_split(2);
      CHECK(ticks == 1);
      REQUIRE(of_g.size() == 1);  // nothing of G after the access update but the revocation
      CHECK(of_g[0]["type"] == "revoked");
      CHECK(of_g[0]["id"] == "g");
      ++revoked;
    } else {
      const auto [of_g, ticks] = read_split(3);
      CHECK(ticks == 1);
      REQUIRE(of_g.size() == 2);
      CHECK(of_g[0]["data"] == json{{"phase", "access"}});
      CHECK(of_g[1]["data"] == json{{"phase", "after"}});
      ++kept;
    }
  }
  const double d = metric(f.port(), kDecisions);
  max_decisions = std::max(max_decisions, d);
  CHECK(d <= 1000);
  CHECK(d > 0);
  WARN("decision cache: " << kPeople << " viewers subscribed in " << subs_took << " s (" << refused
                          << " refused as non-members), " << keepers.size()
                          << " kept open: " << kept << " kept access, " << revoked
                          << " revoked; outlive_access_decisions max " << max_decisions
                          << ", at the end " << d);
}

// ---------------------------------------------------------------------------------------------
// 7. Overload (SPEC 1 "bounded" and "no silent gap", 5.7 catching up, 5.8 memory): updates offered
// at 3x what the replica delivers, for 30 s

namespace {

// What one full-speed reader of updates n = 1, 2, 3, ... of one key saw (its counters are read
// while it runs). Every update follows the last, or, after a `resync`, is the one right after the
// resync's cursor: the only key of the app's topic is this one, so topic positions and n advance
// together (position - n is the same for every update).
struct FloodTally {
  std::atomic<int64_t> last{0};
  // The update it is at: its last, or the one a resync's cursor points at (nothing up to that one
  // will come: the next is the one after it).
  std::atomic<int64_t> reached{0};
  std::atomic<int64_t> updates{0};
  std::atomic<bool> done{false};  // stopped: reached the target or failed
  int64_t offset = INT64_MIN;     // position - n
  int64_t out_of_order = 0;
  int64_t resyncs = 0;
  int64_t other_reasons = 0;  // resyncs whose reason is not "window"
  int64_t skipped_by_resyncs = 0;
  std::optional<uint64_t> resync_at;  // the cursor of a resync no update followed yet
  int close_code = -1;                // -1: open at the end
  std::string failure;
  std::string first_problem;
  Clock::time_point target_at{};  // when the target update arrived
  double longest_wait = 0;        // the longest it waited for a frame while behind (s)
  bool waiting = false;           // behind the target, nothing to read since wait_start
  Clock::time_point wait_start{};
  Clock::time_point longest_wait_end{};
  int64_t longest_wait_after = 0;  // the update before it
  void problem(const std::string& p) {
    ++out_of_order;
    if (first_problem.empty()) first_problem = p;
  }
};

std::optional<uint64_t> cursor_position_in(const std::string& frame) {
  const auto at = frame.find(R"("cursor":")");
  if (at == std::string::npos) return std::nullopt;
  const auto from = at + 10;
  const auto to = frame.find('"', from);
  if (to == std::string::npos) return std::nullopt;
  const auto c = topic::Cursor::decode(std::string_view(frame).substr(from, to - from));
  if (!c) return std::nullopt;
  return c->position;
}

// A frame of a full-speed reader, if one is there; false when none was. It never blocks: a socket
// that has everything sent so far must not keep its thread from the others (they would stall,
// and their pings go unanswered). A socket behind `target` that receives nothing for 60 s fails.
// No Catch assertions here: it runs on a reader thread.
bool read_one(WsClient& ws, FloodTally& t, int64_t target) {
  try {
    auto r = ws.poll(0ms);
    const auto now = Clock::now();
    if (r.timed_out) {
      if (t.reached.load() >= target) {
        t.waiting = false;  // it has everything it is waiting for
      } else if (!t.waiting) {
        t.waiting = true;
        t.wait_start = now;
      } else if (now - t.wait_start > 60s) {
        t.failure = "no frame for 60 s after update " + std::to_string(t.last.load());
        t.done = true;
      }
      return false;
    }
    if (t.waiting) {
      if (const double w = std::chrono::duration<double>(now - t.wait_start).count();
          w > t.longest_wait) {
        t.longest_wait = w;
        t.longest_wait_end = now;
        t.longest_wait_after = t.last.load();
      }
      t.waiting = false;
    }
    if (r.closed) {
      t.close_code = r.close_code;
      t.failure = "closed " + std::to_string(r.close_code) + " after update " +
                  std::to_string(t.last.load());
      t.done = true;
      return true;
    }
    const std::string& s = r.text;
    if (s.find(R"("type":"update")") != std::string::npos) {
      const int64_t n = n_of(s);
      const auto position = cursor_position_in(s);
      const int64_t last = t.last.load();
      if (!position) {
        t.problem("an update without a cursor after " + std::to_string(last));
      } else {
        const int64_t offset = static_cast<int64_t>(*position) - n;
        if (t.offset == INT64_MIN) t.offset = offset;
        if (offset != t.offset)
          t.problem("update " + std::to_string(n) + " at position " + std::to_string(*position) +
                    " (offset " + std::to_string(offset) + ", before " + std::to_string(t.offset) +
                    ")");
        if (t.resync_at) {
          // Live from the resync's cursor: the first update after it is the next position.
          if (*position != *t.resync_at + 1 || n <= last)
            t.problem("after a resync at position " + std::to_string(*t.resync_at) + " (update " +
                      std::to_string(last) + " before it) got update " + std::to_string(n) +
                      " at position " + std::to_string(*position));
          t.skipped_by_resyncs += std::max<int64_t>(0, n - last - 1);
          t.resync_at.reset();
        } else if (n != last + 1) {
          t.problem("got " + std::to_string(n) + " after " + std::to_string(last) +
                    " without a resync");
        }
      }
      t.last = n;
      t.reached = std::max(t.reached.load(), n);
      ++t.updates;
      if (n == target) t.target_at = Clock::now();
    } else if (s.find(R"("type":"resync")") != std::string::npos) {
      const auto j = json::parse(s);
      ++t.resyncs;
      if (j.value("reason", "") != "window") {
        ++t.other_reasons;
        t.problem("resync " + s);
      }
      const auto position = cursor_position_in(s);
      if (!position) {
        t.problem("a resync without a cursor: " + s);
      } else {
        t.resync_at = *position;
        if (t.offset != INT64_MIN)
          t.reached = std::max(t.reached.load(), static_cast<int64_t>(*position) - t.offset);
      }
    } else if (s.find(R"("type":"progress")") == std::string::npos) {
      t.problem("unexpected " + s.substr(0, 200));
    }
  } catch (const std::exception& e) {
    t.failure = e.what();
    t.done = true;
  }
  return true;
}

// A reader thread: round-robin over its sockets, a frame at a time from each that has one, every
// socket up to update `target` (a phase's last; it moves between phases) and on, until `stop`.
void read_flood(std::vector<WsClient>& ws, std::vector<FloodTally>& tally, std::vector<int> mine,
                const std::atomic<int64_t>& target, const std::atomic<bool>& stop) {
  while (!stop) {
    bool any = false;
    const int64_t to = target.load();
    std::vector<pollfd> fds;
    for (int i : mine) {
      FloodTally& t = tally[i];
      if (t.done) continue;
      any |= read_one(ws[i], t, to);
      if (!t.done) fds.push_back(pollfd{ws[i].native_handle(), POLLIN, 0});
    }
    // Nothing anywhere (so nothing already read waits in a client either): wait for a socket
    // instead of spinning, the CPU is the replica's.
    if (!any && !fds.empty()) ::poll(fds.data(), fds.size(), 100);
  }
}

// Every socket closed so far, whatever the code.
double closes_total(int port) {
  const auto body = "\n" + http_get(port, "/metrics").second;
  double total = 0;
  const std::string series = "\noutlive_socket_closes_total{";
  for (auto at = body.find(series); at != std::string::npos; at = body.find(series, at + 1)) {
    const auto space = body.find(' ', at + series.size());
    if (space != std::string::npos) total += std::strtod(body.c_str() + space + 1, nullptr);
  }
  return total;
}

}  // namespace

// Publishes `count` updates of `key` straight to the app's topic (as a publisher would, pipelined),
// numbered from `first`, each with `pad` bytes of padding; waits for every ack.
void publish_to_topic(topic::Client& nats, const std::string& key, int first, int count, int pad) {
  std::mutex mutex;
  int acked = 0, failed = 0;
  nats.set_publish_handler([&](const topic::PublishResult& r) {
    std::lock_guard lock(mutex);
    ++(r.ok ? acked : failed);
  });
  const std::string padding(static_cast<size_t>(pad), 'x');
  for (int i = 0; i < count; ++i) {
    const int n = first + i;
    const std::string body = R"({"v":1,"k":")" + key + R"(","d":{"n":)" + std::to_string(n) +
                             R"(,"pad":")" + padding + R"("}})";
    const auto error =
        nats.publish_async(topic::subject_for("inventory"), body,
                           "gap-" + key + "-" + std::to_string(n), static_cast<uint64_t>(n), 10s);
    REQUIRE(!error);
  }
  REQUIRE(eventually(
      [&] {
        std::lock_guard lock(mutex);
        return acked + failed == count;
      },
      30s, 5ms));
  nats.set_publish_handler(nullptr);
  REQUIRE(failed == 0);
}

TEST_CASE(
    "no silent gap: a replica that falls behind the topic's retention resyncs every subscription "
    "short of the positions it lost, then delivers what follows in order") {
  Fixture f;
  auto a = f.open(0);
  subscribe(a, sub("a", "gated", {{"k", "A"}}));
  auto b = f.open(1);
  subscribe(b, sub("b", "open", {{"k", "B"}}));
  f.tx({publish_sql("A", {{"n", 0}}), publish_sql("B", {{"n", 0}})});
  REQUIRE(next_frame(a)["data"]["n"] == 0);
  REQUIRE(next_frame(b)["data"]["n"] == 0);

  // From now on the stream keeps only its latest 256 KiB (SPEC 4: 64 MiB), and A's next
  // authorize() sleeps 5 s: everything of A waits in A's lane behind it, and once 4,096 wait the
  // replica stops reading the topic. Meanwhile 6,000 more of A go to the topic: the stream
  // discards those the replica has not read yet.
  topic::Client nats({f.nats.url()}, "test-gap");
  topic::StreamSettings small;
  small.max_bytes = 256 * 1024;
  nats.ensure_stream("inventory", small);
  f.tx({"UPDATE t.flags SET enabled = true WHERE name = 'slow'", access_sql("A"),
        publish_sql("A", {{"n", 1}})});
  REQUIRE(eventually(
      [&] {
        return f.scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'") == 1;
      },
      5s, 5ms));
  constexpr int kLast = 6001;
  publish_to_topic(nats, "A", 2, kLast - 1, 200);
  // A's last update's position: a resync at or past it covers it (the tab loads the state; the
  // subscription is live after it), so no frame of it follows then.
  const uint64_t a_last = nats.stream_state("inventory").last_sequence;
  REQUIRE(f.scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'") == 1);
  f.tx({publish_sql("B", {{"n", 1}})});

  // B's reader lost nothing of B that it knows of, but the lost positions might have held B's
  // updates: resync (window) first, once per loss the replica found, then B's next.
  int b_resyncs = 0;
  json b_next;
  for (;;) {
    b_next = next_frame(b, 30s);
    if (b_next["type"] != "resync") break;
    CHECK(b_next["reason"] == "window");
    ++b_resyncs;
  }
  CHECK(b_resyncs >= 1);
  CHECK(b_next["type"] == "update");
  CHECK(b_next.value("data", json::object()).value("n", -1) == 1);

  // A's reader: its updates in order up to the loss, a resync, then in order to the last one.
  int64_t last = 0;
  int resyncs = 0, gaps = 0;
  std::string first_gap;
  while (last < kLast) {
    const json j = next_frame(a, 30s);
    if (j["type"] == "resync") {
      ++resyncs;
      CHECK(j["reason"] == "window");
      last = -1;  // anything may follow a resync
      const auto at = cursor_position_in(j.dump());
      REQUIRE(at);
      if (*at >= a_last) break;  // a catch-up that fell out of the window late: resync to the head
      continue;
    }
    REQUIRE(j["type"] == "update");
    const int64_t n = j["data"]["n"].get<int64_t>();
    if (last >= 0 && n != last + 1) {
      if (gaps++ == 0) first_gap = std::to_string(last) + " -> " + std::to_string(n);
    }
    last = n;
  }
  INFO("first gap without a resync: " << first_gap);
  CHECK(gaps == 0);
  CHECK(resyncs >= 1);
  CHECK(metric_or_zero(f.port(), R"(outlive_topic_lost_total{app="inventory"})") > 0);
}

// Alone: build/tests/core_tests "[overload]". Its readers never block on one socket: a socket
// that has everything sent so far would keep its thread from the others, which then stall and
// leave their pings unanswered (the replica rightly drops them).
TEST_CASE(
    "overload: updates offered at 3x what the replica delivers for 30 s keep memory bounded, every "
    "socket ends in order or with a resync, and delivery recovers",
    "[overload]") {
  Fixture f;
  constexpr int kReaders = 200;
  constexpr int kBlob = 16 * 1024 - 40;  // the data {"blob":"x...","n":N} is about 16 KiB
  constexpr auto kCalibration = 4s;
  constexpr auto kOverload = 30s;
  // The replica runs in this process: its window holds at most 32 MiB, its dispatcher at most 4,096
  // updates (64 MiB of these), each socket at most 512 KiB while catching up (100 MiB for 200);
  // with the clients and the process's own ~20 MiB, 400 MiB is a bound that only unbounded
  // queueing crosses.
  constexpr long kRssBoundKib = 400 * 1024;
  const json scope = {{"k", "flood"}};
  std::vector<WsClient> ws;
  for (int i = 0; i < kReaders; ++i) {
    ws.push_back(f.open(i));
    subscribe(ws.back(), sub("f", "open", scope));
  }
  REQUIRE(metric(f.port(), kSockets) == kReaders);
  const double closes_before = closes_total(f.port());
  const long rss_before = rss_kib();
  const auto test_start = Clock::now();

  std::atomic<long> rss_max{rss_before};
  std::atomic<bool> sampling{true};
  std::thread sampler([&] {
    while (sampling) {
      rss_max = std::max(rss_max.load(), rss_kib());
      std::this_thread::sleep_for(100ms);
    }
  });
  std::atomic<int64_t> target{INT64_MAX};
  std::atomic<bool> stop{false};
  std::vector<FloodTally> tally(kReaders);
  std::vector<std::thread> readers;
  // 5 threads of 40 sockets each, reading round-robin one frame at a time as fast as they go. On 2
  // cores the readers share the CPU with the replica, Postgres and nats-server: with a thread per
  // socket they starve the writer (it cannot offer more than delivery takes), with 20 they take
  // everything the replica sends (the delivery core is never overloaded); with 5 the sockets are
  // the bottleneck and the surplus reaches the replica.
  constexpr int kReaderThreads = 5;
  for (int th = 0; th < kReaderThreads; ++th) {
    std::vector<int> mine;
    for (int i = th; i < kReaders; i += kReaderThreads) mine.push_back(i);
    readers.emplace_back([&, mine] { read_flood(ws, tally, mine, target, stop); });
  }
  // Whatever happens, the reader threads end (a read never blocks).
  struct Joiner {
    std::vector<std::thread>& threads;
    std::atomic<bool>& stop;
    std::atomic<bool>& sampling;
    std::thread& sampler;
    ~Joiner() {
      stop = true;
      sampling = false;
      for (auto& t : threads)
        if (t.joinable()) t.join();
      if (sampler.joinable()) sampler.join();
    }
  } joiner{readers, stop, sampling, sampler};
  const auto delivered = [&] {
    int64_t sum = 0;
    for (const auto& t : tally) sum += t.updates.load();
    return sum;
  };
  const auto slowest = [&] {
    int64_t m = INT64_MAX;
    for (const auto& t : tally)
      if (!t.done) m = std::min(m, t.reached.load());
    return m;
  };
  // Every reader still reading has update n or was resynced past it (or has stopped).
  const auto all_have = [&](int64_t n) {
    for (const auto& t : tally)
      if (!t.done && t.reached.load() < n) return false;
    return true;
  };

  // The updates go straight to the app's topic, as the publisher would put them there: this test
  // overloads the delivery core (window, fan-out, sockets), and the outbox's one-key-at-a-time
  // publishing would cap what reaches the replica below 3R (at about 1.4R here, with 20,000 rows
  // left in the outbox at the writer's stop) and let the machine's Postgres speed decide whether
  // the run overloads at all. The recovery update at the end goes through the outbox.
  topic::Client nats({f.nats.url()}, "test-overload");
  std::atomic<int64_t> acked{0}, publish_failed{0};
  nats.set_publish_handler(
      [&](const topic::PublishResult& r) { ++(r.ok ? acked : publish_failed); });
  const std::string blob(kBlob, 'x');
  int64_t written = 0;
  const auto write_batch = [&](int count) {
    for (int i = 0; i < count; ++i) {
      const int64_t n = written + 1;
      const std::string body =
          R"({"v":1,"k":"flood","d":{"blob":")" + blob + R"(","n":)" + std::to_string(n) + "}}";
      const auto error =
          nats.publish_async(topic::subject_for("inventory"), body, "flood-" + std::to_string(n),
                             static_cast<uint64_t>(n), 30s);
      if (error) FAIL("publishing update " << n << ": " << *error);
      written = n;
    }
  };
  const auto wait_acked = [&] {
    return eventually([&] { return acked.load() + publish_failed.load() == written; }, 60s, 5ms) &&
           publish_failed.load() == 0;
  };
  pqxx::connection writer(f.db);
  const auto write_tx = [&](int count) {
    pqxx::work w(writer);
    w.exec(
        "SELECT events.publish_live('inventory', 'flood', jsonb_build_object('n', i, 'blob', "
        "repeat('x', " +
        std::to_string(kBlob) + "))) FROM generate_series(" + std::to_string(written + 1) + ", " +
        std::to_string(written + count) + ") i");
    w.commit();
    pqxx::nontransaction(writer).exec("SELECT events.wake('inventory')");
    written += count;
  };

  // Calibration: batches of 50 as fast as the writer goes, but never more than 1,000 updates
  // ahead of the slowest reader (inside the window); R is the mean per-socket delivery rate from
  // 1 s to the end, while delivery is saturated.
  const auto cal_start = Clock::now();
  int64_t delivered_at_1s = -1;
  bool backlog_kept = true;  // the writer stayed ahead of delivery (R is not writer-bound)
  while (Clock::now() < cal_start + kCalibration) {
    if (delivered_at_1s < 0 && Clock::now() >= cal_start + 1s) {
      delivered_at_1s = delivered();
      backlog_kept = written - slowest() >= 100;
    }
    if (written - slowest() < 1000) {
      write_batch(50);
    } else {
      std::this_thread::sleep_for(5ms);
    }
  }
  const double cal_window = seconds_since(cal_start) - 1.0;
  const int64_t delivered_at_end = delivered();
  backlog_kept = backlog_kept && written - slowest() >= 100;
  const double rate = double(delivered_at_end - delivered_at_1s) / kReaders / cal_window;
  const int64_t calibration_written = written;
  target = calibration_written;
  REQUIRE(eventually([&] { return all_have(calibration_written); }, 60s, 10ms));
  const double cal_drain = seconds_since(cal_start);
  INFO("calibration: R = " << rate << " updates/s per socket");
  REQUIRE(rate > 0);
  int cal_failed = 0;
  for (const auto& t : tally) cal_failed += t.done ? 1 : 0;
  REQUIRE(cal_failed == 0);

  // Overload: 3R updates/s (rounded up to whole batches of 50) for 30 s.
  const double offered_target = 3.0 * rate;
  const auto tx_every = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(50.0 / offered_target));
  target = INT64_MAX;
  const auto over_start = Clock::now();
  const int64_t over_first = written + 1;
  double writing_s = 0;
  for (int64_t i = 0; Clock::now() < over_start + kOverload; ++i) {
    std::this_thread::sleep_until(over_start + i * tx_every);
    if (Clock::now() >= over_start + kOverload) break;
    const auto t0 = Clock::now();
    write_batch(50);
    writing_s += seconds_since(t0);
  }
  const double over_took = seconds_since(over_start);
  const int64_t slowest_at_stop = slowest();
  const int64_t unacked_at_stop = written - acked.load();
  const double window_mib_at_stop =
      metric_or_zero(f.port(), R"(outlive_window_bytes{app="inventory"})") / 1048576.0;
  const int64_t over_written = written - over_first + 1;
  const double offered = double(over_written) / over_took;
  const int64_t final_n = written;
  // Every update is in the topic before the recovery update follows it there.
  REQUIRE(wait_acked());
  nats.set_publish_handler(nullptr);
  const long rss_at_stop = rss_kib();

  // The sockets drain: every one reaches the last update (live, possibly after resyncs).
  target = final_n;
  const auto drain_start = Clock::now();
  const bool drained = eventually([&] { return all_have(final_n); }, 120s, 10ms);
  std::string behind;  // when the drain did not complete: who, and the replica's state
  if (!drained) {
    for (int i = 0; i < kReaders; ++i)
      if (!tally[i].done && tally[i].reached.load() < final_n)
        behind += std::to_string(i) + "@" + std::to_string(tally[i].reached.load()) + " ";
    std::istringstream body(http_get(f.port(), "/metrics").second);
    for (std::string line; std::getline(body, line);)
      if (line.rfind("outlive_", 0) == 0 && line.find("seconds") == std::string::npos)
        behind += "\n" + line;
  }
  const double drain_took = seconds_since(drain_start);

  // Recovery: one more update reaches every socket within 5 s.
  target = final_n + 1;
  const auto recovery_at = Clock::now();
  write_tx(1);
  const bool recovered = eventually([&] { return all_have(final_n + 1); }, 10s, 5ms);
  const double recovery_took = seconds_since(recovery_at);
  stop = true;
  for (auto& r : readers) r.join();
  sampling = false;
  sampler.join();
  rss_max = std::max(rss_max.load(), rss_kib());
  const double total_took = seconds_since(test_start);

  // The verdicts of the whole run first, each with its figures on a line of its own: when one
  // fails, they are the first lines of the report.
  const double closes = closes_total(f.port()) - closes_before;
  const double sockets_open = metric(f.port(), kSockets);
  INFO("R " << rate << " updates/s per socket; offered " << offered << " (" << offered / rate
            << " x R) for " << over_took << " s, " << writing_s << " s in the writer");
  INFO("drain " << drain_took << " s, recovery waited " << recovery_took << " s; closes " << closes
                << ", sockets open " << sockets_open << "; RSS peak " << rss_max.load() / 1024
                << " MiB (bound " << kRssBoundKib / 1024 << ")");
  // An overload is an offered rate well above R: 3R is the aim, 2R the least that still tests it
  // (the writer shares the 2 cores with a saturated replica, and its Postgres backend slows).
  CHECK(offered >= 2.0 * rate);
  CHECK(drained);
  CHECK(recovered);
  CHECK(closes == 0);
  CHECK(sockets_open == kReaders);
  CHECK(rss_max.load() < kRssBoundKib);

  int resynced = 0, ok = 0;
  int64_t resyncs = 0, skipped = 0;
  double recovery_max = 0, longest_wait = 0;
  for (int i = 0; i < kReaders; ++i) {
    const auto& t = tally[i];
    INFO("reader " << i << ": " << t.failure << " / " << t.first_problem << " (last "
                   << t.last.load() << ", " << t.updates.load() << " updates, " << t.resyncs
                   << " resyncs; longest read " << t.longest_wait << " s, ending "
                   << std::chrono::duration<double>(t.longest_wait_end - test_start).count()
                   << " s into the test, after update " << t.longest_wait_after << ")");
    longest_wait = std::max(longest_wait, t.longest_wait);
    CHECK(t.failure.empty());
    CHECK(t.close_code == -1);
    CHECK(t.out_of_order == 0);
    CHECK(t.other_reasons == 0);
    CHECK_FALSE(t.resync_at.has_value());  // every resync was followed by updates
    CHECK(t.last.load() == final_n + 1);
    if (t.target_at != Clock::time_point{}) {
      const double d = std::chrono::duration<double>(t.target_at - recovery_at).count();
      recovery_max = std::max(recovery_max, d);
      CHECK(d < 5.0);
    }
    resynced += t.resyncs > 0 ? 1 : 0;
    resyncs += t.resyncs;
    skipped += t.skipped_by_resyncs;
    ok += (t.failure.empty() && t.out_of_order == 0 && t.last.load() == final_n + 1) ? 1 : 0;
  }
  WARN("overload: " << kReaders << " readers of ~16 KiB updates; calibration: R = " << rate
                    << " updates/s per socket (" << rate * kReaders * 16.0 / 1024.0
                    << " MiB/s fanned out"
                    << (backlog_kept ? "" : "; WRITER-BOUND: delivery kept up with the writer")
                    << "), " << calibration_written << " updates drained in " << cal_drain
                    << " s; overload: offered " << offered << " updates/s (" << offered / rate
                    << " x R; target " << offered_target << ") for " << over_took << " s, "
                    << over_written << " updates, " << writing_s
                    << " s of it in the writer's publishes; at the stop: slowest socket at "
                    << slowest_at_stop << " of " << final_n << ", unacked " << unacked_at_stop
                    << ", window " << window_mib_at_stop << " MiB; drain " << drain_took << " s ("
                    << (drained ? "complete" : "INCOMPLETE") << "); recovery update reached all in "
                    << recovery_max << " s (" << (recovered ? "all" : "NOT ALL") << ", waited "
                    << recovery_took << " s); " << resynced << "/" << kReaders
                    << " sockets resynced (" << resyncs << " resyncs, " << skipped
                    << " updates skipped by them, per socket summed); " << ok << "/" << kReaders
                    << " ok; the longest a read waited " << longest_wait << " s; phases began at "
                    << seconds_since(test_start) - seconds_since(cal_start) << ", "
                    << seconds_since(test_start) - seconds_since(over_start) << ", "
                    << seconds_since(test_start) - seconds_since(drain_start)
                    << " s (calibration, overload, drain); closes " << closes << ", sockets open "
                    << sockets_open << "; RSS " << rss_before / 1024 << " MiB before, "
                    << rss_at_stop / 1024 << " MiB when the writer stopped, peak "
                    << rss_max.load() / 1024 << " MiB (bound " << kRssBoundKib / 1024
                    << " MiB; test process: replica + " << kReaders << " clients); test body "
                    << total_took << " s");
  if (!drained) FAIL_CHECK("not drained; behind (socket@update): " << behind);
}
