// The edges of the serving side (issue: the HTTP side before the upgrade, SPEC 5.7 rev 2; the client
// address behind trusted proxies and failed credential lookups, SPEC 5.1 rev 2; readiness from a
// state refreshed in the background, SPEC 6 rev 2): a replica out of descriptors keeps serving its
// open sockets, slow and silent connections are closed on time, 64 unupgraded connections per
// address, per-address limits that follow X-Forwarded-For only from trusted proxies, at most 5
// garbage-credential lookups per address per second, /readyz and /healthz while Postgres is down,
// 400 and 431. Real PostgreSQL and nats-server; a real `outlive serve` child where the descriptor
// limit matters; plain sockets for the HTTP side. Every wait has a deadline.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <latch>
#include <list>
#include <pqxx/pqxx>
#include <sstream>
#include <thread>

#include "config/config.hpp"
#include "harness/process.hpp"
#include "outbox/migrate.hpp"
#include "replica/replica.hpp"
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
using Headers = std::vector<std::pair<std::string, std::string>>;

namespace {

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// t.lookups gets a row for every session lookup that reaches the database.
const std::string kSchema = kInventoryTables + kAdaSeed + R"SQL(
CREATE SCHEMA t;
CREATE TABLE t.lookups (n bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp());
)SQL";

json edge_config(const std::string& db, const std::string& nats, const json& patch) {
  json channels = {{"warehouse",
                    {{"scope", kWarehouseScopeSchema},
                     {"keys", kWarehouseKeys},
                     {"authorize", kWarehouseAuthorize}}}};
  json cfg = inventory_replica_config(db, nats, "edges", channels);
  cfg["auth"]["sessions"] =
      "WITH logged AS (INSERT INTO t.lookups DEFAULT VALUES RETURNING 1) "
      "SELECT subject, actor, NULL::text[] AS scopes, app_session FROM auth.sessions, logged "
      "WHERE token_sha256 = $1 AND expires_at > now()";
  cfg.merge_patch(patch);
  return cfg;
}

void load_schema(const std::string& db) {
  pqxx::connection c(db);
  pqxx::work tx(c);
  tx.exec(kSchema);
  tx.commit();
}

void publish(const std::string& db, const std::string& key, const json& data) {
  pqxx::connection c(db);
  pqxx::work tx(c);
  tx.exec_params("SELECT events.publish_live('inventory', $1, $2::jsonb)", key, data.dump());
  tx.commit();
  pqxx::nontransaction(c).exec("SELECT events.wake('inventory')");
}

int64_t scalar(const std::string& db, const std::string& sql) {
  pqxx::connection c(db);
  return pqxx::nontransaction(c).exec(sql)[0][0].as<int64_t>();
}

json sub(const std::string& id, const json& scope = kNorthScope) {
  return json{{"type", "sub"}, {"id", id}, {"channel", "warehouse"}, {"scope", scope}};
}

bool readyz_is(int port, int status) {
  try {
    return http_get(port, "/readyz").first == status;
  } catch (...) {
    return false;
  }
}

// An in-process replica of the app "inventory" on its own database.
struct Fixture : ReplicaFixture {
  explicit Fixture(const json& patch = json::object(), std::string database = "")
      : ReplicaFixture(
            kSchema,
            [&](const std::string& db, const std::string& nats) {
              return edge_config(db, nats, patch);
            },
            std::move(database)) {}
};

// A plain TCP connection to 127.0.0.1:port from `local` (any 127.0.0.0/8 address).
class Raw {
 public:
  Raw(int port, const std::string& local = "127.0.0.1") {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
    sockaddr_in from{};
    from.sin_family = AF_INET;
    ::inet_pton(AF_INET, local.c_str(), &from.sin_addr);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0)
      throw std::runtime_error(std::string("bind: ") + std::strerror(errno));
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(port));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0)
      throw std::runtime_error(std::string("connect: ") + std::strerror(errno));
    opened_ = Clock::now();
  }
  ~Raw() {
    if (fd_ >= 0) ::close(fd_);
  }
  Raw(const Raw&) = delete;
  Raw& operator=(const Raw&) = delete;
  Raw(Raw&& o) noexcept : fd_(std::exchange(o.fd_, -1)), opened_(o.opened_) {}

  // Writes all of `bytes`; false when the peer is gone.
  bool send(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }

  struct Ending {
    bool closed = false;     // end of file (or a reset) before the deadline
    bool reset = false;      // ECONNRESET
    std::string data;        // everything that arrived
    double after_ms = 0;     // from the connection to the close (when closed)
  };
  // Reads until the peer closes or `timeout` passes.
  Ending read_to_end(std::chrono::milliseconds timeout) {
    Ending e;
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return e;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char chunk[65536];
      const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
      if (n > 0) {
        e.data.append(chunk, static_cast<size_t>(n));
        continue;
      }
      e.closed = true;
      e.reset = n < 0 && errno == ECONNRESET;
      e.after_ms = ms_since(opened_);
      return e;
    }
  }
  // Reads until `marker` has arrived, the peer closes or `timeout` passes; all that arrived.
  std::string read_until(const std::string& marker, std::chrono::milliseconds timeout) {
    std::string data;
    const auto deadline = Clock::now() + timeout;
    while (data.find(marker) == std::string::npos) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char chunk[4096];
      const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
      if (n <= 0) break;
      data.append(chunk, static_cast<size_t>(n));
    }
    return data;
  }
  // Bytes waiting right now and whether the peer closed (without blocking).
  std::pair<size_t, bool> peek() {
    char chunk[4096];
    const ssize_t n = ::recv(fd_, chunk, sizeof chunk, MSG_DONTWAIT | MSG_PEEK);
    if (n > 0) return {static_cast<size_t>(n), false};
    if (n == 0) return {0, true};
    return {0, errno != EAGAIN && errno != EWOULDBLOCK};
  }

 private:
  int fd_ = -1;
  Clock::time_point opened_;
};

