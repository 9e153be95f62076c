// A socket's Checks against a fake socket: the deadline (scaled down from 10 s), answers from
// other threads, failures and a full pool. The context is a real one with no apps; its pool is
// stopped, so it refuses every task and never connects. No sockets, no database.
#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include <catch2/catch.hpp>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "config/config.hpp"
#include "db/pool.hpp"
#include "session/checks.hpp"
#include "session/context.hpp"

using namespace outlive;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

class FakeSocket final : public session::CheckedSocket {
 public:
  explicit FakeSocket(boost::asio::io_context& io) : io_(io) {}
  boost::asio::any_io_executor executor() override { return io_.get_executor(); }
  std::shared_ptr<void> keep_alive() override { return alive; }
  bool closing() const override { return is_closing; }
  bool closed() const override { return is_closing; }
  void check_timed_out() override {
    ++timeouts;
    is_closing = true;  // as the session does: it closes with 1011
  }
  void check_failed(const std::string& error) override {
    failures.push_back(error);
    is_closing = true;
  }

  std::shared_ptr<int> alive = std::make_shared<int>(0);
  bool is_closing = false;
  int timeouts = 0;
  std::vector<std::string> failures;

 private:
  boost::asio::io_context& io_;
};

struct Fixture {
  explicit Fixture(std::chrono::milliseconds check_timeout)
      : pool("postgresql://127.0.0.1:1/unused", 1),
        context(config::Config{}, services(pool), settings(check_timeout)),
        socket(io),
        checks(context, socket) {
    pool.stop();
  }
  static session::Services services(db::Pool& pool) {
    session::Services s;
    s.pool = &pool;
    return s;
  }
  static session::Settings settings(std::chrono::milliseconds check_timeout) {
    session::Settings s;
    s.io_threads = 1;
    s.check_timeout = check_timeout;
    return s;
  }
  // Runs the socket's thread until `done` or `limit` passed.
  template <class Done>
  void run_until(Done done, std::chrono::milliseconds limit = 5s) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (!done() && std::chrono::steady_clock::now() < until) {
      io.restart();
      io.run_one_for(10ms);
    }
  }
  void run_for(std::chrono::milliseconds d) {
    io.restart();
    io.run_for(d);
  }

  db::Pool pool;
  session::Context context;
  boost::asio::io_context io;
  FakeSocket socket;
  session::Checks checks;
};

}  // namespace

TEST_CASE(
    "checks: an answer from another thread within the deadline reaches then on the socket's "
    "thread") {
  Fixture f(2s);
  std::optional<json> got;
  std::thread::id ran_on;
  std::thread worker;
  f.checks.run_async(
      [&](session::Checks::Reply reply) {
        worker = std::thread([reply] { reply(json{{"keys", {"k1"}}}, ""); });
      },
      [&](const json& result) {
        got = result;
        ran_on = std::this_thread::get_id();
      });
  f.run_until([&] { return got.has_value(); });
  worker.join();
  REQUIRE(got);
  CHECK((*got)["keys"] == json{"k1"});
  CHECK(ran_on == std::this_thread::get_id());  // the test's thread runs the socket's io_context
  // Its deadline was cancelled: nothing closes the socket later.
  f.run_for(2100ms);
  CHECK(f.socket.timeouts == 0);
  CHECK(f.socket.failures.empty());
  CHECK_FALSE(f.socket.is_closing);
}

TEST_CASE("checks: no answer within the deadline times the check out, a late answer is dropped") {
  Fixture f(100ms);
  session::Checks::Reply later;
  bool then_ran = false;
  const auto started = std::chrono::steady_clock::now();
  f.checks.run_async([&](session::Checks::Reply reply) { later = std::move(reply); },
                     [&](const json&) { then_ran = true; });
  f.run_until([&] { return f.socket.timeouts > 0; });
  CHECK(f.socket.timeouts == 1);
  CHECK(std::chrono::steady_clock::now() - started >= 100ms);
  later(json(true), "");
  f.run_for(50ms);
  CHECK_FALSE(then_ran);
  CHECK(f.socket.failures.empty());
}

TEST_CASE("checks: a failed check closes as failed and never reaches then") {
  Fixture f(2s);
  bool then_ran = false;
  f.checks.run_async([&](session::Checks::Reply reply) { reply(nullptr, "authorize failed"); },
                     [&](const json&) { then_ran = true; });
  f.run_until([&] { return !f.socket.failures.empty(); });
  CHECK(f.socket.failures == std::vector<std::string>{"authorize failed"});
  CHECK_FALSE(then_ran);
  CHECK(f.socket.timeouts == 0);
}

TEST_CASE("checks: a check of a closing socket answers nothing and does not time out") {
  Fixture f(100ms);
  session::Checks::Reply later;
  bool then_ran = false;
  f.checks.run_async([&](session::Checks::Reply reply) { later = std::move(reply); },
                     [&](const json&) { then_ran = true; });
  f.socket.is_closing = true;
  f.run_for(200ms);
  later(json(1), "");
  f.run_for(50ms);
  CHECK_FALSE(then_ran);
  CHECK(f.socket.timeouts == 0);
  CHECK(f.socket.failures.empty());
}

TEST_CASE("checks: two checks never cancel each other") {
  Fixture f(2s);
  session::Checks::Reply first, second;
  std::vector<int> answered;
  f.checks.run_async([&](session::Checks::Reply reply) { first = std::move(reply); },
                     [&](const json& r) { answered.push_back(r.get<int>()); });
  f.checks.run_async([&](session::Checks::Reply reply) { second = std::move(reply); },
                     [&](const json& r) { answered.push_back(r.get<int>()); });
  second(json(2), "");
  f.run_until([&] { return answered.size() == 1; });
  first(json(1), "");
  f.run_until([&] { return answered.size() == 2; });
  CHECK(answered == std::vector<int>{2, 1});
  CHECK_FALSE(f.socket.is_closing);
}

TEST_CASE("checks: a pool with no room fails the check at once") {
  Fixture f(2s);  // its pool is stopped: it takes no task
  bool worked = false, then_ran = false;
  f.checks.run([&](db::Connection&) { return json(worked = true); },
               [&](const json&) { then_ran = true; });
  f.run_until([&] { return !f.socket.failures.empty(); }, 1s);
  CHECK(f.socket.failures == std::vector<std::string>{"the database pool has no room"});
  CHECK_FALSE(worked);
  CHECK_FALSE(then_ran);
}
