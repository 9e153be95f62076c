// Logs an operator can use (SPEC 6; issue 35): 200 sockets failing the same way under a real
// `outlive serve` write a bounded number of lines, each naming its app, peer and socket, and the
// rest are counted in "(suppressed)" lines, so that nothing goes missing unaccounted. Real
// PostgreSQL and nats-server; every wait has a deadline.
#include <sys/wait.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "harness/embedded_nats.hpp"
#include "harness/process.hpp"
#include "support/inventory.hpp"
#include "support/services.hpp"
#include "support/sql.hpp"
#include "support/ws_client.hpp"

using namespace outlive;
using namespace outlive::testing;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

// Every session lookup fails the way a database being restored would: with an error, not an
// empty answer, so each socket logs "access check failed" and closes with 1011.
const std::string kBrokenSessions = kInventoryTables + R"SQL(
CREATE SCHEMA t;
CREATE FUNCTION t.broken(token text)
  RETURNS TABLE (subject text, actor text, scopes text[], app_session boolean)
  LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'sessions are being restored'; END $$;
)SQL";

std::vector<json> json_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> lines;
  std::string line;
  while (std::getline(in, line)) {
    auto doc = json::parse(line, nullptr, /*allow_exceptions=*/false);
    // Not JSON: kept as a string, so the test can fail on it.
    lines.push_back(doc.is_discarded() ? json(line) : doc);
  }
  return lines;
}

bool readyz_ok(int port) {
  try {
    return http_get(port, "/readyz").first == 200;
  } catch (...) {
    return false;
  }
}

}  // namespace

TEST_CASE(
    "200 sockets failing alike write a bounded number of lines naming app, peer and socket, "
    "and count the rest") {
  const std::string db = fresh_database();
  run_sql(db, kBrokenSessions);
  harness::EmbeddedNats nats;
  const int port = harness::free_port();
  json channels = {{"warehouse",
                    {{"scope", kWarehouseScopeSchema},
                     {"keys", kWarehouseKeys},
                     {"authorize", kWarehouseAuthorize}}}};
  json cfg = inventory_replica_config(db, nats.url(), "logs", channels);
  cfg["listen"] = "127.0.0.1:" + std::to_string(port);
  cfg["auth"]["sessions"] = "SELECT subject, actor, scopes, app_session FROM t.broken($1)";
  const std::string dir = harness::make_temp_dir("outlive-logs-");
  std::ofstream(dir + "/c.json") << cfg.dump();
  const std::string log = dir + "/log";
  harness::ChildProcess replica({outlive_binary(), "serve", "--config", dir + "/c.json"}, log);
  REQUIRE(eventually([&] { return readyz_ok(port); }, 30s, 20ms));

  // Each socket from an address of its own (X-Forwarded-For from a trusted 127.0.0.1), so that
  // no per-address limit refuses one before its lookup runs.
  constexpr int kSockets = 200;
  std::set<std::string> peers;
  std::vector<WsClient> sockets;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kSockets; ++i) {
    const std::string peer = "10.9." + std::to_string(i / 200) + "." + std::to_string(i % 200 + 1);
    peers.insert(peer);
    sockets.emplace_back(
        port, "/api/inventory/live",
        std::vector<std::pair<std::string, std::string>>{
            {"Cookie", "session=s" + std::to_string(i)}, {"X-Forwarded-For", peer}});
  }
  int closed_1011 = 0;
  for (auto& ws : sockets) closed_1011 += ws.wait_closed(15s) == 1011;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(closed_1011 == kSockets);

  // Written lines and reported counts add up to every failure, once the last window is reported.
  int written = 0;
  uint64_t suppressed = 0;
  const auto count = [&] {
    written = 0;
    suppressed = 0;
    for (const auto& l : json_lines(log)) {
      if (!l.is_object()) continue;
      if (l.value("msg", "") == "access check failed") ++written;
      if (l.value("msg", "") == "access check failed (suppressed)") {
        suppressed += l.value("suppressed", uint64_t{0});
      }
    }
    return written + suppressed >= kSockets;
  };
  const bool accounted = eventually(count, 10s, 50ms);
  INFO(harness::tail_of_file(log));
  WARN(kSockets << " failing sockets in " << seconds << " s: " << written << " lines written, "
                << suppressed << " suppressed");
  CHECK(accounted);
  CHECK(written + suppressed == kSockets);
  // At most the burst and then the rate over the time the sockets took (+1 s of slack for the
  // window the last of them fell in).
  CHECK(written >= 10);
  CHECK(written <= 10 + 10 * (seconds + 1));
  CHECK(written < kSockets);

  std::set<uint64_t> ids;
  for (const auto& l : json_lines(log)) {
    INFO(l.dump());
    REQUIRE(l.is_object());  // one format: every line of the replica is a JSON object
    CHECK(l.contains("time"));
    CHECK(l.value("logger", "") == "events:live");
    if (l.value("msg", "") == "access check failed (suppressed)") {
      CHECK(l.value("level", "") == "error");
      CHECK(l.value("suppressed", 0) > 0);
    }
    if (l.value("msg", "") != "access check failed") continue;
    CHECK(l.value("level", "") == "error");
    CHECK(l.value("app", "") == "inventory");
    CHECK(peers.count(l.value("peer", "")) == 1);
    REQUIRE(l.contains("socket"));
    REQUIRE(l["socket"].is_number_unsigned());
    CHECK(l["socket"].get<uint64_t>() > 0);
    CHECK(ids.insert(l["socket"].get<uint64_t>()).second);  // one line per socket
    CHECK_THAT(l.value("error", ""), Catch::Contains("sessions are being restored"));
  }
  CHECK(static_cast<int>(ids.size()) == written);

  const int status = replica.stop();
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  harness::remove_tree(dir);
}
