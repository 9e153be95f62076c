// The pool's two urgencies (db/pool.hpp, issue 46): a gathering task (a joined authorize() call)
// stands aside while sockets' own questions wait, for at most `gathering_wait`; an idle pool runs
// it at once. Against a real PostgreSQL 15, one worker, whose order of work the tasks record.
#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "db/connection.hpp"
#include "db/pool.hpp"
#include "support/services.hpp"

using namespace std::chrono_literals;
namespace db = outlive::db;

namespace {

struct Order {
  std::mutex mutex;
  std::vector<std::string> ran;
  std::promise<void> all;
  size_t expected = 0;
  void record(const std::string& name) {
    std::lock_guard lock(mutex);
    ran.push_back(name);
    if (ran.size() == expected) all.set_value();
  }
};

// One worker, held by a task until the returned promise is set (the worker has started it).
std::shared_ptr<std::promise<void>> hold(db::Pool& pool) {
  auto gate = std::make_shared<std::promise<void>>();
  auto started = std::make_shared<std::promise<void>>();
  auto running = started->get_future();
  REQUIRE(pool.post([open = gate->get_future().share(), started](db::Connection&) {
    started->set_value();
    open.wait();
  }));
  REQUIRE(running.wait_for(10s) == std::future_status::ready);
  return gate;
}

db::PoolOptions one_worker(std::chrono::milliseconds gathering_wait) {
  db::PoolOptions options;
  options.workers = 1;
  options.backend_heap_prime = 0;
  options.gathering_wait = gathering_wait;
  return options;
}

void post(db::Pool& pool, Order& order, const std::string& name, db::Urgency urgency) {
  REQUIRE(pool.post([&order, name](db::Connection&) { order.record(name); }, {}, urgency));
}

// The order one worker runs `tasks` in, all posted while it was held.
std::vector<std::string> order_of(db::Pool& pool,
                                  const std::vector<std::pair<std::string, db::Urgency>>& tasks) {
  Order order;
  order.expected = tasks.size();
  auto done = order.all.get_future();
  auto gate = hold(pool);
  for (const auto& [name, urgency] : tasks) post(pool, order, name, urgency);
  CHECK(pool.waiting() == tasks.size());
  gate->set_value();
  REQUIRE(done.wait_for(10s) == std::future_status::ready);
  return order.ran;
}

}  // namespace

TEST_CASE("pool: a gathering task runs after the tasks that wait beside it") {
  db::Pool pool(outlive::testing::fresh_database(false), one_worker(60s));
  CHECK(order_of(pool, {{"gathering 1", db::Urgency::gathering},
                        {"now 1", db::Urgency::now},
                        {"gathering 2", db::Urgency::gathering},
                        {"now 2", db::Urgency::now}}) ==
        std::vector<std::string>{"now 1", "now 2", "gathering 1", "gathering 2"});
}

TEST_CASE("pool: a gathering task that waited gathering_wait goes first") {
  // A wait of zero: every gathering task has waited long enough when the worker is free.
  db::Pool pool(outlive::testing::fresh_database(false), one_worker(0ms));
  CHECK(order_of(pool, {{"now 1", db::Urgency::now},
                        {"gathering", db::Urgency::gathering},
                        {"now 2", db::Urgency::now}}) ==
        std::vector<std::string>{"gathering", "now 1", "now 2"});
}

TEST_CASE("pool: an idle pool runs a gathering task at once") {
  const auto url = outlive::testing::fresh_database(false);
  db::Pool pool(url, one_worker(60s));
  Order order;
  order.expected = 1;
  auto done = order.all.get_future();
  post(pool, order, "gathering", db::Urgency::gathering);
  // Far less than gathering_wait: it did not wait for it.
  REQUIRE(done.wait_for(10s) == std::future_status::ready);
  CHECK(order.ran == std::vector<std::string>{"gathering"});
}

TEST_CASE("pool: max_waiting counts the tasks of both urgencies") {
  const auto url = outlive::testing::fresh_database(false);
  auto options = one_worker(60s);
  options.max_waiting = 2;
  db::Pool pool(url, options);
  auto gate = hold(pool);
  CHECK(pool.post([](db::Connection&) {}, {}, db::Urgency::gathering));
  CHECK(pool.post([](db::Connection&) {}, {}, db::Urgency::now));
  CHECK_FALSE(pool.post([](db::Connection&) {}, {}, db::Urgency::gathering));
  CHECK_FALSE(pool.post([](db::Connection&) {}, {}, db::Urgency::now));
  CHECK(pool.waiting() == 2);
  gate->set_value();
}

TEST_CASE("pool: one gathering task at a time while another worker is free") {
  const auto url = outlive::testing::fresh_database(false);
  auto options = one_worker(60s);
  options.workers = 2;
  options.gathering_workers = 1;
  db::Pool pool(url, options);
  // The first gathering task holds its worker.
  auto gate = std::make_shared<std::promise<void>>();
  auto started = std::make_shared<std::promise<void>>();
  auto running = started->get_future();
  REQUIRE(pool.post(
      [open = gate->get_future().share(), started](db::Connection&) {
        started->set_value();
        open.wait();
      },
      {}, db::Urgency::gathering));
  REQUIRE(running.wait_for(10s) == std::future_status::ready);
  Order order;
  order.expected = 2;
  auto done = order.all.get_future();
  post(pool, order, "gathering", db::Urgency::gathering);
  post(pool, order, "now", db::Urgency::now);
  // The other worker answered the task posted after it, and left the gathering one waiting.
  REQUIRE(outlive::testing::eventually([&] {
    std::lock_guard lock(order.mutex);
    return order.ran.size() == 1;
  }));
  CHECK(pool.waiting() == 1);
  gate->set_value();
  REQUIRE(done.wait_for(10s) == std::future_status::ready);
  CHECK(order.ran == std::vector<std::string>{"now", "gathering"});
}
