#include "cli/run.hpp"

#include <sys/wait.h>

#include <atomic>
#include <fstream>
#include <sstream>

#include "harness/process.hpp"
#include "support/services.hpp"

namespace outlive::testing {

namespace {
const std::string& temp_dir() {
  static const std::string dir = harness::make_temp_dir("outlive-cli-test-");
  return dir;
}
}  // namespace

Run run_outlive(const std::vector<std::string>& args, const std::vector<std::string>& env,
                std::chrono::milliseconds deadline) {
  static std::atomic<int> counter{0};
  const std::string log = temp_dir() + "/run-" + std::to_string(++counter) + ".log";
  std::vector<std::string> argv = {outlive_binary()};
  argv.insert(argv.end(), args.begin(), args.end());
  harness::ChildProcess child(argv, log, std::nullopt, env);
  Run run;
  if (const auto status = child.wait_for(deadline)) {
    if (WIFEXITED(*status)) run.exit_code = WEXITSTATUS(*status);
  } else {
    child.stop(9);
  }
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  run.output = text.str();
  return run;
}

std::string write_temp_file(const std::string& name, const std::string& text) {
  const std::string path = temp_dir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

}  // namespace outlive::testing
