#pragma once
// A replica whose sockets take JWTs (HS256 from a secret file the test writes) on a fresh
// PostgreSQL database with the inventory tables and a real nats-server, and the helpers its tests
// share (tests/session/jwt_socket_test.cpp, disconnect_test.cpp). Header-only, one per test binary.
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <pqxx/pqxx>
#include <thread>

#include "config/config.hpp"
#include "replica/replica.hpp"
#include "support/frames.hpp"
#include "support/inventory.hpp"
#include "support/jwt_signer.hpp"
#include "support/services.hpp"
#include "support/ws_client.hpp"

using namespace outlive;
using namespace outlive::testing;
using namespace std::chrono_literals;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kSecret = "a-test-secret-of-at-least-32-bytes!!";

// A token for `sub`, valid from a minute ago until `exp_in` seconds from now.
inline json token_claims(const std::string& sub, int64_t exp_in = 3600) {
  const int64_t now = unix_now();
  return {{"sub", sub}, {"iat", now - 60}, {"exp", now + exp_in}, {"aud", "inventory"}};
}

// A socket of the app on the replica at `port`, with `token` as Bearer.
inline WsClient bearer_socket(int port, const std::string& token) {
  return WsClient(port, "/api/inventory/live", {{"Authorization", "Bearer " + token}});
}

struct Fixture {
  explicit Fixture(json jwt_extra = json::object()) : db(fresh_database()) {
    {
      pqxx::connection c(db);
      pqxx::work tx(c);
      tx.exec(kInventoryTables + kAdaSeed);
      tx.commit();
    }
    const auto dir = std::filesystem::temp_directory_path() /
                     ("outlive-jwt-" + std::to_string(::getpid()) + "-" +
                      std::to_string(Clock::now().time_since_epoch().count()));
    std::filesystem::create_directories(dir);
    secret_file = (dir / "secret").string();
    std::ofstream(secret_file) << kSecret << "\n";
    json channels = {{"warehouse",
                      {{"scope", kWarehouseScopeSchema},
                       {"keys", kWarehouseKeys},
                       {"authorize", kWarehouseAuthorize}}}};
    cfg = inventory_replica_config(db, nats.url(), "r1", channels);
    json jwt = {{"hmac_secret_file", secret_file},
                {"algorithms", {"HS256"}},
                {"audience", "inventory"},
                {"cookie", "idp_token"}};
    jwt.update(jwt_extra);
    cfg["auth"]["jwt"] = jwt;
    replica = std::make_unique<replica::Replica>(config::parse(cfg));
    REQUIRE(eventually([&] { return http_get(port(), "/readyz").first == 200; }, 30s, 20ms));
  }

  int port() const { return replica->port(); }

  // Another replica of the same app, database and NATS, started now and ready.
  std::unique_ptr<replica::Replica> another_replica(const std::string& name) {
    json c = cfg;
    c["replica"] = name;
    auto r = std::make_unique<replica::Replica>(config::parse(c));
    REQUIRE(eventually([&] { return http_get(r->port(), "/readyz").first == 200; }, 30s, 20ms));
    return r;
  }

  std::string token(const json& payload) const { return key.sign(payload); }

  WsClient open_bearer(const std::string& token) { return bearer_socket(port(), token); }

  void publish(const std::string& key_, const json& data) {
    pqxx::connection c(db);
    pqxx::work tx(c);
    tx.exec_params("SELECT events.publish_live('inventory', $1, $2::jsonb)", key_, data.dump());
    tx.commit();
    pqxx::nontransaction(c).exec("SELECT events.wake('inventory')");
  }

  std::string db;
  harness::EmbeddedNats nats;
  std::string secret_file;
  json cfg;
  TestKey key = TestKey::hmac(kSecret);
  std::unique_ptr<replica::Replica> replica;
};

inline json sub(const std::string& id, const std::optional<std::string>& cursor = std::nullopt) {
  json m = {{"type", "sub"}, {"id", id}, {"channel", "warehouse"}, {"scope", kNorthScope}};
  if (cursor) m["cursor"] = *cursor;
  return m;
}

inline json auth_message(const std::string& token) { return {{"type", "auth"}, {"token", token}}; }

// The error frame and the close a refused socket receives.
inline void require_refused(WsClient& ws, const std::string& code = "unauthorized", int close = 1008) {
  const auto error = ws.next_of_type("error");
  CHECK(error["code"] == code);
  CHECK(ws.wait_closed() == close);
}

}  // namespace
