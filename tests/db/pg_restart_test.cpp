// Issue 47 items 2 and 6: after a Postgres restart, the pool's connections that died with the old
// server must not fail a single check. A replica in process, on a Postgres of its own restarted on
// the same port and data directory (fast shutdown, as `pg_ctl restart -m fast`), under 200 sockets
// whose credentials are re-checked every second and new subs arriving throughout.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <pqxx/pqxx>
#include <sstream>
#include <thread>

#include "harness/embedded_postgres.hpp"
#include "outbox/migrate.hpp"
#include "support/frames.hpp"
#include "support/inventory.hpp"
#include "support/replica_fixture.hpp"
#include "support/services.hpp"
#include "support/ws_client.hpp"

using namespace outlive;
using namespace outlive::testing;
using namespace std::chrono_literals;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// 500 viewers, members of north, signed in as "session=tab-<i>" (one viewer has a few sockets at
// most).
const std::string kViewers = R"SQL(
INSERT INTO inventory.members SELECT '00000000-0000-0000-0000-00000000000a', 'user:t' || i
  FROM generate_series(1, 500) i;
INSERT INTO auth.sessions SELECT encode(sha256(('tab-' || i)::bytea), 'hex'), 'user:t' || i,
  'user:t' || i, false, now() + interval '1 hour' FROM generate_series(1, 500) i;
)SQL";

std::vector<std::pair<std::string, std::string>> tab_cookie(int i) {
  return {{"Cookie", "session=tab-" + std::to_string(i)}};
}

// The line of a check that failed (not the summary of lines held back, "(suppressed)").
const std::string kCheckFailed = R"("msg":"access check failed",)";

const std::string kSub =
    json{{"type", "sub"}, {"id", "w"}, {"channel", "warehouse"}, {"scope", kNorthScope}}.dump();

json replica_config(const std::string& db, const std::string& nats) {
  json channels = {{"warehouse",
                    {{"scope", kWarehouseScopeSchema},
                     {"keys", kWarehouseKeys},
                     {"authorize", kWarehouseAuthorize}}}};
  // Many workers, so that most of them sit idle across the restart with a connection that died
  // in it; re-checks every second keep them all in use afterwards.
  auto c = inventory_replica_config(db, nats, "r1", channels, /*recheck_seconds=*/1);
  c["server"] = {{"db_pool_size", 24}};
  return c;
}

