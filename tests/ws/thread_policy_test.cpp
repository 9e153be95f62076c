// The error policy per thread (issue 47, docs/ARCHITECTURE.md), end to end: an exception injected
// (common/fault.hpp) on the topic thread between the window and the hand-off, and on the
// dispatcher's thread, costs no silent gap (SPEC 1): the live reader receives `resync` at the
// failed update, a tab resuming from before it receives it from the window, the failure is
// counted in outlive_thread_failures_total and the replica goes on serving. Real PostgreSQL and
// nats-server, an in-process replica; every wait has a deadline.
#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <iterator>
#include <string>

#include "common/fault.hpp"
#include "harness/embedded_nats.hpp"
#include "harness/process.hpp"
#include "support/frames.hpp"
#include "support/inventory.hpp"
#include "support/replica_fixture.hpp"
#include "support/serve_child.hpp"

using namespace outlive;
using namespace outlive::testing;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

const std::string kSchema = kInventoryTables + kAdaSeed;

struct Fixture : ReplicaFixture {
  Fixture()
      : ReplicaFixture(kSchema, [](const std::string& db, const std::string& nats) {
          return inventory_replica_config(db, nats, "thread-policy", warehouse_channels());
        }) {}

  int ops() const { return replica->admin_port() ? replica->admin_port() : port; }

  std::string head_cursor() {
    const auto [status, body] = http_get(port, "/api/inventory/live/cursor");
    REQUIRE(status == 200);
    return json::parse(body)["cursor"].get<std::string>();
  }

  double failures(const std::string& thread) {
    return metric(ops(), R"(outlive_thread_failures_total{thread=")" + thread + R"("})");
  }

  WsClient open() { return WsClient(port, "/api/inventory/live", {{"Cookie", kAdaCookie}}); }
};

json sub(const std::string& id, const std::string& cursor = "") {
  json m = {{"type", "sub"}, {"id", id}, {"channel", "warehouse"}, {"scope", kNorthScope}};
  if (!cursor.empty()) m["cursor"] = cursor;
  return m;
}

// One update of the live reader fails at `site`: the reader resyncs at it, the counter of
// `thread` (only) moves, the next update is delivered live, and a tab resuming from before the
// failure receives both from the window.
void fails_without_gap(fault::Site site, const std::string& thread) {
  Fixture f;
  for (const char* kind : {"topic", "dispatcher", "io", "pool", "publisher"})
    REQUIRE(f.failures(kind) == 0);
  WsClient live = f.open();
  live.send(sub("live").dump());
  REQUIRE(next_frame(live)["type"] == "subscribed");
  const std::string before = f.head_cursor();
  const uint64_t head = position_of(before);

  fault::arm(site, 1);  // the next update that passes there
  f.publish(kNorth, {{"n", 1}});
  const json first = next_frame(live, 30s);
  INFO(first.dump());
  REQUIRE(first["type"] == "resync");
  CHECK(first["id"] == "live");
  CHECK(position_of(first["cursor"].get<std::string>()) == head + 1);
  CHECK(f.failures(thread) == 1);
  for (const char* kind : {"topic", "dispatcher", "io", "pool", "publisher"}) {
    if (kind != thread) CHECK(f.failures(kind) == 0);
  }

  // The replica goes on: the next update reaches the same socket live.
  f.publish(kNorth, {{"n", 2}});
  const json second = next_frame(live, 30s);
  INFO(second.dump());
  REQUIRE(second["type"] == "update");
  CHECK(second["data"]["n"] == 2);
  CHECK(position_of(second["cursor"].get<std::string>()) == head + 2);

  // The failed update is in the window: a tab that resumes from before it receives it.
  WsClient back = f.open();
  back.send(sub("back", before).dump());
  json frame = next_frame(back, 30s);
  if (frame["type"] == "subscribed") frame = next_frame(back, 30s);
  INFO(frame.dump());
  REQUIRE(frame["type"] == "update");
  CHECK(frame["data"]["n"] == 1);
  frame = next_frame(back, 30s);
  REQUIRE(frame["type"] == "update");
  CHECK(frame["data"]["n"] == 2);
  CHECK(http_get(f.ops(), "/readyz").first == 200);
}

}  // namespace

