// /metrics of a real replica (on real PostgreSQL and nats-server) through Prometheus' own parser
// (promtool check metrics, Debian's prometheus package), then its types and values.
#include <nats/nats.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "support/inventory.hpp"
#include "support/replica_fixture.hpp"
#include "support/services.hpp"
#include "support/ws_client.hpp"
#include "topic/client.hpp"

using namespace outlive;
using namespace outlive::testing;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

const std::string kSchema = kInventoryTables + kAdaSeed;

struct Exposition {
  std::map<std::string, std::string> types;           // family -> TYPE
  std::vector<std::pair<std::string, double>> lines;  // series (name{labels}) -> value, in order
  std::map<std::string, double> values;

  explicit Exposition(const std::string& text) {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("# TYPE ", 0) == 0) {
        std::istringstream t(line.substr(7));
        std::string name, type;
        t >> name >> type;
        types[name] = type;
      } else if (!line.empty() && line[0] != '#') {
        const auto space = line.rfind(' ');
        const auto series = line.substr(0, space);
        const auto v = line.substr(space + 1);
        const double value = v == "+Inf" ? INFINITY : std::stod(v);
        lines.emplace_back(series, value);
        values[series] = value;
      }
    }
  }
  double at(const std::string& series) const {
    const auto it = values.find(series);
    if (it == values.end()) FAIL("no series " << series);
    return it->second;
  }
};

