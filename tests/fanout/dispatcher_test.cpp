// The dispatcher against fakes: readers that record what they are offered, a code channel whose
// authorize() answers when the test says so, and a pool that is never used (no Postgres).
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <atomic>
#include <thread>
#include <vector>

#include "access/decider.hpp"
#include "common/fault.hpp"
#include "common/thread_failures.hpp"
#include "db/pool.hpp"
#include "fanout/app_delivery.hpp"
#include "fanout/dispatcher.hpp"
#include "fanout/frame.hpp"

using namespace outlive;
using namespace std::chrono_literals;

namespace {

const topic::TopicIdentity kTopic{"app", 42};

// Records every delivery offered to it; a test waits for them with a deadline.
class FakeReader : public fanout::Reader {
 public:
  bool offer(std::vector<fanout::Delivery>&& deliveries, uint64_t through) override {
    {
      std::lock_guard lock(mutex_);
      for (auto& d : deliveries) got_.push_back(std::move(d));
      through_ = std::max(through_, through);
    }
    changed_.notify_all();
    return false;
  }
  void take() override {}
  void progress(const fanout::ProgressTick&) override {}
  void refresh_collections() override {}
  void shut_down() override {}
  void end_after(uint64_t position) override { ended_after = position; }
  void disconnect(const std::string&) override {}
  void named(const std::string& viewer_id) {
    kept_viewer_.id = viewer_id;
    set_viewer(&kept_viewer_);
  }
  fanout::Viewer kept_viewer_;
  std::atomic<uint64_t> ended_after{0};

  // The deliveries once there are at least `n` (fewer after the deadline).
  std::vector<fanout::Delivery> wait_for(size_t n, std::chrono::milliseconds within = 5s) {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, within, [&] { return got_.size() >= n; });
    return got_;
  }
  size_t count() {
    std::lock_guard lock(mutex_);
    return got_.size();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<fanout::Delivery> got_;
  uint64_t through_ = 0;
};

// authorize() of the code channel: answers at once with `allowed`, or holds every call until
// release() when held.
struct Authorizer {
  std::mutex mutex;
  std::set<std::string> allowed;
  bool hold = false;
  std::vector<Reply<AllowedViewers>> held;
  int calls = 0;

  AuthorizeFunction function() {
    return [this](const std::string&, const nlohmann::json& viewers, Reply<AllowedViewers> reply) {
      std::lock_guard lock(mutex);
      ++calls;
      if (hold) return held.push_back(std::move(reply));
      AllowedViewers out;
      for (const auto& v : viewers) {
        if (allowed.count(v["id"].get<std::string>())) out.push_back(v["id"]);
      }
      reply(out);
    };
  }
  void release() {
    std::vector<Reply<AllowedViewers>> replies;
    {
      std::lock_guard lock(mutex);
      hold = false;
      replies.swap(held);
    }
    for (auto& r : replies) r(AllowedViewers(allowed.begin(), allowed.end()));
  }
};

// Rounds are offered by the dispatcher's thread; the readers here need no take() on a thread of
// their own. Progress ticks are recorded.
struct FakeHost final : fanout::DeliveryHost {
  void take(std::vector<std::shared_ptr<fanout::Reader>>&&) override {}
  void progress(std::vector<std::shared_ptr<fanout::Reader>>&& readers,
                fanout::ProgressTick tick) override {
    std::lock_guard lock(mutex);
    ticks.emplace_back(readers.size(), tick.position);
  }
  void on_round(const std::string&, const std::vector<double>&) override {}
  void on_progress(const std::string&, size_t) override {}
  void on_disconnect(const std::string&, const window::Disconnect& d) override {
    std::lock_guard lock(mutex);
    disconnects_read.push_back(d.viewer);
  }
  // Each reader ended, with the reason and how many deliveries it had been offered by then.
  void disconnect(std::vector<std::shared_ptr<fanout::Reader>>&& readers,
                  const std::string& reason) override {
    std::lock_guard lock(mutex);
    for (auto& r : readers) {
      ended.push_back({r.get(), reason, static_cast<FakeReader&>(*r).count()});
    }
  }
  struct Ended {
    fanout::Reader* reader;
    std::string reason;
    size_t offered_before;
  };
  std::vector<std::string> disconnects_read;
  std::vector<Ended> ended;
  std::mutex mutex;
  std::vector<std::pair<size_t, uint64_t>> ticks;  // (readers visited, position)
};

// The channel "ch" of `app`, in code: authorize() through `authorizer`.
std::map<std::string, config::Channel> code_channels(const std::string& app,
                                                     Authorizer& authorizer) {
  auto code = std::make_shared<CodeChannel>();
  code->app = app;
  code->name = "ch";
  code->authorize = authorizer.function();
  code->keys = blocking_keys([](const auto&, const auto&) { return KeysResult{}; });
  std::map<std::string, config::Channel> channels;
  channels["ch"].code = code;
  return channels;
}

struct Fixture {
  explicit Fixture(fanout::DispatcherOptions options = {}) {
    channels = code_channels("app", authorizer);
    dispatcher = std::make_unique<fanout::Dispatcher>("app", channels, hub, decider, options, host);
    dispatcher->start(kTopic);
  }
  ~Fixture() { dispatcher->stop(); }

