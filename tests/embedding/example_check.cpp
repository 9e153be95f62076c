// The installed-library example end to end (scripts/embedding-example.sh builds it against
// `cmake --install` output and runs this with OUTLIVE_NOTES_APP set): notes_app on a real
// PostgreSQL and nats-server serves its code channel over a real socket.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

#include "harness/process.hpp"
#include "support/frames.hpp"
#include "support/services.hpp"
#include "support/ws_client.hpp"

using namespace outlive;
using namespace outlive::testing;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {
// The value printed as `name=value` in the log, or "" while absent.
std::string printed(const std::string& log, const std::string& name) {
  std::ifstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + "=", 0) == 0) return line.substr(name.size() + 1);
  }
  return "";
}
}  // namespace

TEST_CASE("the example built against the installed library serves its code channel") {
  const char* app = std::getenv("OUTLIVE_NOTES_APP");
  REQUIRE(app != nullptr);
  const std::string db = fresh_database();
  harness::EmbeddedNats nats;
  const std::string log = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") +
                          "/notes_app_" + std::to_string(::getpid()) + ".log";
  harness::ChildProcess child({app, db, nats.url()}, log);
  REQUIRE(eventually([&] { return !printed(log, "port").empty() || !child.running(); }, 30s));
  INFO("log " << log);
  REQUIRE(child.running());
  const int port = std::stoi(printed(log, "port"));
  const std::string cursor = printed(log, "cursor");
  REQUIRE_FALSE(cursor.empty());

  WsClient ws(port, "/api/notes/live", {{"Cookie", "session=ada-token"}});
  ws.send(json{{"type", "sub"}, {"id", "m"}, {"channel", "note"}, {"scope", {{"note", "missing"}}}}
              .dump());
  const auto missing = next_frame(ws);
  CHECK(missing["type"] == "error");
  CHECK(missing["code"] == "not_found");
  // From the cursor the app read before its first update: that update comes after `subscribed`.
  ws.send(json{{"type", "sub"},
               {"id", "w"},
               {"channel", "note"},
               {"scope", {{"note", "welcome"}}},
               {"cursor", cursor}}
              .dump());
  const auto subscribed = next_frame(ws);
  INFO(subscribed.dump());
  REQUIRE(subscribed["type"] == "subscribed");
  const auto update = next_frame(ws);
  INFO(update.dump());
  CHECK(update["type"] == "update");
  CHECK(update["key"] == "note:welcome");
  CHECK(update["data"] == json{{"n", 1}});
  CHECK(WIFEXITED(child.stop()));
}
