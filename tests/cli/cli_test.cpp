// The command line (SPEC 6 rev 3): --help and version exit 0, usage errors exit 2 with a message.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/run.hpp"
#include "support/services.hpp"

using outlive::testing::run_outlive;
using outlive::testing::write_temp_file;

namespace {

// The example configuration with an unknown field, so loading it fails with a path.
std::string broken_config() {
  std::ifstream in(outlive::testing::source_path("examples/inventory/outlive.json"));
  auto doc = nlohmann::json::parse(in);
  doc["server"] = {{"colour", "red"}};
  return write_temp_file("broken.json", doc.dump(2));
}

}  // namespace

TEST_CASE("outlive --help lists the commands and exits 0") {
  const auto r = run_outlive({"--help"});
  CHECK(r.exit_code == 0);
  for (const char* command : {"serve", "migrate", "check", "version", "cursor", "dev"}) {
    CHECK_THAT(r.output, Catch::Contains(command));
  }
}

TEST_CASE("every command's --help prints its usage and exits 0") {
  for (const std::string command : {"serve", "migrate", "check", "version", "cursor", "dev"}) {
    INFO(command);
    const auto r = run_outlive({command, "--help"});
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.output, Catch::Contains("outlive " + command));
  }
  CHECK_THAT(run_outlive({"serve", "--help"}).output, Catch::Contains("--config"));
  CHECK_THAT(run_outlive({"migrate", "--help"}).output, Catch::Contains("--database"));
}

TEST_CASE("outlive version and --version print the project's version") {
  const std::string expected = std::string("outlive ") + OUTLIVE_VERSION + "\n";
  const auto command = run_outlive({"version"});
  CHECK(command.exit_code == 0);
  CHECK(command.output == expected);
  const auto flag = run_outlive({"--version"});
  CHECK(flag.exit_code == 0);
  CHECK(flag.output == expected);
}

TEST_CASE("usage errors exit 2 and say what is wrong") {
  SECTION("no command") {
    const auto r = run_outlive({});
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("subcommand"));
  }
  SECTION("an unknown command") {
    const auto r = run_outlive({"frobnicate"});
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("frobnicate"));
  }
  SECTION("an unknown flag") {
    const auto r = run_outlive({"serve", "--config", "x.json", "--colour", "red"});
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("--colour"));
  }
  SECTION("a misspelled flag is not ignored") {
    const auto r = run_outlive({"check", "--confg", "x.json"});
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("--confg"));
  }
  SECTION("a missing required flag") {
    const auto r = run_outlive({"serve"});
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("--config"));
    CHECK_THAT(r.output, Catch::Contains("required"));
  }
  SECTION("a flag without its value") {
    const auto r = run_outlive({"check", "--config"});
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains("--config"));
  }
}

TEST_CASE("the config flag takes its value after = or a space") {
  const std::string path = broken_config();
  for (const auto& args : std::vector<std::vector<std::string>>{{"check", "--config", path},
                                                                {"check", "--config=" + path},
                                                                {"serve", "--config=" + path}}) {
    INFO(args.back());
    const auto r = run_outlive(args);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Catch::Contains(path));
    CHECK_THAT(r.output, Catch::Contains("/server"));
  }
}

TEST_CASE("a configuration file that cannot be read exits 2 naming it") {
  const auto r = run_outlive({"check", "--config", "/nonexistent/outlive.json"});
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("/nonexistent/outlive.json"));
}
