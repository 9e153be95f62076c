// Replicas as real `outlive serve` processes against real PostgreSQL and nats-server: order per key
// across replicas, a replica killed with SIGKILL, a NATS outage, a 3-node JetStream cluster.
#include <sys/wait.h>
#include <catch2/catch.hpp>
#include <csignal>

#include "fixtures.hpp"

using namespace outlive;
using namespace outlive::testing;
using namespace std::chrono_literals;

namespace {

const std::vector<std::string> kTenKeys = {"k0", "k1", "k2", "k3", "k4",
                                           "k5", "k6", "k7", "k8", "k9"};

const char* kFastLease = R"({"lease_ms": 3000, "publish_timeout_ms": 2000, "poll_ms": 200})";

}  // namespace

TEST_CASE("two replicas publish 10 keys x 1,000 updates from 8 writers in commit order per key") {
  const std::string db = fresh_database();
  harness::EmbeddedNats nats;
  create_counters(db, kTenKeys);
  ReplicaProcess r1(write_config(db, {nats.url()}, "r1", {"ordertest"}), "r1");
  ReplicaProcess r2(write_config(db, {nats.url()}, "r2", {"ordertest"}), "r2");
  topic::Client client({nats.url()}, "test-reader");
  {
    Writers writers(db, "ordertest", kTenKeys, 8, 10'000);
    writers.join();
  }
  const bool drained =
      eventually([&] { return stream_messages(client, "ordertest") >= 10'000; }, 60s, 50ms);
  INFO(r1.log_tail() << r2.log_tail());
  REQUIRE(drained);
  REQUIRE(eventually([&] { return outbox_count(db) == 0; }, 10s));
  require_complete_and_ordered(read_topic(client, "ordertest"), db, 10'000);
  CHECK(r1.process().running());
  CHECK(r2.process().running());
  // Both replicas took part (claims alternate between them).
  CHECK(r1.log_tail().find("replica started") != std::string::npos);
}

TEST_CASE("a replica killed with SIGKILL halfway loses nothing and stores nothing twice") {
  const std::string db = fresh_database();
  harness::EmbeddedNats nats;
  create_counters(db, kTenKeys);
  ReplicaProcess r1(write_config(db, {nats.url()}, "r1", {"ordertest"}, kFastLease), "r1");
  ReplicaProcess r2(write_config(db, {nats.url()}, "r2", {"ordertest"}, kFastLease), "r2");
  topic::Client client({nats.url()}, "test-reader");
  Writers writers(db, "ordertest", kTenKeys, 8, 10'000);
  REQUIRE(eventually([&] { return stream_messages(client, "ordertest") >= 5'000; }, 60s, 5ms));
  ::kill(r1.process().pid(), SIGKILL);
  writers.join();
  const bool drained = eventually([&] { return outbox_count(db) == 0; }, 60s, 50ms);
  INFO(r2.log_tail());
  REQUIRE(drained);
  require_complete_and_ordered(read_topic(client, "ordertest"), db, 10'000);
  CHECK(r2.process().running());
}

TEST_CASE("a NATS outage of 10 s while writers commit: everything published after it, in order") {
  const std::string db = fresh_database();
  harness::EmbeddedNats nats;
  create_counters(db, kTenKeys);
  ReplicaProcess replica(
      write_config(db, {nats.url()}, "r1", {"ordertest"},
                   R"({"publish_timeout_ms": 2000, "backoff_cap_ms": 4000, "poll_ms": 200})"),
      "r1");
  {
    topic::Client client({nats.url()}, "test-reader");
    REQUIRE(eventually(
        [&] { return stream_messages(client, "ordertest") == 0 && replica.process().running(); }));
  }
  pqxx::connection writer(db);
  int committed = 0;
  for (int i = 0; i < 200; ++i, ++committed)
    write_numbered(writer, "ordertest", kTenKeys[i % 10], true);
  nats.stop();
  const auto outage_end = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < outage_end) {
    write_numbered(writer, "ordertest", kTenKeys[committed % 10], committed % 5 == 0);
    ++committed;
  }
  CHECK(outbox_count(db) > 0);  // the outage left a backlog
  nats.start();
  for (int i = 0; i < 200; ++i, ++committed)
    write_numbered(writer, "ordertest", kTenKeys[i % 10], true);
  const bool drained = eventually([&] { return outbox_count(db) == 0; }, 60s, 50ms);
  INFO(replica.log_tail());
  REQUIRE(drained);
  CHECK(replica.process().running());
  topic::Client client({nats.url()}, "test-reader");
  const auto contents = read_topic(client, "ordertest");
  // Every update once: with the 2-minute duplicate window, retries of updates that were stored
  // during the outage are dropped by JetStream.
  require_complete_and_ordered(contents, db, static_cast<size_t>(committed));
}

TEST_CASE("a 3-node JetStream cluster with a 3-replica stream: stopping any node loses nothing") {
  const std::string db = fresh_database();
  harness::EmbeddedNatsCluster cluster(3);
  create_counters(db, kTenKeys);
  ReplicaProcess replica(
      write_config(db, cluster.urls(), "r1", {"ordertest"},
                   R"({"publish_timeout_ms": 2000, "backoff_cap_ms": 2000, "poll_ms": 200})", 3),
      "r1");
  topic::Client client(cluster.urls(), "test-reader", 30s);
  REQUIRE(eventually(
      [&] {
        try {
          const auto s = client.stream_state("ordertest");
          return s.replicas == 3 && s.current_peers == 2;
        } catch (const std::exception&) {
          return false;
        }
      },
      60s, 100ms));
  pqxx::connection writer(db);
  int committed = 0;
  for (int node = 0; node < cluster.size(); ++node) {
    cluster.node(node).stop();
    for (int i = 0; i < 300; ++i, ++committed)
      write_numbered(writer, "ordertest", kTenKeys[i % 10], i % 20 == 0);
    const bool drained = eventually([&] { return outbox_count(db) == 0; }, 60s, 50ms);
    INFO("node " << node << " stopped\n" << replica.log_tail());
    REQUIRE(drained);
    CHECK(replica.process().running());
    cluster.node(node).start();
    // Let the restarted node catch up before the next one stops, so the stream keeps a quorum.
    REQUIRE(eventually(
        [&] {
          try {
            return client.stream_state("ordertest").current_peers == 2;
          } catch (const std::exception&) {
            return false;
          }
        },
        60s, 100ms));
  }
  require_complete_and_ordered(read_topic(client, "ordertest"), db, static_cast<size_t>(committed));
}