// A GET with Connection: close over a plain socket; the whole answer.
std::string raw_get(int port, const std::string& local, const std::string& target,
                    const std::string& extra_headers = "") {
  Raw c(port, local);
  c.send("GET " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra_headers +
         "Connection: close\r\n\r\n");
  return c.read_to_end(5s).data;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// How an open from `local` with `headers` ends: the error code of its first frame ("" when it was
// served: its sub was answered "subscribed") and the close code.
struct Outcome {
  std::string code;
  int close_code = 0;
};
Outcome outcome_of(WsClient& ws) {
  auto r = ws.next(5s);
  if (r.closed || r.timed_out) return {"<closed>", r.close_code};
  auto j = r.json();
  if (j["type"] == "error") return {j["code"].get<std::string>(), ws.wait_closed(5s)};
  return {"", 0};
}

WsClient open_ws(int port, const std::string& local, const Headers& headers) {
  return WsClient(port, "/api/inventory/live", headers, local);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// 1. Out of descriptors: a real `outlive serve` under RLIMIT_NOFILE 1,000 and 1,500 idle connections

TEST_CASE("1500 idle connections past the replica's descriptor limit: open sockets keep being "
          "served and one accept warning per 10 s and a new socket opens once they are gone") {
  // The test process holds 1,500 sockets itself.
  rlimit lim{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &lim) == 0);
  lim.rlim_cur = lim.rlim_max;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &lim) == 0);
  REQUIRE(lim.rlim_cur >= 1700);

  harness::EmbeddedNats nats;
  const std::string db = fresh_database();
  load_schema(db);
  const int port = harness::free_port();
  auto cfg = edge_config(db, nats.url(), json::object());
  cfg["listen"] = "127.0.0.1:" + std::to_string(port);
  const std::string dir = harness::make_temp_dir("outlive-edges-fd-");
  std::ofstream(dir + "/c.json") << cfg.dump();
  const std::string log = dir + "/log";
  harness::ChildProcess replica(
      {"/usr/bin/prlimit", "--nofile=1000:1000", outlive_binary(), "serve", "--config",
       dir + "/c.json"},
      log);
  REQUIRE(eventually([&] { return readyz_is(port, 200); }, 20s, 20ms));
  {  // the limit really is the replica's
    std::ifstream limits("/proc/" + std::to_string(replica.pid()) + "/limits");
    std::string line, found;
    while (std::getline(limits, line))
      if (line.rfind("Max open files", 0) == 0) found = line;
    INFO(found);
    REQUIRE_THAT(found, Catch::Contains("1000"));
  }

  // A socket opened before the flood, subscribed.
  auto ws = open_ws(port, "127.0.0.1", {{"Cookie", kAdaCookie}});
  ws.send(sub("w").dump());
  ws.next_of_type("subscribed");

  // The flood: 1,500 connections that send nothing (non-blocking connects: past the replica's
  // descriptors they wait in its listen queue).
  const auto flood_start = Clock::now();
  auto connect_idle = [port] {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) return fd;
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(port));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0 && errno != EINPROGRESS) {
      ::close(fd);
      return -1;
    }
    return fd;
  };
  std::vector<int> idle;
  for (int i = 0; i < 1500; ++i) {
    const int fd = connect_idle();
    REQUIRE(fd >= 0);
    idle.push_back(fd);
  }
  auto close_idle = [&] {
    for (int fd : idle) ::close(fd);
    idle.clear();
  };
  auto accept_warnings = [&] {
    std::ifstream in(log);
    std::string line;
    int n = 0;
    while (std::getline(in, line))
      if (line.find("accept failed") != std::string::npos) ++n;
    return n;
  };
  // The replica ran out of descriptors (it says so once).
  const bool exhausted = eventually([&] { return accept_warnings() >= 1; }, 10s, 20ms);
  if (!exhausted) close_idle();
  INFO(harness::tail_of_file(log));
  REQUIRE(exhausted);
  WARN("descriptors ran out " << ms_since(flood_start) << " ms after the flood began");

  // For 25 s the open socket receives an update every 500 ms while the flood goes on: every idle
  // connection the replica drops (10 s without a request: closed without an answer) is replaced,
  // so the replica stays out of descriptors past two of its 10 s warning periods.
  std::vector<double> latencies;
  int received = 0;
  size_t answered_bytes = 0;
  int closed_by_replica = 0;
  for (int i = 0; i < 50; ++i) {
    const auto start = Clock::now();
    publish(db, kNorth, {{"type", "item.changed"}, {"itemId", std::to_string(i)}});
    json u;
    try {
      u = ws.next_of_type("update", 5s);
    } catch (const std::exception& e) {
      close_idle();
      FAIL("update " << i << " did not arrive: " << e.what());
    }
    CHECK(u["data"]["itemId"] == std::to_string(i));
    ++received;
    latencies.push_back(ms_since(start));
    for (int& fd : idle) {
      char c[256];
      const ssize_t n = ::recv(fd, c, sizeof c, MSG_DONTWAIT | MSG_PEEK);
      if (n > 0) answered_bytes += static_cast<size_t>(n);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOTCONN)) {
        ++closed_by_replica;
        ::close(fd);
        fd = connect_idle();
        if (fd < 0) {
          close_idle();
          FAIL("no new connection: " << std::strerror(errno));
        }
      }
    }
    std::this_thread::sleep_for(500ms);  // pacing of the updates, not a wait for a condition
  }
  std::sort(latencies.begin(), latencies.end());
  const double flood_s = ms_since(flood_start) / 1000.0;
  const int warnings = accept_warnings();
  WARN(received << " updates during the flood, commit-to-frame p50 "
                << latencies[latencies.size() / 2] << " ms, max " << latencies.back() << " ms; "
                << warnings << " accept warnings in " << flood_s << " s; " << closed_by_replica
                << " idle connections closed by the replica (and replaced)");
  CHECK(warnings <= 1 + static_cast<int>(flood_s / 10));
  // Nothing was answered to the idle connections (no byte arrived: closed silently or waiting).
  CHECK(answered_bytes == 0);
  CHECK(closed_by_replica >= 900);  // the accepted ones went after 10 s without a byte

  // Once they are gone, a normal socket opens within 5 s.
  close_idle();
  const auto closed_at = Clock::now();
  const bool reopened = eventually(
      [&] {
        try {
          auto fresh = open_ws(port, "127.0.0.1", {{"Cookie", kAdaCookie}});
          fresh.send(sub("w2").dump());
          fresh.next_of_type("subscribed", 2s);
          return true;
        } catch (...) {
          return false;
        }
      },
      5s, 50ms);
  WARN("a new socket was served " << ms_since(closed_at) << " ms after the idle ones closed");
  CHECK(reopened);
  // And the old one still works.
  publish(db, kNorth, {{"type", "item.changed"}, {"itemId", "after"}});
  CHECK(ws.next_of_type("update", 5s)["data"]["itemId"] == "after");
  CHECK(accept_warnings() <= 1 + static_cast<int>(ms_since(flood_start) / 10000));
  ::kill(replica.pid(), SIGTERM);
  const auto status = replica.wait_for(15s);
  REQUIRE(status);
  CHECK(WIFEXITED(*status));
}

