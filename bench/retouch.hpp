#pragma once
// What this machine charges a process for touching its memory again after it slept (issue 13).
//
// On the 2-vCPU PVM guest the benches run on, a process that sleeps for a while pays on waking for
// every page it touches again, with no page fault the guest kernel sees: 64 MiB read one byte per
// page took 0.1-0.2 ms warm, 2 ms after 3 s asleep and 16-23 ms after 60-70 s (0.2 ms after 60 s
// of staying busy on other memory). The pool's Postgres backends and the replica's io threads sleep
// between revocations like this probe does, so a revocation after a pause pays it too; fanout_bench
// prints the probe's figure beside each revocation as part of its same-run floor.
#include <sys/types.h>

#include <chrono>

namespace outlive::bench {

class RetouchProbe {
 public:
  // Forks a child that maps `mib` MiB, touches every page, then sleeps until touch() wakes it.
  // Throws std::runtime_error when the child cannot be started.
  explicit RetouchProbe(int mib = 32);
  ~RetouchProbe();
  RetouchProbe(const RetouchProbe&) = delete;
  RetouchProbe& operator=(const RetouchProbe&) = delete;

  struct Touch {
    double slept_s = 0;         // since the previous touch() (or the start)
    double after_sleep_us = 0;  // per page, the first pass after the sleep
    double warm_us = 0;         // per page, a second pass right after it
    int pages = 0;
  };
  // Wakes the child: it reads one byte of every page twice, timing each pass, and sleeps again.
  Touch touch();

 private:
  pid_t child_ = -1;
  int to_child_ = -1, from_child_ = -1;
  int pages_ = 0;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace outlive::bench
