// The decider's joined authorize() for sockets catching up (Decider::authorize_viewer) against a
// real PostgreSQL 15 from the harness: viewers asked while the first one's task waits share one
// call and one place in the pool's bounded queue.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <mutex>
#include <numeric>
#include <outlive/channel.hpp>
#include <pqxx/pqxx>
#include <string>
#include <thread>
#include <vector>

#include "access/decider.hpp"
#include "db/connection.hpp"
#include "db/pool.hpp"
#include "harness/embedded_postgres.hpp"
#include "support/services.hpp"

using namespace std::chrono_literals;
using namespace outlive;
using outlive::testing::eventually;

namespace {

harness::EmbeddedPostgres& postgres() {
  static harness::EmbeddedPostgres instance;
  return instance;
}

std::string fresh_database() {
  static std::atomic<int> counter{0};
  const auto url = postgres().create_database("decider" + std::to_string(getpid()) + "_" +
                                              std::to_string(++counter));
  pqxx::connection c(url);
  pqxx::nontransaction(c).exec(
      "CREATE TABLE calls (n bigserial PRIMARY KEY, viewers int NOT NULL);"
      "CREATE TABLE members (subject text PRIMARY KEY);"
      "INSERT INTO members SELECT 'user:u' || i FROM generate_series(0, 999, 2) i");
  return url;
}

// Members only; every call is logged with its number of viewers.
config::Channel members_channel() {
  config::Channel ch;
  ch.authorize_sql =
      "WITH log AS (INSERT INTO calls(viewers) VALUES (jsonb_array_length($2)) RETURNING 1) "
      "SELECT v->>'id' AS id FROM jsonb_array_elements($2) v JOIN members m ON m.subject = "
      "v->>'id' WHERE (SELECT count(*) FROM log) = 1";
  return ch;
}

std::vector<int> calls(const std::string& url) {
  pqxx::connection c(url);
  std::vector<int> out;
  for (const auto& r : pqxx::nontransaction(c).exec("SELECT viewers FROM calls ORDER BY n"))
    out.push_back(r[0].as<int>());
  return out;
}

std::string viewer(int i) { return "user:u" + std::to_string(i); }
std::string viewer_json(int i) { return R"({"id":")" + viewer(i) + R"("})"; }

// Holds the pool's only worker until released, so what is posted next waits.
struct Blocker {
  std::promise<void> started, release;
  std::shared_future<void> released = release.get_future().share();
  db::Pool::Task task() {
    return [this](pqxx::connection&) {
      started.set_value();
      released.wait();
    };
  }
};

struct Answers {
  std::mutex mutex;
  std::vector<std::pair<std::string, access::AuthorizeAnswer>> got;
  std::function<void(access::AuthorizeAnswer)> to(const std::string& id) {
    return [this, id](access::AuthorizeAnswer a) {
      std::lock_guard lock(mutex);
      got.emplace_back(id, std::move(a));
    };
  }
  size_t size() {
    std::lock_guard lock(mutex);
    return got.size();
  }
};

// A decider on a fresh database whose pool has one worker (or `workers`), the first held by a
// blocker, and room for `waiting` tasks: with one worker, what is asked for next waits in the
// queue.
struct Held {
  explicit Held(size_t waiting, int workers = 1)
      : url(fresh_database()),
        pool(url, db::PoolOptions{workers, 15s, 2s, waiting}),
        decider(pool, decisions, 1000) {
    REQUIRE(pool.post(blocker.task()));
    blocker.started.get_future().wait();
  }
  ~Held() {
    if (!released) blocker.release.set_value();
  }
  void release() {
    released = true;
    blocker.release.set_value();
  }
  // Declared before the pool: its workers use them until the pool is gone.
  Blocker blocker;
  const config::Channel channel = members_channel();
  bool released = false;
  std::string url;
  db::Pool pool;
  access::Decisions decisions;
  access::Decider decider;
};

}  // namespace