  std::shared_ptr<FakeReader> follower(const std::string& viewer, const std::string& key) {
    auto r = std::make_shared<FakeReader>();
    hub.add_reader(r);
    hub.follow({key}, "ch", r,
               std::make_shared<const fanout::Viewer>(
                   fanout::Viewer{viewer, R"({"id":")" + viewer + R"("})"}));
    readers.push_back(r);
    return r;
  }
  window::UpdatePtr update(uint64_t position, const std::string& key, bool access = false) {
    window::Update u;
    u.position = position;
    u.key = key;
    u.access = access;
    u.kind = access ? window::Kind::access : window::Kind::data;
    if (!access) u.data_json = std::make_shared<const std::string>(R"({"n":1})");
    fanout::prepare(u, kTopic);
    return std::make_shared<const window::Update>(std::move(u));
  }
  window::UpdatePtr disconnect(uint64_t position, const std::string& id, const std::string& viewer) {
    window::Update u;
    u.position = position;
    u.key = "outlive:disconnect:" + std::to_string(position);
    u.kind = window::Kind::disconnect;
    u.disconnect = std::make_shared<const window::Disconnect>(
        window::Disconnect{id, viewer, "signed_out", 1000});
    return std::make_shared<const window::Update>(std::move(u));
  }
  std::string cursor(uint64_t position) { return topic::Cursor::at(kTopic, position).encode(); }

  Authorizer authorizer;
  FakeHost host;
  std::map<std::string, config::Channel> channels;
  fanout::Hub hub;
  access::Decisions decisions;
  db::Pool pool{"postgresql://127.0.0.1:1/unused", 1};  // code channels never use it
  access::Decider decider{pool, decisions, 1000};
  std::unique_ptr<fanout::Dispatcher> dispatcher;
  std::vector<std::shared_ptr<FakeReader>> readers;
};

}  // namespace

TEST_CASE("dispatcher: an update reaches its followers with its own cursor and shared tail") {
  Fixture f;
  f.authorizer.allowed = {"v1"};
  auto allowed = f.follower("v1", "k");
  auto denied = f.follower("v2", "k");
  auto elsewhere = f.follower("v3", "other");
  const auto u = f.update(1, "k");
  f.dispatcher->push(u);

  const auto a = allowed->wait_for(1);
  const auto d = denied->wait_for(1);
  REQUIRE(a.size() == 1);
  REQUIRE(d.size() == 1);
  CHECK(a[0].out->update == u);
  CHECK(a[0].out->cursor == f.cursor(1));
  CHECK(a[0].out->tail == u->tail);  // the update's own bytes, not a copy
  CHECK(a[0].out == d[0].out);       // built once for every follower
  REQUIRE(a[0].allowed.size() == 1);
  CHECK(a[0].allowed[0] == std::pair<std::string, bool>{"ch", true});
  CHECK(d[0].allowed[0] == std::pair<std::string, bool>{"ch", false});
  CHECK_FALSE(a[0].broken);
  CHECK(elsewhere->count() == 0);
  CHECK(f.dispatcher->hand_offs().handed_off(1));
  CHECK_FALSE(f.dispatcher->hand_offs().handed_off(2));
  CHECK(f.authorizer.calls == 1);  // both viewers in one batch
}

