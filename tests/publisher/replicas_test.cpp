// Replicas as real `outlive serve` processes against real PostgreSQL and nats-server: order per key
// across replicas, a replica killed with SIGKILL, a NATS outage, a 3-node JetStream cluster.
#include <sys/wait.h>
#include <catch2/catch.hpp>
#include <csignal>

#include "fixtures.hpp"
#include "support/frames.hpp"

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
  // Both own partitions before anything is written (a lease round shares them out).
  REQUIRE(eventually([&] { return owners_by_pid(db, "ordertest").size() == 2; }, 30s, 20ms));
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
  // Both replicas published: each one's own count of what it put on the topic.
  const std::string published = R"(outlive_published_total{app="ordertest"})";
  for (ReplicaProcess* r : {&r1, &r2}) {
    const int port = port_of_replica(*r);
    REQUIRE(port > 0);
    const double n = metric_or_zero(port, published);
    CAPTURE(port);
    CHECK(n > 0);
    CHECK(n < 10'000);
  }
  CHECK(metric_or_zero(port_of_replica(r1), published) + metric_or_zero(port_of_replica(r2), published) >= 10'000);
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

TEST_CASE(
    "a replica started while its 3-replica stream has too few JetStream servers waits for them") {
  const std::string db = fresh_database();
  harness::EmbeddedNatsCluster cluster(3);
  cluster.node(2).stop();  // two of three: a quorum, but no room for three replicas
  create_counters(db, kTenKeys);
  ReplicaProcess replica(
      write_config(db, cluster.urls(), "r1", {"ordertest"},
                   R"({"publish_timeout_ms": 2000, "backoff_cap_ms": 2000, "poll_ms": 200})", 3),
      "r1");
  // JetStream answers "no suitable peers for placement" once the two have a leader: the replica
  // says it waits, and runs on.
  const bool waiting = eventually(
      [&] {
        return replica.log_tail().find("no suitable peers for placement") != std::string::npos ||
               !replica.process().running();
      },
      25s, 50ms);
  INFO(replica.log_tail());
  REQUIRE(waiting);
  REQUIRE(replica.process().running());
  CHECK(replica.log_tail().find("trying again") != std::string::npos);

  cluster.node(2).start();
  topic::Client client(cluster.urls(), "test-reader", 30s);
  std::string last_seen = "nothing yet";
  const bool formed = eventually(
      [&] {
        try {
          const auto s = client.stream_state("ordertest");
          last_seen = "replicas " + std::to_string(s.replicas) + ", current peers " +
                      std::to_string(s.current_peers);
          return s.replicas == 3 && s.current_peers == 2;
        } catch (const std::exception& e) {
          last_seen = std::string("error: ") + e.what();
          return false;
        }
      },
      60s, 100ms);
  INFO("stream: " << last_seen << "\n" << replica.log_tail());
  REQUIRE(formed);
  // And it publishes.
  pqxx::connection writer(db);
  for (int i = 0; i < 50; ++i) write_numbered(writer, "ordertest", kTenKeys[i % 10], true);
  REQUIRE(eventually([&] { return outbox_count(db) == 0; }, 30s, 50ms));
  CHECK(replica.process().running());
  require_complete_and_ordered(read_topic(client, "ordertest"), db, 50);
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
  // What the stream looked like last, for the message when it never gets there.
  std::string last_seen = "nothing yet";
  auto peers_current = [&](auto done) {
    try {
      const auto s = client.stream_state("ordertest");
      last_seen = "replicas " + std::to_string(s.replicas) + ", leader \"" + s.leader +
                  "\", current peers " + std::to_string(s.current_peers);
      return done(s);
    } catch (const std::exception& e) {
      last_seen = std::string("error: ") + e.what();
      return false;
    }
  };
  const bool formed = eventually(
      [&] {
        return peers_current(
            [](const topic::StreamState& s) { return s.replicas == 3 && s.current_peers == 2; });
      },
      60s, 100ms);
  INFO("stream: " << last_seen << "\nreplica running: " << replica.process().running() << "\n"
                  << replica.log_tail());
  REQUIRE(formed);
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
    const bool caught_up = eventually(
        [&] {
          return peers_current([](const topic::StreamState& s) { return s.current_peers == 2; });
        },
        60s, 100ms);
    INFO("node " << node << " restarted; stream: " << last_seen);
    REQUIRE(caught_up);
  }
  require_complete_and_ordered(read_topic(client, "ordertest"), db, static_cast<size_t>(committed));
}
