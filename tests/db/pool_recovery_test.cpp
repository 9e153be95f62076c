// The pool after its connections died (issue 47 items 2 and 6), against a real PostgreSQL 15:
// backends ended with pg_terminate_backend, as a restart ends them, while the pool sat idle or
// while a task ran.
#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <pqxx/pqxx>
#include <string>

#include "db/connection.hpp"
#include "db/pool.hpp"
#include "support/services.hpp"

using namespace std::chrono_literals;
namespace db = outlive::db;
using outlive::testing::eventually;

namespace {

// Ends every backend of the pool ("outlive-pool"), as a Postgres restart does; returns how many.
int terminate_pool_backends(const std::string& url) {
  pqxx::connection c(url);
  return pqxx::nontransaction(c)
      .exec1(
          "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
          "WHERE application_name = 'outlive-pool'")[0]
      .as<int>();
}

int pool_backends(const std::string& url) {
  pqxx::connection c(url);
  return pqxx::nontransaction(c)
      .exec1("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'outlive-pool'")[0]
      .as<int>();
}

// Runs `SELECT 1` through the pool; the error when it failed, "" when it answered.
std::string check(db::Pool& pool) {
  auto answer = std::make_shared<std::promise<std::string>>();
  auto got = answer->get_future();
  REQUIRE(pool.post([answer](db::Connection& conn) {
    try {
      pqxx::nontransaction(conn.raw()).exec("SELECT 1");
      answer->set_value("");
    } catch (const std::exception& e) {
      answer->set_value(e.what());
    }
  }));
  REQUIRE(got.wait_for(10s) == std::future_status::ready);
  return got.get();
}

}  // namespace

TEST_CASE("pool: connections whose backends ended while idle fail no check and are replaced") {
  const auto url = outlive::testing::fresh_database(false);
  db::PoolOptions options;
  options.workers = 4;
  options.backend_heap_prime = 0;
  db::Pool pool(url, options);
  // Every worker connected: four checks that wait for each other.
  {
    std::vector<std::future<void>> running;
    auto gate = std::make_shared<std::promise<void>>();
    auto open = gate->get_future().share();
    std::vector<std::shared_ptr<std::promise<void>>> started;
    for (int i = 0; i < 4; ++i) {
      auto s = std::make_shared<std::promise<void>>();
      running.push_back(s->get_future());
      REQUIRE(pool.post([s, open](db::Connection& conn) {
        pqxx::nontransaction(conn.raw()).exec("SELECT 1");
        s->set_value();
        open.wait();
      }));
    }
    for (auto& r : running) REQUIRE(r.wait_for(10s) == std::future_status::ready);
    gate->set_value();
  }
  REQUIRE(eventually([&] { return pool_backends(url) == 4; }, 10s));
  REQUIRE(terminate_pool_backends(url) == 4);
  REQUIRE(eventually([&] { return pool_backends(url) == 0; }, 10s));
  for (int i = 0; i < 40; ++i) CHECK(check(pool) == "");
  CHECK(pool.replaced() >= 1);
  CHECK(pool.serving());
}

TEST_CASE("pool: a task whose connection dies under it retries once on a fresh one") {
  const auto url = outlive::testing::fresh_database(false);
  db::PoolOptions options;
  options.workers = 1;
  options.backend_heap_prime = 0;
  db::Pool pool(url, options);
  REQUIRE(check(pool) == "");
  auto result = std::make_shared<std::promise<std::pair<std::string, int>>>();
  auto got = result->get_future();
  REQUIRE(pool.post([result, url](db::Connection& conn) {
    int attempts = 0;
    std::string error;
    for (bool again = true;;) {
      ++attempts;
      try {
        pqxx::nontransaction tx(conn.raw());
        if (attempts == 1) {  // its backend ends between two statements of the check
          const int pid = tx.exec1("SELECT pg_backend_pid()")[0].as<int>();
          pqxx::connection other(url);
          pqxx::nontransaction(other).exec("SELECT pg_terminate_backend(" + std::to_string(pid) +
                                           ")");
        }
        tx.exec("SELECT 1");
        error.clear();
      } catch (const std::exception& e) {
        error = e.what();
        if (std::exchange(again, false) && db::reopen_if_lost(conn, &e)) continue;
      }
      break;
    }
    result->set_value({error, attempts});
  }));
  REQUIRE(got.wait_for(10s) == std::future_status::ready);
  const auto [error, attempts] = got.get();
  CHECK(error == "");
  CHECK(attempts == 2);
  CHECK(pool.replaced() == 1);
  CHECK(check(pool) == "");
}

TEST_CASE("pool: a statement's own error is not a lost connection and is not retried") {
  const auto url = outlive::testing::fresh_database(false);
  db::Pool pool(url, 1);
  auto result = std::make_shared<std::promise<bool>>();
  auto got = result->get_future();
  REQUIRE(pool.post([result](db::Connection& conn) {
    try {
      pqxx::nontransaction(conn.raw()).exec("SELECT 1/0");
      result->set_value(false);
    } catch (const std::exception& e) {
      result->set_value(db::reopen_if_lost(conn, &e));
    }
  }));
  REQUIRE(got.wait_for(10s) == std::future_status::ready);
  CHECK_FALSE(got.get());
  CHECK(pool.replaced() == 0);
  CHECK(pool.serving());
}

TEST_CASE("pool: a connection outside the pool is never reopened") {
  pqxx::connection raw(outlive::testing::fresh_database(false));
  db::Connection conn(raw);
  raw.disconnect();
  CHECK_FALSE(db::reopen_if_lost(conn));
}

TEST_CASE("pool: not serving from a lost connection until a check answers again") {
  const auto url = outlive::testing::fresh_database(false);
  db::PoolOptions options;
  options.workers = 1;
  options.backend_heap_prime = 0;
  db::Pool pool(url, options);
  REQUIRE(check(pool) == "");
  REQUIRE(pool.serving());
  // A task that does not retry, whose backend ends under it: its check fails, and readiness
  // (Pool::serving) must say so rather than 200.
  auto done = std::make_shared<std::promise<void>>();
  auto finished = done->get_future();
  REQUIRE(pool.post([done, url](db::Connection& conn) {
    try {
      pqxx::nontransaction tx(conn.raw());
      const int pid = tx.exec1("SELECT pg_backend_pid()")[0].as<int>();
      pqxx::connection other(url);
      pqxx::nontransaction(other).exec("SELECT pg_terminate_backend(" + std::to_string(pid) + ")");
      tx.exec("SELECT 1");
    } catch (const std::exception&) {
    }
    done->set_value();
  }));
  REQUIRE(finished.wait_for(10s) == std::future_status::ready);
  CHECK(eventually([&] { return !pool.serving(); }, 5s));
  CHECK(pool.healthy());  // what readiness asks next: a fresh connection answers
  // (the worker marks it once the ping task has returned, just after the ping answered)
  CHECK(eventually([&] { return pool.serving(); }, 5s));
}
