// Ownership that needs progress (issue 33, sql/005): a replica frozen with SIGSTOP loses its
// partitions to the other within the bound and, resumed, publishes nothing it read before; order
// per key and completeness hold throughout. Real PostgreSQL, nats-server and `outlive serve`.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <fstream>
#include <functional>
#include <mutex>

#include "fixtures.hpp"
#include "outbox/partitions.hpp"
#include "publisher/publisher.hpp"
#include "support/frames.hpp"
#include "support/tcp_proxy.hpp"

using namespace outlive;
using namespace outlive::testing;
using namespace std::chrono_literals;
using SteadyTime = std::chrono::steady_clock;

namespace {

std::vector<std::string> sixteen_keys() {
  std::vector<std::string> keys;
  for (int i = 0; i < 16; ++i) keys.push_back("k" + std::to_string(i));
  return keys;
}

// Commits round-robin over the keys at a fixed pace (the workload, not a wait), remembering when
// each (key, n) was written: the start of its transaction, so a stall is never underestimated.
class TimedWriter {
 public:
  TimedWriter(std::string url, std::string app, std::vector<std::string> keys, int per_second)
      : keys_(std::move(keys)), thread_([=, this] {
          pqxx::connection c(url);
          std::map<std::string, int> written;
          const auto start = SteadyTime::now();
          for (int i = 0; !stop_; ++i) {
            std::this_thread::sleep_until(start +
                                          i * std::chrono::microseconds(1'000'000 / per_second));
            const auto& key = keys_[i % keys_.size()];
            const int n = ++written[key];  // the only writer: the counter goes 1, 2, 3 ...
            {
              std::lock_guard lock(mutex_);
              written_at_[{key, n}] = SteadyTime::now();
            }
            write_numbered(c, app, key, true);
            committed_++;
          }
        }) {}
  ~TimedWriter() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int committed() const { return committed_; }
  SteadyTime::time_point written_at(const std::string& key, int n) {
    std::lock_guard lock(mutex_);
    return written_at_.at({key, n});
  }