// ---------------------------------------------------------------------------------------------
// 2. Slow and silent connections; 64 unupgraded connections per address

TEST_CASE("slowloris: a partial request is answered 408 and closed and a silent connection closed "
          "without an answer within 11 s") {
  Fixture f(json{{"trusted_proxies", {"127.0.0.2"}}});
  Raw partial(f.port, "127.0.0.11");
  REQUIRE(partial.send("GET /healthz HTT"));
  Raw silent(f.port, "127.0.0.12");
  // The classic slowloris: a byte of the request every second, never finishing it.
  Raw trickle(f.port, "127.0.0.13");
  auto partial_end = std::async(std::launch::async, [&] { return partial.read_to_end(13s); });
  auto silent_end = std::async(std::launch::async, [&] { return silent.read_to_end(13s); });
  auto trickle_end = std::async(std::launch::async, [&] { return trickle.read_to_end(13s); });
  const std::string request = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
  for (size_t i = 0; i < 12 && trickle_end.wait_for(1s) != std::future_status::ready; ++i)
    trickle.send(std::string(1, i < request.size() ? request[i] : 'x'));
  const auto p = partial_end.get();
  const auto s = silent_end.get();
  const auto t = trickle_end.get();
  WARN("a byte a second: closed after " << t.after_ms << " ms with \""
                                          << t.data.substr(0, t.data.find('\r')) << "\"");
  REQUIRE(t.closed);
  CHECK(t.after_ms < 11000);
  CHECK(starts_with(t.data, "HTTP/1.1 408"));
  WARN("partial request closed after " << p.after_ms << " ms with \""
                                      << p.data.substr(0, p.data.find('\r')) << "\"; silent after "
                                      << s.after_ms << " ms with " << s.data.size() << " bytes");
  REQUIRE(p.closed);
  CHECK(p.after_ms < 11000);
  CHECK(p.after_ms > 9000);  // the client had its 10 s
  CHECK(starts_with(p.data, "HTTP/1.1 408"));
  REQUIRE(s.closed);
  CHECK(s.after_ms < 11000);
  CHECK(s.after_ms > 9000);
  CHECK(s.data.empty());
}