TEST_CASE("dispatcher: a key waiting for authorize holds back only itself, and clamps the others") {
  Fixture f;
  f.authorizer.allowed = {"slow", "fast"};
  auto slow = f.follower("slow", "a");
  auto fast = f.follower("fast", "b");
  // The fast key's decision is cached: only the slow key asks.
  f.decisions.put("b", access::Decider::decision_id("app", "ch", "fast"), true,
                  access::Decisions::Clock::now());
  f.authorizer.hold = true;
  f.dispatcher->push(f.update(1, "a"));
  f.dispatcher->push(f.update(2, "b"));

  const auto b = fast->wait_for(1);
  REQUIRE(b.size() == 1);
  CHECK(b[0].out->update->position == 2);
  // Below the update of `a` still waiting: a tab resuming from it still receives that one.
  CHECK(b[0].out->cursor == f.cursor(0));
  CHECK(b[0].out->tail != b[0].out->update->tail);  // its own, with the clamped cursor
  CHECK(slow->count() == 0);
  CHECK(f.dispatcher->hand_offs().handed_off(2));
  CHECK_FALSE(f.dispatcher->hand_offs().handed_off(1));
  CHECK(f.dispatcher->waiting() == 1);

  f.authorizer.release();
  const auto a = slow->wait_for(1);
  REQUIRE(a.size() == 1);
  CHECK(a[0].out->cursor == f.cursor(1));
  CHECK(a[0].allowed[0].second);
  CHECK(f.dispatcher->hand_offs().handed_off(1));
}

TEST_CASE(
    "dispatcher: an authorize that passes the check timeout breaks its followers' deliveries") {
  fanout::DispatcherOptions options;
  options.check_timeout = 100ms;
  Fixture f(options);
  auto reader = f.follower("v", "k");
  f.authorizer.hold = true;
  f.dispatcher->push(f.update(1, "k"));
  const auto got = reader->wait_for(1);
  REQUIRE(got.size() == 1);
  CHECK(got[0].broken);    // the socket closes 1011 and the tab resumes: nothing skipped
  f.authorizer.release();  // a late answer changes nothing
  CHECK(reader->wait_for(2, 200ms).size() == 1);
}

TEST_CASE("dispatcher: push blocks once max_waiting updates wait, and not before") {
  fanout::DispatcherOptions options;
  options.max_waiting = 2;
  Fixture f(options);
  auto reader = f.follower("v", "k");
  f.authorizer.hold = true;
  f.dispatcher->push(f.update(1, "k"));
  f.dispatcher->push(f.update(2, "k"));  // at the bound, not past it: returns
  CHECK(f.dispatcher->waiting() == 2);
  auto third = std::async(std::launch::async, [&] { f.dispatcher->push(f.update(3, "k")); });
  CHECK(third.wait_for(300ms) == std::future_status::timeout);
  f.authorizer.release();
  CHECK(third.wait_for(5s) == std::future_status::ready);
  CHECK(reader->wait_for(3).size() == 3);
}

TEST_CASE("dispatcher: an access update forgets its key's decisions before anything after it") {
  Fixture f;
  f.authorizer.allowed = {"v"};
  auto reader = f.follower("v", "k");
  f.decisions.put("k", access::Decider::decision_id("app", "ch", "v"), true,
                  access::Decisions::Clock::now());
  f.authorizer.allowed = {};  // revoked: authorize() now says no
  f.dispatcher->push(f.update(1, "k", /*access=*/true));
  f.dispatcher->push(f.update(2, "k"));
  const auto got = reader->wait_for(2);
  REQUIRE(got.size() == 2);
  CHECK_FALSE(got[0].allowed[0].second);
  CHECK_FALSE(got[1].allowed[0].second);  // not the cached "yes" from before the access update
  CHECK(f.authorizer.calls == 1);
}