 private:
  std::vector<std::string> keys_;
  std::mutex mutex_;
  std::map<std::pair<std::string, int>, SteadyTime::time_point> written_at_;
  std::atomic<bool> stop_{false};
  std::atomic<int> committed_{0};
  std::thread thread_;
};

// Follows the stream as it grows: per key, the longest time from write to stream.
class StallWatch {
 public:
  StallWatch(topic::Client& client, std::string app, TimedWriter& writer)
      : client_(client), app_(std::move(app)), writer_(writer) {}
  void poll() {
    for (const auto& m : client_.read(app_, next_, 10'000)) {
      next_ = m.sequence + 1;
      const auto seen = SteadyTime::now();
      const auto e = nlohmann::json::parse(m.data);
      const auto key = e["k"].get<std::string>();
      const double s =
          std::chrono::duration<double>(seen - writer_.written_at(key, e["d"]["n"].get<int>()))
              .count();
      longest_[key] = std::max(longest_[key], s);
    }
  }
  const std::map<std::string, double>& longest() const { return longest_; }

 private:
  topic::Client& client_;
  std::string app_;
  TimedWriter& writer_;
  uint64_t next_ = 1;
  std::map<std::string, double> longest_;
};

const char* kQuick = R"({"publish_timeout_ms": 2000, "poll_ms": 200})";

bool log_has(const ReplicaProcess& r, const std::string& text) {
  std::ifstream in(r.log_path());
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return all.find(text) != std::string::npos;
}


// Two replicas, r1 through `r1_db`/`r1_nats` (a proxy), r2 direct; 16 keys written at 40/s;
// `fault` runs while writes go on (it polls `watch` as it waits). Then r1 must own a share again,
// every key's longest stall be at most 10 s, and the stream be complete and in order per key.
void under_fault(const std::string& db, const std::string& r1_db, harness::EmbeddedNats& nats,
                 const std::string& r1_nats, const std::string& app,
                 const std::function<void(StallWatch&, ReplicaProcess&)>& fault,
                 const std::string& r1_says, const std::string& cause) {
  const auto keys = sixteen_keys();
  create_counters(db, keys);
  ReplicaProcess r1(write_config(r1_db, {r1_nats}, "r1", {app}, kQuick), "r1");
  ReplicaProcess r2(write_config(db, {nats.url()}, "r2", {app}, kQuick), "r2");
  topic::Client client({nats.url()}, "test-reader");
  REQUIRE(eventually([&] { return owners_by_pid(db, app).size() == 2; }, 30s, 20ms));
  TimedWriter writer(db, app, keys, 40);
  StallWatch watch(client, app, writer);
  REQUIRE(eventually([&] { return stream_messages(client, app) >= 80; }, 30s));
  const int port = port_of_replica(r1);
  REQUIRE(port > 0);
  const std::string owned_series = "outlive_partitions_owned{app=\"" + app + "\"}";
  fault(watch, r1);
  // Postgres's view and r1's own agree that it owns half again.
  const bool shared = eventually(
      [&] {
        watch.poll();
        return owners_by_pid(db, app).size() == 2 && metric_or_zero(port, owned_series) == 32;
      },
      20s, 20ms);
  writer.stop();
  const bool drained = eventually(
      [&] {
        watch.poll();
        return outbox_count(db) == 0 &&
               stream_messages(client, app) >= static_cast<uint64_t>(writer.committed());
      },
      60s, 5ms);
  INFO(r1.log_tail() << r2.log_tail());
  CHECK(shared);  // r1 took a share again once the fault ended
  REQUIRE(drained);
  double slowest = 0;
  for (const auto& [key, s] : watch.longest()) {
    INFO("key " << key);
    CHECK(s <= 10.0);
    slowest = std::max(slowest, s);
  }
  WARN(app << ": the longest write-to-stream stall of any key: " << slowest << " s");
  CHECK(watch.longest().size() == keys.size());
  require_complete_and_ordered(read_topic(client, app), db,
                               static_cast<size_t>(writer.committed()));
  CHECK(r1.process().running());
  CHECK(r2.process().running());
  CHECK(log_has(r1, r1_says));
  // /metrics says why it lost its partitions, what it owns again and that it renews.
  CHECK(metric(port, "outlive_ownership_losses_total{cause=\"" + cause + "\"}") >= 1);
  const double age = metric(port, "outlive_lease_heartbeat_age_seconds");
  CHECK(age >= 0);
  CHECK(age < 1.5);
  // The other side of the bound: the replica that kept making progress never lost its keys.
  const int port2 = port_of_replica(r2);
  REQUIRE(port2 > 0);
  for (const char* c : {"lease", "database", "nats"})
    CHECK(metric_or_zero(port2,
                         std::string("outlive_ownership_losses_total{cause=\"") + c + "\"}") == 0);
  // SPEC 6 after the fault: SIGTERM exits 0 within 10 s.
  for (auto* r : {&r1, &r2}) {
    const auto term = SteadyTime::now();
    ::kill(r->process().pid(), SIGTERM);
    const auto status = r->process().wait_for(15s);
    const double took = std::chrono::duration<double>(SteadyTime::now() - term).count();
    INFO(r->log_tail());
    REQUIRE(status.has_value());
    INFO((r == &r1 ? "r1" : "r2") << (WIFSIGNALED(*status)
                                          ? " ended by signal " + std::to_string(WTERMSIG(*status))
                                          : std::string(" exited")));
    CHECK(WIFEXITED(*status));
    CHECK(WEXITSTATUS(*status) == 0);
    CHECK(took < 10.0);
  }
}

void wait_polling(StallWatch& watch, std::chrono::milliseconds d) {
  const auto until = SteadyTime::now() + d;
  while (SteadyTime::now() < until) {
    watch.poll();
    std::this_thread::sleep_for(5ms);
  }
}

}  // namespace

TEST_CASE(
    "a replica frozen with SIGSTOP for 15 s: its keys move to the other within 10 s, then "
    "order and completeness hold") {
  const std::string db = fresh_database();
  harness::EmbeddedNats nats;
  under_fault(
      db, db, nats, nats.url(), "freeze",
      [&](StallWatch& watch, ReplicaProcess& r1) {
        ::kill(r1.process().pid(), SIGSTOP);
        wait_polling(watch, 15s);
        ::kill(r1.process().pid(), SIGCONT);
      },
      "ownership lost", "lease");
}

// The publisher's loop is held in its own callback (the test hook): a freeze at a known point,
// with rows read and not yet published. What it read before must never be sent after.
TEST_CASE(
    "a publisher frozen past its lease publishes none of what it read before, after it "
    "resumes") {
  const std::string db = fresh_database();
  harness::EmbeddedNats nats;
  const auto keys = sixteen_keys();
  create_counters(db, keys);
  auto options = [](const std::string& replica) {
    publisher::Options o;
    o.replica = replica;
    o.apps = {"fence"};
    o.poll_interval = 200ms;
    return o;
  };
  topic::Client nats_a({nats.url()}, "test-a"), nats_b({nats.url()}, "test-b");
  nats_a.ensure_stream("fence", {});
  publisher::Publisher a(db, nats_a, options("a"));
  std::mutex mutex;
  std::vector<publisher::Published> by_a;  // every update A handed to NATS
  std::atomic<int> acks_of_a{0};
  std::atomic<bool> frozen{false}, resumed{false};
  std::chrono::system_clock::time_point freeze_started{};
  a.on_sent([&](const publisher::Published& p) {
    std::lock_guard lock(mutex);
    by_a.push_back(p);
  });
  a.on_published([&](const publisher::Published&) {
    if (++acks_of_a == 100 && !frozen.exchange(true)) {
      freeze_started = std::chrono::system_clock::now();
      std::this_thread::sleep_for(6s);  // twice the lease: the other takes the partitions
      resumed = true;
    }
  });
  publisher::Publisher b(db, nats_b, options("b"));
  std::atomic<int> acks_of_b{0};
  b.on_published([&](const publisher::Published&) { acks_of_b++; });
  a.start();
  b.start();
  REQUIRE(eventually(
      [&] { return a.partitions_owned("fence") == 32 && b.partitions_owned("fence") == 32; }, 10s));
  {
    // 150 updates per key in one transaction, numbered per key in position order.
    pqxx::connection c(db);
    pqxx::work tx(c);
    tx.exec(
        "SELECT events.publish_live('fence', 'k' || (i % 16), jsonb_build_object('n', i / 16 + 1))"
        " FROM generate_series(0, 16 * 150 - 1) i");
    tx.exec("UPDATE counters SET n = 150");
    tx.commit();
    pqxx::nontransaction(c).exec("SELECT events.wake('fence')");
  }
  REQUIRE(eventually([&] { return frozen.load(); }, 30s, 1ms));
  const int b_at_freeze = acks_of_b;
  REQUIRE(eventually([&] { return outbox_count(db) == 0; }, 60s, 5ms));
  CHECK(acks_of_b > b_at_freeze);  // B published while A was frozen
  // A resumes holding rows of the keys it owned, and drops them.
  REQUIRE(eventually([&] { return resumed && a.stats().lost_lease >= 1; }, 20s));
  REQUIRE(eventually([&] { return a.partitions_owned("fence") == 32; }, 10s));  // a new lease
  // What it read before the freeze was never sent.
  int stale = 0, sent_before = 0;
  {
    std::lock_guard lock(mutex);
    for (const auto& p : by_a) {
      if (p.read_at < freeze_started && p.sent_at > freeze_started) stale++;
      if (p.sent_at <= freeze_started) sent_before++;
    }
  }
  CHECK(sent_before >= 100);
  CHECK(stale == 0);
  CHECK(a.stats().fenced >= 1);  // it held rows when the lease ran out
  a.stop();
  b.stop();
  require_complete_and_ordered(read_topic(nats_a, "fence"), db, 16 * 150);
}

TEST_CASE(
    "a replica cut off from NATS for 20 s without a closed socket gives its keys up, then "
    "takes a share again") {
  const std::string db = fresh_database();
  harness::EmbeddedNats nats;
  TcpProxy proxy("127.0.0.1", port_of(nats.url()));
  under_fault(
      db, db, nats, via_port(nats.url(), proxy.port()), "natscut",
      [&](StallWatch& watch, ReplicaProcess&) {
        proxy.blackhole(true);
        wait_polling(watch, 20s);
        proxy.blackhole(false);
      },
      "NATS answers again", "nats");
}

TEST_CASE(
    "a replica cut off from Postgres for 30 s without a closed socket loses its keys to the "
    "other, then takes a share again") {
  const std::string db = fresh_database();
  harness::EmbeddedNats nats;
  TcpProxy proxy("127.0.0.1", port_of(db));
  under_fault(
      db, via_port(db, proxy.port()), nats, nats.url(), "pgcut",
      [&](StallWatch& watch, ReplicaProcess&) {
        proxy.blackhole(true);
        wait_polling(watch, 30s);
        proxy.blackhole(false);
      },
      "ownership lost", "lease");
}

// The read is gated on the lease in the same statement: rows only under the epoch the member
// holds, and nothing at all (not even the horizon row) under another epoch or after it expired.
TEST_CASE("a read returns rows only under the lease the member still holds") {
  const std::string db = fresh_database();
  create_counters(db, {"k1"});
  {
    pqxx::connection c(db);
    write_numbered(c, "gate", "k1", false);
  }
  outbox::PartitionStore store(db);
  std::vector<int> all;
  for (int p = 0; p < 64; ++p) all.push_back(p);
  const auto round = store.lease_round("r1/gate", "r1", {"gate"}, 1000ms, 0, true);
  REQUIRE(round.epoch > 0);
  const outbox::Lease held{"r1/gate", round.epoch};
  const auto read = store.read("gate", 0, all, {}, {}, 100, &held);
  CHECK_FALSE(read.lease_lost);
  CHECK(read.rows.size() == 1);
  const outbox::Lease stale{"r1/gate", round.epoch + 1};
  CHECK(store.read("gate", 0, all, {}, {}, 100, &stale).lease_lost);
  const outbox::Lease other{"r2/gate", round.epoch};
  CHECK(store.read("gate", 0, all, {}, {}, 100, &other).lease_lost);
  // Expired by Postgres's clock (ttl 1 s, not renewed): waits on the database, with a deadline.
  const auto deadline = SteadyTime::now() + 5s;
  bool lost = false;
  while (!lost && SteadyTime::now() < deadline) {
    lost = store.read("gate", 0, all, {}, {}, 100, &held).lease_lost;
    if (!lost) std::this_thread::sleep_for(50ms);
  }
  CHECK(lost);
}