TEST_CASE("65 unupgraded connections from one address: the 65th is answered 503 with Retry-After "
          "and other addresses and trusted proxies are served") {
  Fixture f(json{{"trusted_proxies", {"127.0.0.2"}}});
  // 64 connections from 127.0.0.9 (not a trusted proxy) that have not upgraded, one started.
  std::list<Raw> held;
  for (int i = 0; i < 64; ++i) held.emplace_back(f.port, "127.0.0.9");
  REQUIRE(held.back().send("GET /api/inventory/live HTTP/1.1\r\n"));
  Raw extra(f.port, "127.0.0.9");
  const auto refused = extra.read_to_end(3s);
  INFO(refused.data);
  REQUIRE(refused.closed);
  CHECK(starts_with(refused.data, "HTTP/1.1 503"));
  CHECK_THAT(refused.data, Catch::Contains("Retry-After:"));
  for (auto& c : held) CHECK(c.peek() == std::make_pair(size_t(0), false));  // still open
  // Another address is served meanwhile.
  CHECK(starts_with(raw_get(f.port, "127.0.0.10", "/healthz"), "HTTP/1.1 200"));
  // A trusted proxy counts only towards the total: its 65th unupgraded connection is served.
  std::list<Raw> proxied;
  for (int i = 0; i < 64; ++i) proxied.emplace_back(f.port, "127.0.0.2");
  CHECK(starts_with(raw_get(f.port, "127.0.0.2", "/healthz"), "HTTP/1.1 200"));
  // When one of the 64 goes, the address has room again.
  held.pop_front();
  CHECK(eventually(
      [&] { return starts_with(raw_get(f.port, "127.0.0.9", "/healthz"), "HTTP/1.1 200"); }, 3s,
      20ms));
  // Upgraded sockets do not count: 64 held + a websocket from the same address is served.
  held.emplace_back(f.port, "127.0.0.9");
  CHECK(eventually(
      [&] { return starts_with(raw_get(f.port, "127.0.0.9", "/healthz"), "HTTP/1.1 503"); }, 3s,
      20ms));
  held.pop_front();
  std::optional<WsClient> ws;
  REQUIRE(eventually(
      [&] {
        try {
          ws.emplace(open_ws(f.port, "127.0.0.9", {{"Cookie", kAdaCookie}}));
          return true;
        } catch (...) {
          return false;
        }
      },
      3s, 20ms));
  held.emplace_back(f.port, "127.0.0.9");  // 64 unupgraded again, plus the websocket
  ws->send(sub("w").dump());
  ws->next_of_type("subscribed");
  Raw over(f.port, "127.0.0.9");
  CHECK(starts_with(over.read_to_end(3s).data, "HTTP/1.1 503"));
}

TEST_CASE("server.max_connections: a connection beyond it is answered 503 with Retry-After, "
          "counted, and served once one goes") {
  Fixture f(json{{"server", {{"max_connections", 3}}}});
  // Three connections the replica has served (a keep-alive /healthz answered 200), so each holds
  // a slot. A connection that is only connected may not be accepted yet, and the fixture's own
  // /readyz connection can still hold a slot while it closes: one answered 503 is tried again.
  std::list<Raw> held;
  REQUIRE(eventually(
      [&] {
        Raw c(f.port, "127.0.0.21");
        c.send("GET /healthz HTTP/1.1\r\nHost: edges\r\n\r\n");
        if (!starts_with(c.read_until("\r\n\r\n", 2s), "HTTP/1.1 200")) return false;
        held.push_back(std::move(c));
        return held.size() == 3;
      },
      10s, 20ms));
  // With the three served, the fourth connection, from any address, is turned away.
  std::string refused;
  REQUIRE(eventually(
      [&] {
        Raw extra(f.port, "127.0.0.22");
        refused = extra.read_to_end(1s).data;
        return starts_with(refused, "HTTP/1.1 503");
      },
      10s, 20ms));
  CHECK_THAT(refused, Catch::Contains("Retry-After: 1"));
  CHECK_THROWS(open_ws(f.port, "127.0.0.23", {{"Cookie", kAdaCookie}}));
  for (auto& c : held) CHECK(c.peek() == std::make_pair(size_t(0), false));  // still open
  // One goes: a websocket is served again, and the refusals were counted.
  held.pop_front();
  std::optional<WsClient> ws;
  REQUIRE(eventually(
      [&] {
        try {
          ws.emplace(open_ws(f.port, "127.0.0.23", {{"Cookie", kAdaCookie}}));
          return true;
        } catch (...) {
          return false;
        }
      },
      5s, 20ms));
  ws->send(sub("w").dump());
  CHECK(ws->next_of_type("subscribed")["id"] == "w");
  held.clear();
  std::optional<double> turned_away;
  REQUIRE(eventually(
      [&] {
        turned_away = metric_sample(f.port, R"(outlive_connections_refused_total{reason="max_connections"})");
        return turned_away.has_value();
      },
      5s, 20ms));
  CHECK(*turned_away >= 2);
}