TEST_CASE("dispatcher: the progress tick visits the readers not settled at the hand-off") {
  fanout::DispatcherOptions options;
  options.progress_interval = 50ms;
  Fixture f(options);
  f.authorizer.allowed = {"v"};
  auto reader = f.follower("v", "k");
  f.follower("idle", "other");
  f.dispatcher->push(f.update(1, "k"));
  REQUIRE(reader->wait_for(1).size() == 1);
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  for (;;) {
    {
      std::lock_guard lock(f.host.mutex);
      if (!f.host.ticks.empty() && f.host.ticks.back().second == 1) break;
    }
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(1ms);  // polled: the tick has no event of its own
  }
  std::lock_guard lock(f.host.mutex);
  CHECK(f.host.ticks.back().first == 2);  // neither fake reader settles
}

TEST_CASE("delivery: two apps' deliveries side by side each reach only their own hub's readers") {
  Authorizer authorizer;
  authorizer.allowed = {"v"};
  FakeHost host;
  access::Decisions decisions;
  db::Pool pool{"postgresql://127.0.0.1:1/unused", 1};
  access::Decider decider{pool, decisions, 1000};
  const auto channels_a = code_channels("a", authorizer);
  const auto channels_b = code_channels("b", authorizer);
  fanout::AppDelivery a("a", channels_a, decider, {}, host);
  fanout::AppDelivery b("b", channels_b, decider, {}, host);
  const auto viewer = std::make_shared<const fanout::Viewer>(fanout::Viewer{"v", R"({"id":"v"})"});
  // The same key followed in each app, and a reader of b that follows nothing.
  auto in_a = std::make_shared<FakeReader>();
  auto in_b = std::make_shared<FakeReader>();
  auto idle_b = std::make_shared<FakeReader>();
  a.hub().add_reader(in_a);
  b.hub().add_reader(in_b);
  b.hub().add_reader(idle_b);
  a.hub().follow({"k"}, "ch", in_a, viewer);
  b.hub().follow({"k"}, "ch", in_b, viewer);
  CHECK(&a.hub() != &b.hub());
  CHECK(a.hub().reader_count() == 1);
  CHECK(b.hub().reader_count() == 2);
  const auto listed = a.hub().readers();
  REQUIRE(listed.size() == 1);
  CHECK(listed[0] == in_a);
  CHECK(b.hub().targets("k", 0)->size() == 1);

  const topic::TopicIdentity topic_a{"a", 1};
  a.start(topic_a);
  b.start({"b", 2});
  window::Update u;
  u.position = 1;
  u.key = "k";
  u.kind = window::Kind::data;
  u.data_json = std::make_shared<const std::string>(R"({"n":1})");
  fanout::prepare(u, topic_a);
  a.push(std::make_shared<const window::Update>(std::move(u)));

  REQUIRE(in_a->wait_for(1).size() == 1);
  // The round records its hand-off after offering it: polled, the hub has no event of its own.
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (a.hub().handed_through() < 1) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(1ms);
  }
  CHECK(b.hub().handed_through() == 0);
  CHECK(in_b->wait_for(1, 200ms).empty());
  a.stop();
  b.stop();
}

