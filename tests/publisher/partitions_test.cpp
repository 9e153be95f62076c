// Partition ownership (issue 15, sql/003) with real `outlive serve` processes against real
// PostgreSQL and nats-server: a SIGKILLed replica's keys resume on the other within 5 s, a replica
// that joins takes a share of the partitions, and a replica whose database connection is cut
// publishes nothing until it owns its partitions again.
#include <catch2/catch.hpp>
#include <csignal>
#include <set>

#include "fixtures.hpp"
#include "outbox/migrate.hpp"

using namespace outlive;
using namespace outlive::testing;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

const std::vector<std::string> kTenKeys = {"k0", "k1", "k2", "k3", "k4",
                                           "k5", "k6", "k7", "k8", "k9"};
const char* kQuick = R"({"publish_timeout_ms": 2000, "poll_ms": 200})";

// One writer committing round-robin over the keys at a fixed pace (the pace is the workload, not
// a wait), with a wake after each commit.
class PacedWriter {
 public:
  PacedWriter(std::string url, std::string app, int total, int per_second)
      : thread_([=, this] {
          pqxx::connection c(url);
          const auto start = Clock::now();
          for (int i = 0; i < total && !stop_; ++i) {
            std::this_thread::sleep_until(start + i * std::chrono::microseconds(1'000'000 / per_second));
            write_numbered(c, app, kTenKeys[i % kTenKeys.size()], true);
            committed_++;
          }
        }) {}
  ~PacedWriter() {
    stop_ = true;
    join();
  }
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  int committed() const { return committed_; }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> committed_{0};
  std::thread thread_;
};

std::map<std::string, int> counters(const std::string& url) {
  pqxx::connection c(url);
  std::map<std::string, int> out;
  for (const auto& r : pqxx::nontransaction(c).exec("SELECT key, n FROM counters"))
    out[r[0].as<std::string>()] = r[1].as<int>();
  return out;
}

}  // namespace