// A Postgres of the test's own (the shared one serves the other tests), with a migrated
// database; removed with its data directory when it goes.
struct OwnPostgres {
  OwnPostgres() {
    options.port = harness::free_port();
    options.data_dir = harness::make_temp_dir("outlive-edges-pg-");
    pg = std::make_unique<harness::EmbeddedPostgres>(options);
    db = pg->create_database("edges");
    outbox::migrate(db);
  }
  OwnPostgres(const OwnPostgres&) = delete;
  OwnPostgres& operator=(const OwnPostgres&) = delete;
  ~OwnPostgres() {
    pg.reset();
    harness::remove_tree(options.data_dir);
  }
  harness::PostgresOptions options;
  std::unique_ptr<harness::EmbeddedPostgres> pg;
  std::string db;
};

// ---------------------------------------------------------------------------------------------
// 3. Readiness while Postgres is down

TEST_CASE("Postgres stopped: /readyz answers 503 within 100 ms to 20 at once and /healthz 200 "
          "within 100 ms and /readyz is 200 again once Postgres is back") {
  // A Postgres of its own (the shared one serves the other tests), restarted on the same port and
  // data directory.
  OwnPostgres own;
  auto& options = own.options;
  auto& pg = own.pg;
  const std::string db = own.db;
  std::optional<Fixture> f;
  f.emplace(json::object(), db);
  const int port = f->port;
  CHECK(metric(port, R"(outlive_ready{part="postgres"})") == 1);

  pg->stop();
  const auto stopped_at = Clock::now();
  REQUIRE(eventually([&] { return readyz_is(port, 503); }, 5s, 10ms));
  WARN("/readyz turned 503 " << ms_since(stopped_at) << " ms after Postgres stopped");
  CHECK(metric(port, R"(outlive_ready{part="postgres"})") == 0);

  for (int round = 0; round < 3; ++round) {
    std::vector<std::future<std::pair<int, double>>> answers;
    std::latch go(20);  // the 20 requests leave together
    for (int i = 0; i < 20; ++i) {
      answers.push_back(std::async(std::launch::async, [port, &go] {
        go.arrive_and_wait();
        const auto start = Clock::now();
        const int status = http_get(port, "/readyz").first;
        return std::make_pair(status, ms_since(start));
      }));
    }
    double worst = 0;
    for (auto& a : answers) {
      const auto [status, took] = a.get();
      CHECK(status == 503);
      CHECK(took < 100);
      worst = std::max(worst, took);
    }
    WARN("round " << round << ": 20 concurrent /readyz, the slowest answered in " << worst
                  << " ms");
  }
  double worst_health = 0;
  for (int i = 0; i < 10; ++i) {
    const auto start = Clock::now();
    CHECK(http_get(port, "/healthz").first == 200);
    worst_health = std::max(worst_health, ms_since(start));
  }
  WARN("/healthz while Postgres is down: slowest of 10 in " << worst_health << " ms");
  // SPEC 6 rev 2: answered within 50 ms; twice that here, the margin /readyz has above.
  CHECK(worst_health < 100);

  pg.reset();  // (already stopped) then started again on the same port and data directory
  pg = std::make_unique<harness::EmbeddedPostgres>(options);  // returns once it accepts connections
  const auto back_at = Clock::now();
  // Readiness is refreshed about once a second (SPEC 6 rev 2): 10 refreshes is a generous deadline
  // for "it comes back"; how fast it comes back is the WARN's figure.
  const bool ready = eventually([&] { return readyz_is(port, 200); }, 10s, 10ms);
  WARN("/readyz turned 200 " << ms_since(back_at) << " ms after Postgres accepted connections");
  CHECK(ready);
  f.reset();
}

// ---------------------------------------------------------------------------------------------
// 4. The client address behind a proxy; failed credential lookups