// promtool's exit code and what it printed, for `text` on its standard input.
std::pair<int, std::string> promtool_check(const std::string& text) {
  const std::string file = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") +
                           "/outlive-metrics-" + std::to_string(::getpid()) + ".txt";
  std::ofstream(file) << text;
  FILE* p = ::popen(("promtool check metrics < '" + file + "' 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  std::string said;
  char buffer[512];
  while (size_t n = std::fread(buffer, 1, sizeof buffer, p)) said.append(buffer, n);
  const int status = ::pclose(p);
  std::remove(file.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, said};
}

// Moves the app's stream to `first` (JetStream's purge up to a sequence past the last): the
// window then meets a gap of first - 1 positions it never read, as after retention.
void move_stream_to(const std::string& nats_url, const std::string& app, uint64_t first) {
  natsConnection* nc = nullptr;
  REQUIRE(natsConnection_ConnectTo(&nc, nats_url.c_str()) == NATS_OK);
  natsMsg* reply = nullptr;
  const std::string subject = "$JS.API.STREAM.PURGE." + topic::stream_name_for(app);
  const std::string body = R"({"seq":)" + std::to_string(first) + "}";
  const auto s = natsConnection_RequestString(&reply, nc, subject.c_str(), body.c_str(), 5000);
  std::string answer =
      reply ? std::string(natsMsg_GetData(reply), natsMsg_GetDataLength(reply)) : "";
  natsMsg_Destroy(reply);
  natsConnection_Destroy(nc);
  REQUIRE(s == NATS_OK);
  INFO(answer);
  REQUIRE(json::parse(answer).value("success", false));
}

}  // namespace

TEST_CASE("metrics pass promtool and have their types, exact counts and cumulative buckets") {
  ReplicaFixture f(kSchema, [](const std::string& db, const std::string& nats) {
    const json channels = {{"warehouse",
                            {{"scope", kWarehouseScopeSchema},
                             {"keys", kWarehouseKeys},
                             {"authorize", kWarehouseAuthorize}}}};
    return inventory_replica_config(db, nats, "r1", channels);
  });
  const int port = f.port;

  // 2^25 positions gone before the replica read them: a count six significant digits cannot print.
  constexpr uint64_t kLost = 33554432;
  move_stream_to(f.nats.url(), "inventory", kLost + 1);

  WsClient ws(port, "/api/inventory/live", {{"Cookie", kAdaCookie}});
  ws.send(
      json{{"type", "sub"}, {"id", "w"}, {"channel", "warehouse"}, {"scope", kNorthScope}}.dump());
  ws.next_of_type("subscribed");
  f.publish(kNorth, {{"n", 1}});
  ws.next_of_type("update", 15s);

  // Every count of that update is in before the scrape that is checked.
  std::string text;
  REQUIRE(eventually(
      [&] {
        text = http_get(port, "/metrics").second;
        const Exposition e(text);
        const auto v = [&](const std::string& s) {
          const auto it = e.values.find(s);
          return it == e.values.end() ? -1.0 : it->second;
        };
        return v(R"(outlive_published_total{app="inventory"})") == 1 &&
               v(R"(outlive_commit_to_ack_seconds_count{app="inventory"})") == 1 &&
               v(R"(outlive_commit_to_send_seconds_count{app="inventory"})") >= 1 &&
               v(R"(outlive_topic_lost_total{app="inventory"})") > 0;
      },
      15s, 50ms));
  INFO(text);

  const auto [status, said] = promtool_check(text);
  INFO("promtool: " << said);
  CHECK(status == 0);
  CHECK(said.empty());  // no lint warnings either

  Exposition e(text);
  for (const char* counter : {"outlive_published_total", "outlive_publish_errors_total",
                              "outlive_topic_lost_total", "outlive_ownership_losses_total",
                              "outlive_publish_fenced_total", "outlive_frames_sent_total",
                              "outlive_sockets_opened_total", "outlive_authorize_calls_total",
                              "outlive_subscriptions_started_total", "process_cpu_seconds_total"}) {
    INFO(counter);
    CHECK(e.types[counter] == "counter");
  }
  for (const char* histogram : {"outlive_commit_to_ack_seconds", "outlive_commit_to_send_seconds",
                                "outlive_authorize_seconds"}) {
    INFO(histogram);
    CHECK(e.types[histogram] == "histogram");
  }
  for (const char* gauge : {"outlive_outbox_pending", "outlive_outbox_oldest_age_seconds",
                            "outlive_sockets", "outlive_partitions_owned", "outlive_build_info",
                            "process_resident_memory_bytes", "process_virtual_memory_bytes",
                            "process_open_fds", "process_max_fds", "process_start_time_seconds"}) {
    INFO(gauge);
    CHECK(e.types[gauge] == "gauge");
  }
  for (const auto& [name, type] : e.types) {
    INFO(name);
    CHECK(type != "summary");
    CHECK(type != "untyped");
    CHECK((type == "counter") == (name.size() > 6 && name.substr(name.size() - 6) == "_total"));
  }

  // Exact, not 3.35544e+07.
  CHECK_THAT(text, Catch::Contains("\noutlive_topic_lost_total{app=\"inventory\"} 33554432\n"));
  CHECK(e.at(R"(outlive_topic_lost_total{app="inventory"})") == kLost);
  // Publishing and outbox series by app.
  CHECK(e.at(R"(outlive_publish_errors_total{app="inventory"})") == 0);
  CHECK(e.at(R"(outlive_publish_fenced_total{app="inventory"})") == 0);
  CHECK(e.at(R"(outlive_outbox_pending{app="inventory"})") >= 0);
  CHECK(e.at(R"(outlive_outbox_oldest_age_seconds{app="inventory"})") >= 0);
  CHECK(e.at(R"(outlive_frames_sent_total{app="inventory"})") >= 1);
  CHECK(e.at("process_resident_memory_bytes") > 1e6);
  CHECK(e.at("process_open_fds") > 0);
  CHECK(e.at("process_open_fds") < e.at("process_max_fds"));

  // Each histogram series: bounds rising, counts never falling, +Inf last and equal to _count.
  int series_checked = 0;
  for (const char* name : {"outlive_commit_to_ack_seconds", "outlive_commit_to_send_seconds",
                           "outlive_authorize_seconds"}) {
    const std::string prefix = std::string(name) + "_bucket{app=\"inventory\",le=\"";
    double last_bound = -1, last_count = 0;
    std::string last_le;
    int buckets = 0;
    for (const auto& [series, value] : e.lines) {
      if (series.rfind(prefix, 0) != 0) continue;
      last_le = series.substr(prefix.size(), series.size() - prefix.size() - 2);
      const double bound = last_le == "+Inf" ? INFINITY : std::stod(last_le);
      INFO(series);
      CHECK(bound > last_bound);
      CHECK(value >= last_count);
      last_bound = bound;
      last_count = value;
      ++buckets;
    }
    INFO(name);
    CHECK(buckets == 14);  // 13 bounds, 1 ms .. 10 s, and +Inf
    CHECK(last_le == "+Inf");
    CHECK(last_count == e.at(std::string(name) + "_count{app=\"inventory\"}"));
    CHECK(last_count >= 1);
    CHECK(e.at(std::string(name) + "_sum{app=\"inventory\"}") >= 0);
    ++series_checked;
  }
  CHECK(series_checked == 3);
}
