#pragma once
// Runs the outlive binary to completion and keeps what it printed (stdout and stderr together).
#include <chrono>
#include <string>
#include <vector>

namespace outlive::testing {

struct Run {
  int exit_code = -1;  // -1: killed, or still running at the deadline
  std::string output;
};

Run run_outlive(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
                std::chrono::milliseconds deadline = std::chrono::seconds(60));

// A file with `text` in a temporary folder; its path.
std::string write_temp_file(const std::string& name, const std::string& text);

}  // namespace outlive::testing