TEST_CASE("behind a trusted proxy the open rate is counted per X-Forwarded-For address and from "
          "an untrusted peer the header is ignored") {
  Fixture f(json{{"trusted_proxies", {"127.0.0.2"}}});
  // 12 anonymous opens through the proxy, each for another client: none is rate limited.
  {
    std::vector<WsClient> opens;
    for (int i = 0; i < 12; ++i)
      opens.push_back(open_ws(f.port, "127.0.0.2",
                              {{"X-Forwarded-For", "10.0.0." + std::to_string(i + 1)}}));
    for (auto& ws : opens) {
      const auto o = outcome_of(ws);
      CHECK(o.code == "unauthorized");
      CHECK(o.close_code == 1008);
    }
  }
  // 6 from the same client (the right-most hop not trusted, whatever the client wrote to its
  // left): the 6th is rate limited.
  {
    std::vector<WsClient> opens;
    for (int i = 0; i < 6; ++i)
      opens.push_back(open_ws(
          f.port, "127.0.0.2",
          {{"X-Forwarded-For", i % 2 == 0 ? "10.0.1.1" : "203.0.113.7, 10.0.1.1, 127.0.0.2"}}));
    for (int i = 0; i < 6; ++i) {
      INFO("open " << i);
      const auto o = outcome_of(opens[i]);
      CHECK(o.code == (i < 5 ? "unauthorized" : "rate_limited"));
      CHECK(o.close_code == (i < 5 ? 1008 : 1013));
    }
  }
  // The same header from a peer that is not a trusted proxy is ignored: 6 opens with 6 distinct
  // X-Forwarded-For values all count for 127.0.0.3.
  {
    std::vector<WsClient> opens;
    for (int i = 0; i < 6; ++i)
      opens.push_back(open_ws(f.port, "127.0.0.3",
                              {{"X-Forwarded-For", "10.0.2." + std::to_string(i + 1)}}));
    for (int i = 0; i < 6; ++i) {
      INFO("open " << i);
      const auto o = outcome_of(opens[i]);
      CHECK(o.code == (i < 5 ? "unauthorized" : "rate_limited"));
      CHECK(o.close_code == (i < 5 ? 1008 : 1013));
    }
  }
}

TEST_CASE("X-Forwarded-For in several header lines is one list: a client's own line does not "
          "name the client") {
  // HAProxy's `option forwardfor` adds a line after the client's instead of extending it. 6 opens
  // through the proxy, each with another address in the client's line and the same one in the
  // proxy's: all count for that one, the 6th is rate limited.
  Fixture f(json{{"trusted_proxies", {"127.0.0.2"}}});
  std::vector<WsClient> opens;
  for (int i = 0; i < 6; ++i)
    opens.push_back(open_ws(f.port, "127.0.0.2",
                            {{"X-Forwarded-For", "10.0.3." + std::to_string(i + 1)},
                             {"X-Forwarded-For", "10.0.4.1"}}));
  for (int i = 0; i < 6; ++i) {
    INFO("open " << i);
    const auto o = outcome_of(opens[i]);
    CHECK(o.code == (i < 5 ? "unauthorized" : "rate_limited"));
    CHECK(o.close_code == (i < 5 ? 1008 : 1013));
  }
}

TEST_CASE("20 garbage session cookies from one address within a second cost at most 5 lookups and "
          "the rest are rate limited with 1013") {
  Fixture f(json{{"trusted_proxies", {"127.0.0.2"}}});
  const int64_t before = scalar(f.db, "SELECT count(*) FROM t.lookups");
  const auto start = Clock::now();
  std::vector<WsClient> opens;
  for (int i = 0; i < 20; ++i)
    opens.push_back(
        open_ws(f.port, "127.0.0.5", {{"Cookie", "session=garbage-" + std::to_string(i)}}));
  const double opening_ms = ms_since(start);
  // Within the same second a valid session from that address is turned away too (no lookup)...
  auto ada = open_ws(f.port, "127.0.0.5", {{"Cookie", kAdaCookie}});
  // ...while another address's garbage is looked up as usual.
  auto elsewhere = open_ws(f.port, "127.0.0.6", {{"Cookie", "session=garbage-x"}});
  const double all_ms = ms_since(start);
  int unauthorized = 0, limited = 0;
  for (auto& ws : opens) {
    const auto o = outcome_of(ws);
    if (o.code == "unauthorized" && o.close_code == 1008) ++unauthorized;
    if (o.code == "rate_limited" && o.close_code == 1013) ++limited;
  }
  const auto a = outcome_of(ada);
  const auto e = outcome_of(elsewhere);
  const int64_t lookups = scalar(f.db, "SELECT count(*) FROM t.lookups") - before;
  WARN("20 garbage opens in " << opening_ms << " ms: " << lookups << " lookups, " << unauthorized
                              << " unauthorized, " << limited << " rate_limited");
  REQUIRE(all_ms < 1000);  // the bound below is for one second
  CHECK(lookups <= 5 + 1);  // + the other address's one
  CHECK(lookups == unauthorized + 1);  // every lookup was a refusal; no refusal without one
  CHECK(unauthorized <= 5);
  CHECK(unauthorized >= 1);
  CHECK(unauthorized + limited == 20);
  CHECK(a.code == "rate_limited");
  CHECK(a.close_code == 1013);
  CHECK(e.code == "unauthorized");
  // The second over, the person with a valid session behind that address is served.
  const auto limited_at = Clock::now();
  bool served = eventually(
      [&] {
        auto ws = open_ws(f.port, "127.0.0.5", {{"Cookie", kAdaCookie}});
        ws.send(sub("w").dump());
        auto r = ws.next(5s);
        return !r.closed && !r.timed_out && r.json()["type"] == "subscribed";
      },
      3s, 100ms);
  WARN("the valid session from that address was served again after " << ms_since(limited_at)
                                                                        << " ms");
  CHECK(served);
}

