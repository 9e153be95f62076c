#pragma once
#include <sys/types.h>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace outlive::harness {

struct RunAs {
  uid_t uid;
  gid_t gid;
};

// A child process that dies with us: it gets SIGKILL when the thread that started it exits
// (PR_SET_PDEATHSIG), so a crashed test leaves no server behind.
class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(const std::vector<std::string>& argv, const std::string& log_file,
               std::optional<RunAs> run_as = std::nullopt,
               const std::vector<std::string>& extra_env = {});
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  bool running();
  // Sends `signal`, waits up to `grace`, then SIGKILL. Returns the exit status (waitpid form).
  int stop(int signal = 15, std::chrono::milliseconds grace = std::chrono::seconds(10));
  // Waits for exit up to `timeout`; nullopt if still running.
  std::optional<int> wait_for(std::chrono::milliseconds timeout);

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// Runs a command to completion; throws outlive::Error with the log's tail when it fails.
void run_checked(const std::vector<std::string>& argv, const std::string& log_file,
                 std::optional<RunAs> run_as = std::nullopt);

// A TCP port on 127.0.0.1 that was free a moment ago.
int free_port();
// True once a TCP connect to 127.0.0.1:port succeeds.
bool port_accepts(int port);
// mkdtemp under $TMPDIR (or /tmp) with the given prefix.
std::string make_temp_dir(const std::string& prefix);
void remove_tree(const std::string& path);
std::string tail_of_file(const std::string& path, size_t max_bytes = 4000);

}  // namespace outlive::harness