TEST_CASE("1,200 sockets of 1,000 viewers catching up at once share 2 authorize calls") {
  // One worker and room for 4 waiting tasks: 1,200 tasks of one viewer each would be refused.
  Held held(4);
  auto& decider = held.decider;
  const auto& channel = held.channel;
  Answers answers;
  const uint64_t generation = held.decisions.generation("k");
  for (int v = 0; v < 1000; ++v) {
    // Every fifth viewer asks twice (two of its sockets): 1,200 asks of 1,000 viewers.
    for (int twice = 0; twice < (v % 5 == 0 ? 2 : 1); ++twice)
      decider.authorize_viewer("app", "members", channel, "k", viewer(v), viewer_json(v),
                               generation, answers.to(viewer(v)));
  }
  CHECK(held.pool.waiting() == 2);  // two batches of 500 viewers
  CHECK(answers.size() == 0);
  held.release();
  REQUIRE(eventually([&] { return answers.size() == 1200; }));
  for (const auto& [id, a] : answers.got) {
    INFO(id);
    CHECK(a.ok);
    const bool member = std::stoi(id.substr(6)) % 2 == 0;
    CHECK(a.allowed.size() == (member ? 1u : 0u));  // about this viewer alone
    CHECK(a.allowed.count(id) == (member ? 1u : 0u));
  }
  CHECK(calls(held.url) == std::vector<int>{500, 500});
  // The answers are cached like any authorize()'s.
  CHECK(held.decisions.get("k", access::Decider::decision_id("app", "members", viewer(2)),
                           access::Decisions::Clock::now()) == true);
  CHECK(held.decisions.get("k", access::Decider::decision_id("app", "members", viewer(3)),
                           access::Decisions::Clock::now()) == false);
}

TEST_CASE("viewers asked for another key, channel or generation are not joined") {
  Held held(16);
  auto& decider = held.decider;
  const auto& channel = held.channel;
  Answers answers;
  decider.authorize_viewer("app", "members", channel, "k", viewer(0), viewer_json(0), 1,
                           answers.to("a"));
  decider.authorize_viewer("app", "members", channel, "k", viewer(2), viewer_json(2), 1,
                           answers.to("b"));  // joins the first
  decider.authorize_viewer("app", "members", channel, "k2", viewer(4), viewer_json(4), 1,
                           answers.to("c"));
  decider.authorize_viewer("app", "others", channel, "k", viewer(6), viewer_json(6), 1,
                           answers.to("d"));
  decider.authorize_viewer("app", "members", channel, "k", viewer(8), viewer_json(8), 2,
                           answers.to("e"));
  CHECK(held.pool.waiting() == 4);
  held.release();
  REQUIRE(eventually([&] { return answers.size() == 5; }));
  auto c = calls(held.url);
  std::sort(c.begin(), c.end());
  CHECK(c == std::vector<int>{1, 1, 1, 2});
}

TEST_CASE("when the pool has no room, every viewer joined to the refused task is told so") {
  Held held(1);
  auto& decider = held.decider;
  const auto& channel = held.channel;
  REQUIRE(held.pool.post([](pqxx::connection&) {}));  // the one waiting place is taken
  Answers answers;
  decider.authorize_viewer("app", "members", channel, "k", viewer(0), viewer_json(0), 1,
                           answers.to("a"));
  REQUIRE(answers.size() == 1);
  CHECK_FALSE(answers.got[0].second.ok);
  CHECK(answers.got[0].second.error == "the database pool has no room");
  held.release();
  // Room again: the next viewer starts a new batch rather than joining the refused one.
  REQUIRE(eventually([&] { return held.pool.waiting() == 0; }));
  decider.authorize_viewer("app", "members", channel, "k", viewer(2), viewer_json(2), 1,
                           answers.to("b"));
  REQUIRE(eventually([&] { return answers.size() == 2; }));
  CHECK(answers.got[1].second.ok);
  CHECK(answers.got[1].second.allowed.count(viewer(2)) == 1);
  CHECK(calls(held.url) == std::vector<int>{1});
}

namespace {

// keys(): the key the sub's scope names ({"doc": "k"} → "doc:k"); authorize() as members_channel.
config::Channel doc_channel() {
  config::Channel ch = members_channel();
  ch.keys_sql = "SELECT 'doc:' || ($1::jsonb->>'doc') AS key";
  return ch;
}

struct KeysAnswers {
  std::mutex mutex;
  std::vector<std::pair<int, std::vector<access::KeysAnswer>>> got;
  std::vector<std::string> errors;
  std::function<void(std::vector<access::KeysAnswer>, std::string)> to(int viewer) {
    return [this, viewer](std::vector<access::KeysAnswer> a, std::string error) {
      std::lock_guard lock(mutex);
      if (!error.empty()) errors.push_back(error);
      got.emplace_back(viewer, std::move(a));
    };
  }
  size_t size() {
    std::lock_guard lock(mutex);
    return got.size();
  }
};

}  // namespace