// ---------------------------------------------------------------------------------------------
// 5. Malformed requests and oversized headers

TEST_CASE("a malformed request line is answered 400 and headers past 16 KiB 431 and each is closed") {
  Fixture f;
  {
    Raw c(f.port);
    REQUIRE(c.send("GARBAGE\r\n\r\n"));
    const auto e = c.read_to_end(3s);
    INFO(e.data);
    CHECK(e.closed);
    CHECK(starts_with(e.data, "HTTP/1.1 400"));
  }
  {
    Raw c(f.port);
    REQUIRE(c.send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"));
    for (int i = 0; i < 17; ++i)  // 17 headers of 1 KiB each
      REQUIRE(c.send("X-Pad-" + std::to_string(i) + ": " + std::string(1000, 'p') + "\r\n"));
    c.send("\r\n");
    const auto e = c.read_to_end(3s);
    INFO(e.data.substr(0, 200));
    CHECK(e.closed);
    CHECK(starts_with(e.data, "HTTP/1.1 431"));
  }
  // Just under 16 KiB is a request like any other.
  CHECK(starts_with(raw_get(f.port, "127.0.0.1", "/healthz",
                            "X-Pad: " + std::string(15 * 1024, 'p') + "\r\n"),
                    "HTTP/1.1 200"));
  // The replica serves on.
  CHECK(http_get(f.port, "/healthz").first == 200);
}

// Every process of an embedded Postgres stopped with SIGSTOP: a server that stops answering rather
// than refusing. Whatever happens, it runs again when this goes (before the replica stops).
struct FrozenPostgres {
  explicit FrozenPostgres(const std::string& data_dir) {
    std::ifstream(data_dir + "/data/postmaster.pid") >> postmaster;
    REQUIRE(postmaster > 0);
  }
  FrozenPostgres(const FrozenPostgres&) = delete;
  FrozenPostgres& operator=(const FrozenPostgres&) = delete;
  ~FrozenPostgres() { thaw(); }

  // The postmaster and its children (each backend is a session of its own, so not its group).
  std::vector<pid_t> processes() const {
    std::vector<pid_t> out{postmaster};
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
      const std::string name = entry.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream stat(entry.path() / "stat");
      std::string line;
      std::getline(stat, line);
      const auto close = line.rfind(')');
      if (close == std::string::npos) continue;
      std::istringstream rest(line.substr(close + 2));
      char state;
      pid_t ppid = 0;
      rest >> state >> ppid;
      if (ppid == postmaster) out.push_back(std::stoi(name));
    }
    return out;
  }
  // The postmaster first, so that it forks nothing more; then its children as they are now. A
  // child may end meanwhile (an autovacuum worker, a connection closing): nothing to stop there.
  void freeze() {
    frozen = ::kill(postmaster, SIGSTOP) == 0;
    pids = processes();
    for (pid_t p : pids) {
      if (p != postmaster && ::kill(p, SIGSTOP) != 0 && errno != ESRCH) frozen = false;
    }
  }
  void thaw() {
    for (pid_t p : pids) ::kill(p, SIGCONT);
    if (postmaster > 0) ::kill(postmaster, SIGCONT);
    pids.clear();
    frozen = false;
  }

  pid_t postmaster = 0;
  std::vector<pid_t> pids;
  bool frozen = false;
};

TEST_CASE("Postgres frozen: /readyz turns 503 within 5 s without waiting on it and 200 again "
          "once Postgres answers") {
  // A server that stops answering (SIGSTOP of every Postgres process) rather than refusing: the
  // background check hangs in its query; readiness must not keep the last verdict.
  OwnPostgres own;
  auto& options = own.options;
  const std::string db = own.db;
  std::optional<Fixture> f;
  f.emplace(json::object(), db);
  const int port = f->port;
  FrozenPostgres thaw(options.data_dir);
  thaw.freeze();
  INFO(thaw.pids.size() << " Postgres processes");
  REQUIRE(thaw.pids.size() > 2);
  REQUIRE(thaw.frozen);
  const auto frozen_at = Clock::now();
  const bool down = eventually([&] { return readyz_is(port, 503); }, 5s, 10ms);
  WARN("/readyz turned 503 " << ms_since(frozen_at) << " ms after Postgres froze");
  CHECK(down);
  double worst = 0;
  for (int i = 0; i < 20; ++i) {
    const auto start = Clock::now();
    CHECK(http_get(port, "/readyz").first == 503);
    CHECK(http_get(port, "/healthz").first == 200);
    worst = std::max(worst, ms_since(start));
  }
  WARN("frozen Postgres: slowest /readyz + /healthz pair " << worst << " ms");
  // SPEC 6 rev 2: each within 50 ms; twice that each here (a wait on the frozen Postgres would be
  // seconds).
  CHECK(worst < 200);
  CHECK(metric(port, R"(outlive_ready{part="postgres"})") == 0);
  thaw.thaw();
  const auto thawed_at = Clock::now();
  const bool up = eventually([&] { return readyz_is(port, 200); }, 10s, 10ms);  // see above
  WARN("/readyz turned 200 " << ms_since(thawed_at) << " ms after Postgres was resumed");
  CHECK(up);
  f.reset();
}