TEST_CASE("an exception between the window and the hand-off resyncs the live reader") {
  fails_without_gap(fault::Site::topic, "topic");
}

TEST_CASE("an exception on the dispatcher thread resyncs the live reader and delivery goes on") {
  fails_without_gap(fault::Site::dispatcher, "dispatcher");
}

// An io thread's policy: the socket whose handler failed is closed 1011 (SPEC 5.5: the tab
// reconnects with its cursors), the others on the same threads and the replica go on.
TEST_CASE("an exception while a tab's message is handled closes that socket 1011 and only it") {
  Fixture f;
  WsClient live = f.open();
  live.send(sub("live").dump());
  REQUIRE(next_frame(live)["type"] == "subscribed");

  fault::arm(fault::Site::io, 1);  // the next message handled: the live socket sends no more
  WsClient failed = f.open();
  failed.send(sub("failed").dump());
  CHECK(failed.wait_closed(30s) == 1011);
  CHECK(f.failures("io") == 1);
  for (const char* kind : {"topic", "dispatcher", "pool", "publisher"}) CHECK(f.failures(kind) == 0);

  f.publish(kNorth, {{"n", 1}});
  const json update = next_frame(live, 30s);
  INFO(update.dump());
  REQUIRE(update["type"] == "update");
  CHECK(update["data"]["n"] == 1);
  WsClient again = f.open();
  again.send(sub("again").dump());
  CHECK(next_frame(again, 30s)["type"] == "subscribed");
  CHECK(f.failures("io") == 1);
}

// The same fault armed from the environment of a real `outlive serve` (how the docs tell an
// operator's test harness to arm it), and a malformed value: nothing armed, and the process says so.
TEST_CASE("OUTLIVE_FAULT=io:1 in a served replica's environment fails the first message's socket "
          "1011 and only it, a malformed value arms nothing and says so") {
  harness::EmbeddedNats nats;
  const std::string db = fresh_database();
  {
    pqxx::connection c(db);
    pqxx::work tx(c);
    tx.exec(kSchema);
    tx.commit();
  }
  const std::string dir = harness::make_temp_dir("outlive-fault-env-");
  auto serve = [&](const std::string& fault, const std::string& name) {
    ServeChild::Options options;
    options.env = {"OUTLIVE_FAULT=" + fault};
    return std::make_unique<ServeChild>(
        inventory_replica_config(db, nats.url(), name, warehouse_channels()), dir, name, options);
  };

  {
    const auto child = serve("io:1", "armed");
    const int port = child->port();
    WsClient failed(port, "/api/inventory/live", {{"Cookie", kAdaCookie}});
    failed.send(sub("failed").dump());
    CHECK(failed.wait_closed(30s) == 1011);
    CHECK(metric(port, R"(outlive_thread_failures_total{thread="io"})") == 1);
    WsClient again(port, "/api/inventory/live", {{"Cookie", kAdaCookie}});
    again.send(sub("again").dump());
    CHECK(next_frame(again, 30s)["type"] == "subscribed");
    CHECK(child->running());
  }
  {
    const auto child = serve("io:first", "malformed");
    const int port = child->port();
    WsClient ws(port, "/api/inventory/live", {{"Cookie", kAdaCookie}});
    ws.send(sub("w").dump());
    CHECK(next_frame(ws, 30s)["type"] == "subscribed");
    CHECK(metric(port, R"(outlive_thread_failures_total{thread="io"})") == 0);
    std::ifstream in(child->log_path());
    const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK_THAT(log, Catch::Contains("OUTLIVE_FAULT=io:first is not <site>:<n>"));
  }
}