TEST_CASE("300 viewers subscribing to one key at once share 1 authorize call, each told about itself") {
  Held held(400);
  const config::Channel channel = doc_channel();
  KeysAnswers answers;
  for (int v = 0; v < 300; ++v) {
    held.decider.keys("app", {{"docs", &channel, R"({"doc":"k"})"}}, viewer_json(v), viewer(v),
                      answers.to(v));
  }
  held.release();
  REQUIRE(eventually([&] { return answers.size() == 300; }));
  CHECK(answers.errors.empty());
  for (const auto& [v, a] : answers.got) {
    INFO(v);
    REQUIRE(a.size() == 1);
    CHECK(a[0].found);
    const bool member = v % 2 == 0;
    CHECK(a[0].allowed == (member ? std::vector<std::string>{"doc:k"} : std::vector<std::string>{}));
    CHECK(a[0].generations.count("doc:k") == 1);
  }
  // Before: one call per viewer (300). The first keys() starts the batch; the 299 behind it in
  // the pool's queue join it before it runs.
  CHECK(calls(held.url) == std::vector<int>{300});
  // Decided and cached: the next sub of a viewer asks nothing.
  KeysAnswers again;
  held.decider.keys("app", {{"docs", &channel, R"({"doc":"k"})"}}, viewer_json(2), viewer(2),
                    again.to(2));
  REQUIRE(eventually([&] { return again.size() == 1; }));
  CHECK(again.got[0].second.at(0).allowed == std::vector<std::string>{"doc:k"});
  CHECK(calls(held.url).size() == 1);
}

TEST_CASE("viewers subscribing while another's authorize call is under way gather into the next call") {
  // Two workers: the blocker holds one; the other runs the first viewer's authorize() call,
  // which waits on an advisory lock this test holds, so it stays under way while the others
  // subscribe on the first worker once the blocker lets it go.
  Held held(64, 2);
  config::Channel channel = doc_channel();
  channel.keys_sql =
      "WITH log AS (INSERT INTO keys_calls DEFAULT VALUES RETURNING 1) "
      "SELECT 'doc:' || ($1::jsonb->>'doc') AS key FROM log";
  // members_channel's statement starts "WITH log AS (...)": one more CTE in front of it.
  channel.authorize_sql = "WITH wait AS (SELECT pg_advisory_lock_shared(42) AS l), " +
                          channel.authorize_sql.substr(5) + " AND (SELECT count(*) FROM wait) = 1";
  pqxx::connection locker(held.url);
  pqxx::nontransaction(locker).exec(
      "CREATE TABLE keys_calls (n bigserial PRIMARY KEY); SELECT pg_advisory_lock(42)");
  auto count = [&](const std::string& sql) {
    pqxx::connection c(held.url);
    return pqxx::nontransaction(c).exec(sql)[0][0].as<int>();
  };
  KeysAnswers answers;
  held.decider.keys("app", {{"docs", &channel, R"({"doc":"k"})"}}, viewer_json(0), viewer(0),
                    answers.to(0));
  REQUIRE(eventually([&] {
    return count("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted") == 1;
  }));
  held.release();
  for (int v = 1; v <= 20; ++v) {
    held.decider.keys("app", {{"docs", &channel, R"({"doc":"k"})"}}, viewer_json(v), viewer(v),
                      answers.to(v));
  }
  REQUIRE(eventually([&] { return count("SELECT count(*) FROM keys_calls") == 21; }));
  CHECK(answers.size() == 0);  // all wait for the call under way or the next
  pqxx::nontransaction(locker).exec("SELECT pg_advisory_unlock(42)");
  REQUIRE(eventually([&] { return answers.size() == 21; }));
  CHECK(answers.errors.empty());
  for (const auto& [v, a] : answers.got) {
    INFO(v);
    CHECK(a.at(0).allowed ==
          (v % 2 == 0 ? std::vector<std::string>{"doc:k"} : std::vector<std::string>{}));
  }
  // Before: 21 calls of one viewer. Now the first alone, the 20 in the next call (a viewer whose
  // keys() finished a moment after the lock went may still make a third).
  const auto c = calls(held.url);
  REQUIRE_FALSE(c.empty());
  CHECK(c[0] == 1);
  CHECK(c.size() <= 3);
  CHECK(std::accumulate(c.begin(), c.end(), 0) == 21);
}

