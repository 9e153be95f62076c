#pragma once
// An in-process replica on a fresh database and a nats-server of its own, as the websocket test
// files start one: each brings its schema (people, sessions, keys) and its configuration; this
// loads the one, starts the other and waits until the replica is ready. Header-only: the test
// binaries that use it link the replica and config libraries, outlive_test_support does not.
#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>
#include <string>

#include "config/config.hpp"
#include "harness/embedded_nats.hpp"
#include "replica/replica.hpp"
#include "support/services.hpp"
#include "support/ws_client.hpp"

namespace outlive::testing {

struct ReplicaFixture {
  // The configuration for the database and NATS URLs the fixture made.
  using MakeConfig =
      std::function<nlohmann::json(const std::string& database, const std::string& nats)>;

  // `schema`: SQL run on the database first. `database`: an existing one instead of a fresh one.
  ReplicaFixture(const std::string& schema, const MakeConfig& make_config,
                 std::string database = "")
      : db(database.empty() ? fresh_database() : std::move(database)) {
    sql(schema);
    replica = std::make_unique<replica::Replica>(config::parse(make_config(db, nats.url())));
    port = replica->port();
    const int ops = replica->admin_port() ? replica->admin_port() : port;
    REQUIRE(eventually(
        [&] {
          try {
            return http_get(ops, "/readyz").first == 200;
          } catch (...) {
            return false;  // (a connection refused while it starts)
          }
        },
        std::chrono::seconds(20), std::chrono::milliseconds(20)));
  }

  void sql(const std::string& statements) {
    pqxx::connection c(db);
    pqxx::work tx(c);
    tx.exec(statements);
    tx.commit();
  }

  // An update of the app "inventory", and the publisher woken for it.
  void publish(const std::string& key, const nlohmann::json& data) {
    pqxx::connection c(db);
    pqxx::work tx(c);
    tx.exec_params("SELECT events.publish_live('inventory', $1, $2::jsonb)", key, data.dump());
    tx.commit();
    pqxx::nontransaction(c).exec("SELECT events.wake('inventory')");
  }

  std::string db;
  harness::EmbeddedNats nats;
  std::unique_ptr<replica::Replica> replica;
  int port = 0;
};

}  // namespace outlive::testing