// The replica's log (stderr) in a file while it lives, so the test can read what it said after a
// point in time; restored on destruction.
class StderrCapture {
 public:
  StderrCapture() : path_(harness::make_temp_dir("outlive-pg-restart-log-") + "/stderr.log") {
    std::fflush(stderr);
    saved_ = ::dup(2);
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~StderrCapture() {
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
  }
  size_t size() {
    std::fflush(stderr);
    return text().size();
  }
  std::string text() const {
    std::ifstream in(path_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  std::string path_;
  int saved_ = -1;
};

// A tab that opens a socket and subscribes, on an address of its own (5 opens/s per address).
// Returns the close code (0: subscribed; -1: no answer in time).
int open_and_subscribe(int port, int n) {
  try {
    WsClient ws(port, "/api/inventory/live", tab_cookie(201 + n % 300),
                "127.0.4." + std::to_string(1 + n % 250));
    ws.send(kSub);
    const auto deadline = Clock::now() + 10s;
    while (Clock::now() < deadline) {
      auto r = ws.next(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
      if (r.closed) return r.close_code;
      if (r.timed_out) return -1;
      if (r.json()["type"] == "subscribed") return 0;
    }
  } catch (const std::exception&) {
  }
  return -1;
}

}  // namespace

TEST_CASE("after a Postgres fast restart under 200 sockets no check fails on a dead connection") {
  harness::PostgresOptions options;
  options.port = harness::free_port();
  options.data_dir = harness::make_temp_dir("outlive-restart-pg-");
  auto pg = std::make_unique<harness::EmbeddedPostgres>(options);
  const std::string db = pg->create_database("restart");
  outbox::migrate(db);
  StderrCapture log;
  ReplicaFixture f(kInventoryTables + kAdaSeed + kViewers, replica_config, db);

  // 200 sockets, each subscribed; their credentials are re-checked every second from now on.
  std::vector<WsClient> sockets;
  for (int i = 0; i < 200; ++i) {
    sockets.emplace_back(f.port, "/api/inventory/live", tab_cookie(1 + i),
                         "127.0.3." + std::to_string(1 + i));
    sockets.back().send(kSub);
  }
  for (auto& ws : sockets) REQUIRE(ws.next_of_type("subscribed")["id"] == "w");
  f.publish(kNorth, {{"n", 0}});  // the publisher's connections are in use before the restart

  // Two rounds of re-checks on live connections first.
  std::this_thread::sleep_for(2s);  // the workload's length, not a wait for an event
  pg->stop();
  pg = std::make_unique<harness::EmbeddedPostgres>(options);  // returns once it accepts
  const auto back = Clock::now();
  const double closes_at_back =
      metric_or_zero(f.port, R"(outlive_socket_closes_total{code="1011"})");
  const size_t log_at_back = log.size();

  // New tabs from now on, 40 a second on four threads, each opening a socket and subscribing.
  std::atomic<int> tabs_after{0}, tabs_after_refused{0}, last_refusal{0};
  std::atomic<bool> stop_tabs{false};
  std::vector<std::thread> openers;
  for (int t = 0; t < 4; ++t) {
    openers.emplace_back([&, t] {
      auto next = Clock::now();
      for (int n = t; !stop_tabs; n += 4) {
        std::this_thread::sleep_until(next);  // the pace is the workload, not a wait
        next += 100ms;
        ++tabs_after;
        if (const int code = open_and_subscribe(f.port, n); code != 0) {
          ++tabs_after_refused;
          last_refusal = code;
        }
      }
    });
  }

  // Updates committed after the restart are published and their rows deleted once acked.
  for (int n = 1; n <= 20; ++n) f.publish(kNorth, {{"n", n}});
  pqxx::connection check(db);
  const bool drained = eventually(
      [&] {
        return pqxx::nontransaction(check)
                   .exec1("SELECT count(*) FROM events.outbox")[0]
                   .as<int>() == 0;
      },
      10s, 20ms);

  // Past the check deadline (10 s) of anything asked while Postgres was away: a check held or
  // dropped then would close its socket in this time; and ten rounds of re-checks of the 200.
  while (Clock::now() < back + 11s) std::this_thread::sleep_for(50ms);
  const double closes_after =
      metric_or_zero(f.port, R"(outlive_socket_closes_total{code="1011"})") - closes_at_back;
  const double closes_before = closes_at_back;
  const bool ready = http_get(f.port, "/readyz").first == 200;
  stop_tabs = true;
  for (auto& t : openers) t.join();
  const std::string said = log.text();
  const std::string said_after = said.substr(log_at_back);

  const auto count = [](const std::string& text, const std::string& what) {
    size_t count = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
      ++count;
    return count;
  };
  WARN("1011 closes before Postgres was back: " << closes_before << "; after: " << closes_after
                                                << "; tabs opened after: " << tabs_after
                                                << ", not subscribed: " << tabs_after_refused
                                                << " (last: " << last_refusal << ")");
  WARN("after: 'access check failed' lines: " << count(said_after, kCheckFailed)
                                              << " (" << count(said, kCheckFailed)
                                              << " in all), 'deleting acked updates' lines: "
                                              << count(said_after, "deleting acked updates"));
  INFO(said_after.substr(0, 6000));
  CHECK(drained);
  CHECK(closes_after == 0);
  CHECK(tabs_after > 10);
  CHECK(tabs_after_refused == 0);
  CHECK(count(said_after, kCheckFailed) == 0);
  CHECK(count(said_after, "deleting acked updates (they stay held and are tried again) failed") == 0);
  CHECK(ready);
}