TEST_CASE("SIGTERM while Postgres is frozen: every socket closes with 1012 and the replica stops "
          "and exits within 10 s") {
  // SPEC 6: SIGTERM closes every socket with 1012 and the replica exits. A database that stops
  // answering must not keep it running: its queries hang, so stopping may not wait on them.
  OwnPostgres own;
  auto& options = own.options;
  const std::string db = own.db;
  load_schema(db);
  harness::EmbeddedNats nats;
  const int port = harness::free_port();
  auto cfg = edge_config(db, nats.url(), json::object());
  cfg["listen"] = "127.0.0.1:" + std::to_string(port);
  const std::string dir = harness::make_temp_dir("outlive-edges-frozen-stop-");
  std::ofstream(dir + "/c.json") << cfg.dump();
  const std::string log = dir + "/log";
  std::optional<harness::ChildProcess> replica;
  replica.emplace(std::vector<std::string>{outlive_binary(), "serve", "--config", dir + "/c.json"},
                  log);
  REQUIRE(eventually([&] { return readyz_is(port, 200); }, 20s, 20ms));
  std::vector<WsClient> sockets;
  for (int i = 0; i < 3; ++i) {
    sockets.push_back(open_ws(port, "127.0.0.1", {{"Cookie", kAdaCookie}}));
    sockets.back().send(sub("w").dump());
    sockets.back().next_of_type("subscribed");
  }
  // An update on the way, so that the publisher has work in hand when the database stops.
  publish(db, kNorth, {{"type", "item.changed"}, {"itemId", "before"}});
  for (auto& ws : sockets) CHECK(ws.next_of_type("update", 5s)["data"]["itemId"] == "before");

  FrozenPostgres frozen(options.data_dir);
  frozen.freeze();
  REQUIRE(frozen.frozen);
  // Long enough for the background work to be waiting on it (readiness every second).
  REQUIRE(eventually([&] { return readyz_is(port, 503); }, 5s, 10ms));
  const auto term_at = Clock::now();
  ::kill(replica->pid(), SIGTERM);
  for (auto& ws : sockets) CHECK(ws.wait_closed() == 1012);
  const double closed_ms = ms_since(term_at);
  const auto status = replica->wait_for(15s);
  const double exited_ms = ms_since(term_at);
  INFO(harness::tail_of_file(log));
  WARN("frozen Postgres: sockets closed " << closed_ms << " ms and the replica exited " << exited_ms
                                          << " ms after SIGTERM");
  REQUIRE(status);
  REQUIRE(WIFEXITED(*status));
  // The stop itself finished (what waited on the database was cut short), before serve's own
  // bound of 10 s would have ended the process with 1.
  const auto said = [&](const std::string& text) {
    return harness::tail_of_file(log).find(text) != std::string::npos;
  };
  CHECK(WEXITSTATUS(*status) == 0);
  CHECK(said("replica stopped"));
  CHECK(exited_ms < 10000);

  // A second SIGTERM while the stop waits ends it at once.
  frozen.thaw();
  std::filesystem::remove(log);
  replica.emplace(std::vector<std::string>{outlive_binary(), "serve", "--config", dir + "/c.json"},
                  log);
  REQUIRE(eventually([&] { return readyz_is(port, 200); }, 20s, 20ms));
  frozen.freeze();
  REQUIRE(frozen.frozen);
  REQUIRE(eventually([&] { return readyz_is(port, 503); }, 5s, 10ms));
  ::kill(replica->pid(), SIGTERM);
  REQUIRE(eventually([&] { return said("\"stopping\""); }, 5s, 10ms));
  const auto second_at = Clock::now();
  ::kill(replica->pid(), SIGTERM);
  const auto second = replica->wait_for(5s);
  WARN("frozen Postgres: the replica exited " << ms_since(second_at)
                                              << " ms after the second SIGTERM");
  INFO(harness::tail_of_file(log));
  REQUIRE(second);
  REQUIRE(WIFEXITED(*second));
  CHECK((WEXITSTATUS(*second) == 0 || (WEXITSTATUS(*second) == 1 && said("a second stop signal"))));
  replica.reset();
  frozen.thaw();
  harness::remove_tree(dir);
}