TEST_CASE("a replica killed with SIGKILL: its keys resume on the other within 5 s") {
  const std::string db = fresh_database();
  harness::EmbeddedNats nats;
  create_counters(db, kTenKeys);
  ReplicaProcess r1(write_config(db, {nats.url()}, "r1", {"takeover"}, kQuick), "r1");
  ReplicaProcess r2(write_config(db, {nats.url()}, "r2", {"takeover"}, kQuick), "r2");
  REQUIRE(eventually([&] {
    const auto owners = owners_by_pid(db, "takeover");
    return owners.size() == 2 && owners.begin()->second + owners.rbegin()->second == 64;
  }, 20s, 20ms));
  topic::Client client({nats.url()}, "test-reader");
  PacedWriter writer(db, "takeover", 3'000, 1'000);
  REQUIRE(eventually([&] { return stream_messages(client, "takeover") >= 1'000; }, 30s, 5ms));

  const auto at_kill = counters(db);  // what each key had committed when r1 died
  ::kill(r1.process().pid(), SIGKILL);
  const auto killed = Clock::now();
  // Each key resumes when an update committed after the kill reaches the topic.
  std::map<std::string, double> resumed_ms;
  uint64_t next = 1;
  const bool all_resumed = eventually([&] {
    for (const auto& m : client.read("takeover", next, 10'000)) {
      next = m.sequence + 1;
      const auto e = nlohmann::json::parse(m.data);
      const auto key = e["k"].get<std::string>();
      if (!resumed_ms.count(key) && e["d"]["n"].get<int>() > at_kill.at(key))
        resumed_ms[key] =
            std::chrono::duration<double, std::milli>(Clock::now() - killed).count();
    }
    return resumed_ms.size() == kTenKeys.size();
  }, 10s, 5ms);
  double slowest = 0;
  for (const auto& [_, ms] : resumed_ms) slowest = std::max(slowest, ms);
  WARN("every key had an update committed after the SIGKILL on the topic within " << slowest
                                                                                   << " ms");
  INFO(r2.log_tail());
  REQUIRE(all_resumed);
  // SPEC 3 rev 3: a replica that stops making progress gives up its keys within 5 s. How fast a
  // SIGKILL is taken over (the next round, about a second) is the WARN's figure.
  CHECK(slowest < 5000);
  writer.join();
  REQUIRE(eventually([&] { return outbox_count(db) == 0; }, 30s, 20ms));
  require_complete_and_ordered(read_topic(client, "takeover"), db, 3'000);
  CHECK(owners_by_pid(db, "takeover").size() == 1);  // r2 owns every partition now
}

TEST_CASE("a third replica joining mid-stream takes a share of the partitions and order holds") {
  const std::string db = fresh_database();
  harness::EmbeddedNats nats;
  create_counters(db, kTenKeys);
  ReplicaProcess r1(write_config(db, {nats.url()}, "r1", {"rebalance"}, kQuick), "r1");
  ReplicaProcess r2(write_config(db, {nats.url()}, "r2", {"rebalance"}, kQuick), "r2");
  topic::Client client({nats.url()}, "test-reader");
  PacedWriter writer(db, "rebalance", 4'000, 1'000);
  REQUIRE(eventually([&] { return stream_messages(client, "rebalance") >= 1'000; }, 30s, 5ms));
  ReplicaProcess r3(write_config(db, {nats.url()}, "r3", {"rebalance"}, kQuick), "r3");
  const auto joined = Clock::now();
  std::map<int, int> owners;
  const bool shared = eventually([&] {
    owners = owners_by_pid(db, "rebalance");
    if (owners.size() != 3) return false;
    for (const auto& [_, n] : owners) {
      if (n < 20) return false;  // fair shares of 64 among 3: 22, 22, 20
    }
    return true;
  }, 20s, 20ms);
  INFO(r3.log_tail());
  REQUIRE(shared);
  WARN("three replicas own 64 partitions as " << owners.begin()->second << "/"
       << std::next(owners.begin())->second << "/" << owners.rbegin()->second << ", "
       << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - joined).count()
       << " ms after the third started");
  const auto during = stream_messages(client, "rebalance");
  CHECK(during < 4'000);  // the partitions moved while updates were still being written
  writer.join();
  REQUIRE(eventually([&] { return outbox_count(db) == 0; }, 30s, 20ms));
  require_complete_and_ordered(read_topic(client, "rebalance"), db, 4'000);
  CHECK(r3.log_tail().find("owns partitions") != std::string::npos);
}

TEST_CASE("a replica whose database connection is cut publishes nothing until it owns its "
          "partitions again") {
  // A Postgres of its own, restarted on the same port and data directory.
  harness::PostgresOptions options;
  options.port = harness::free_port();
  options.data_dir = harness::make_temp_dir("outlive-cut-pg-");
  auto pg = std::make_unique<harness::EmbeddedPostgres>(options);
  const std::string db = pg->create_database("cut");
  outbox::migrate(db);
  harness::EmbeddedNats nats;
  ReplicaProcess r1(write_config(db, {nats.url()}, "r1", {"cut"}, kQuick), "r1");
  topic::Client client({nats.url()}, "test-reader");
  REQUIRE(eventually([&] { return owners_by_pid(db, "cut").size() == 1; }, 20s, 20ms));
  {
    // One key of 20,000 updates: published one at a time, so the replica holds rows it has not
    // published yet for several seconds.
    pqxx::connection c(db);
    pqxx::work tx(c);
    tx.exec(
        "SELECT events.publish_live('cut', 'bulk', jsonb_build_object('n', i))"
        " FROM generate_series(1, 20000) i");
    tx.commit();
    pqxx::nontransaction(c).exec("SELECT events.wake('cut')");
  }
  REQUIRE(eventually([&] { return stream_messages(client, "cut") >= 2'000; }, 30s, 2ms));
  pg->stop();
  const auto at_cut = stream_messages(client, "cut");
  // Publishing at this pace would add hundreds in this window; at most the one in flight lands.
  std::this_thread::sleep_for(2s);
  const auto after_window = stream_messages(client, "cut");
  INFO(r1.log_tail());
  CHECK(after_window <= at_cut + 1);
  CHECK(after_window < 20'000);
  pg = std::make_unique<harness::EmbeddedPostgres>(options);  // same port and data directory
  REQUIRE(eventually([&] { return outbox_count(db) == 0; }, 60s, 50ms));
  CHECK(r1.process().running());
  const auto contents = read_topic(client, "cut");
  const auto& bulk = contents.numbers_by_key.at("bulk");
  REQUIRE(bulk.size() == 20'000);  // once each: re-published ones were dropped as duplicates
  for (int i = 0; i < 20'000; ++i) REQUIRE(bulk[i] == i + 1);
  for (const auto& [id, copies] : contents.copies_of_msg_id) REQUIRE(copies == 1);
}