TEST_CASE("dispatcher: a disconnect ends the readers it names once the updates before it are offered") {
  Fixture f;
  f.authorizer.allowed = {"user:ada", "user:ada:app", "user:adam"};
  auto ada = f.follower("user:ada", "a");
  auto ada_app = f.follower("user:ada:app", "b");
  auto adam = f.follower("user:adam", "a");
  ada->named("user:ada");
  ada_app->named("user:ada:app");
  adam->named("user:adam");
  f.authorizer.hold = true;  // the update before it waits for authorize()
  f.dispatcher->push(f.update(1, "a"));
  f.dispatcher->push(f.disconnect(2, "d1", "user:ada"));
  f.dispatcher->push(f.update(3, "a"));
  f.dispatcher->push(f.disconnect(4, "d1", "user:ada"));  // another copy of the same one

  // Marked at once (nothing after position 2 reaches them), ended only after update 1.
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (ada_app->ended_after == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  CHECK(ada->ended_after == 2);
  CHECK(ada_app->ended_after == 2);
  CHECK(adam->ended_after == 0);  // user:adam is not under user:ada
  {
    std::lock_guard lock(f.host.mutex);
    CHECK(f.host.ended.empty());
    CHECK(f.host.disconnects_read == std::vector<std::string>{"user:ada"});
  }

  f.authorizer.release();
  REQUIRE(ada->wait_for(1).size() >= 1);
  REQUIRE(adam->wait_for(2).size() == 2);
  std::vector<FakeHost::Ended> ended;
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (std::chrono::steady_clock::now() < until) {
    {
      std::lock_guard lock(f.host.mutex);
      ended = f.host.ended;
    }
    if (ended.size() >= 2) break;
    std::this_thread::sleep_for(1ms);
  }
  REQUIRE(ended.size() == 2);
  for (const auto& e : ended) {
    CHECK(e.reason == "signed_out");
    if (e.reader == ada.get()) CHECK(e.offered_before >= 1);  // update 1 went out first
    CHECK((e.reader == ada.get() || e.reader == ada_app.get()));
  }
  std::lock_guard lock(f.host.mutex);
  CHECK(f.host.disconnects_read.size() == 1);
  CHECK(f.dispatcher->hand_offs().handed_off(4));
}

// The error policy of the topic and dispatcher threads (docs/ARCHITECTURE.md): a reader's
// deliveries as (position of the update, or of a resync marker, and which).
namespace {
std::vector<std::pair<std::string, uint64_t>> seen(const std::vector<fanout::Delivery>& ds) {
  std::vector<std::pair<std::string, uint64_t>> out;
  for (const auto& d : ds) {
    if (d.out) out.emplace_back("update", d.out->update->position);
    else out.emplace_back("resync", d.lost_through);
  }
  return out;
}
using Seen = std::vector<std::pair<std::string, uint64_t>>;
}  // namespace

TEST_CASE("dispatcher: a gap handed by the topic thread resyncs every live reader at its position") {
  Fixture f;
  f.decisions.put("k", access::Decider::decision_id("app", "ch", "v1"), true,
                  access::Decisions::Clock::now());
  auto reader = f.follower("v1", "k");
  auto other = f.follower("v2", "other");
  f.dispatcher->push(f.update(1, "k"));
  window::Update gap;
  gap.position = 2;
  gap.kind = window::Kind::gap;
  gap.lost_through = 2;
  f.dispatcher->push(std::make_shared<const window::Update>(std::move(gap)));
  f.dispatcher->push(f.update(3, "k"));

  CHECK(seen(reader->wait_for(3)) == Seen{{"update", 1}, {"resync", 2}, {"update", 3}});
  CHECK(seen(other->wait_for(1)) == Seen{{"resync", 2}});
  CHECK(f.dispatcher->hand_offs().handed_off(2));  // a reader catching up reads it from its window
  CHECK(f.dispatcher->waiting() == 0);
}

TEST_CASE("dispatcher: an exception on its thread resyncs every live reader at the failed update, "
          "is counted, and delivery goes on") {
  Fixture f;
  f.decisions.put("k", access::Decider::decision_id("app", "ch", "v1"), true,
                  access::Decisions::Clock::now());
  auto reader = f.follower("v1", "k");
  auto other = f.follower("v2", "other");
  f.dispatcher->push(f.update(1, "k"));
  REQUIRE(reader->wait_for(1).size() == 1);
  const uint64_t failures = thread_failures(ThreadKind::dispatcher);

  fault::arm(fault::Site::dispatcher, 1);  // update 2 throws as it is taken
  f.dispatcher->push(f.update(2, "k"));
  f.dispatcher->push(f.update(3, "k"));

  CHECK(seen(reader->wait_for(3)) == Seen{{"update", 1}, {"resync", 2}, {"update", 3}});
  CHECK(seen(other->wait_for(1)) == Seen{{"resync", 2}});
  CHECK(thread_failures(ThreadKind::dispatcher) == failures + 1);
  CHECK(f.dispatcher->hand_offs().handed_off(3));
  CHECK(f.dispatcher->waiting() == 0);  // nothing it gave up still counts against push()
}