TEST_CASE("code channel: 200 viewers subscribing to one key at once while its authorize answers later make 2 calls") {
  // An asynchronous authorize() (as a hook channel's HTTP call): it answers from another thread
  // 50 ms later, so the viewers that subscribe meanwhile gather into the next call.
  std::mutex mutex;
  std::vector<size_t> call_sizes;
  std::vector<std::thread> answerers;
  auto code = std::make_shared<CodeChannel>();
  code->app = "app";
  code->name = "docs";
  code->keys = blocking_keys([](const nlohmann::json& scope, const nlohmann::json&) {
    return KeysResult(std::vector<std::string>{"doc:" + scope.at("doc").get<std::string>()});
  });
  code->authorize = [&](const std::string&, const nlohmann::json& viewers,
                        Reply<AllowedViewers> reply) {
    std::lock_guard lock(mutex);
    call_sizes.push_back(viewers.size());
    answerers.emplace_back([viewers, reply]() mutable {
      std::this_thread::sleep_for(50ms);  // the application's own latency
      AllowedViewers allowed;
      for (const auto& v : viewers) {
        const auto id = v.at("id").get<std::string>();
        if (std::stoi(id.substr(6)) % 2 == 0) allowed.push_back(id);
      }
      reply(std::move(allowed));
    });
  };
  config::Channel channel;
  channel.code = code;
  Held held(16);
  held.release();
  KeysAnswers answers;
  for (int v = 0; v < 200; ++v) {
    held.decider.keys("app", {{"docs", &channel, R"({"doc":"k"})"}}, viewer_json(v), viewer(v),
                      answers.to(v));
  }
  REQUIRE(eventually([&] { return answers.size() == 200; }));
  {
    std::lock_guard lock(mutex);
    for (auto& t : answerers) t.join();
  }
  CHECK(answers.errors.empty());
  for (const auto& [v, a] : answers.got) {
    INFO(v);
    const bool member = v % 2 == 0;
    CHECK(a.at(0).allowed == (member ? std::vector<std::string>{"doc:k"} : std::vector<std::string>{}));
  }
  // Before: 200 calls of one viewer. Now every viewer in few calls (the first, then those that
  // gathered while it was under way), far fewer than one each.
  size_t asked = 0;
  for (size_t n : call_sizes) asked += n;
  CHECK(asked == 200);
  CHECK(call_sizes.size() <= 3);
}

TEST_CASE("a viewer's subs on two SQL channels: each keys() answers its own scope, in order") {
  Held held(10);
  held.release();
  const config::Channel docs = doc_channel();
  config::Channel notes = members_channel();
  notes.keys_sql = "SELECT 'note:' || ($1::jsonb->>'note') AS key";
  KeysAnswers answers;
  // The docs' three queries go to Postgres in one round trip, the notes' one on its own; the
  // answers come back in the order the subs were asked.
  held.decider.keys("app",
                    {{"docs", &docs, R"({"doc":"a"})"},
                     {"notes", &notes, R"({"note":"b"})"},
                     {"docs", &docs, R"({"doc":"c"})"},
                     {"docs", &docs, R"({"doc":"d"})"}},
                    viewer_json(0), viewer(0), answers.to(0));
  REQUIRE(eventually([&] { return answers.size() == 1; }));
  CHECK(answers.errors.empty());
  const auto& got = answers.got.at(0).second;
  REQUIRE(got.size() == 4);
  CHECK(got[0].allowed == std::vector<std::string>{"doc:a"});
  CHECK(got[1].allowed == std::vector<std::string>{"note:b"});
  CHECK(got[2].allowed == std::vector<std::string>{"doc:c"});
  CHECK(got[3].allowed == std::vector<std::string>{"doc:d"});

  // One scope whose keys() fails fails the viewer's question, as one query at a time did.
  config::Channel numbered = members_channel();
  numbered.keys_sql = "SELECT 'n:' || (($1::jsonb->>'n')::int)::text AS key";
  KeysAnswers failing;
  held.decider.keys("app",
                    {{"numbered", &numbered, R"({"n":"1"})"},
                     {"numbered", &numbered, R"({"n":"x"})"}},
                    viewer_json(0), viewer(0), failing.to(0));
  REQUIRE(eventually([&] { return failing.size() == 1; }));
  REQUIRE(failing.errors.size() == 1);
  CHECK_THAT(failing.errors[0], Catch::Contains("invalid input syntax for type integer"));
  // The connection goes on serving.
  KeysAnswers after;
  held.decider.keys("app", {{"numbered", &numbered, R"({"n":"2"})"}}, viewer_json(0), viewer(0),
                    after.to(0));
  REQUIRE(eventually([&] { return after.size() == 1; }));
  CHECK(after.errors.empty());
  CHECK(after.got.at(0).second.at(0).allowed == std::vector<std::string>{"n:2"});
}
