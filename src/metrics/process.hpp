#pragma once
// The process_* series Prometheus' own client libraries export (prometheus-cpp has none), read
// from /proc/self, and outlive_build_info.
#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "metrics/metrics.hpp"

namespace outlive::metrics {

// /proc/self/stat's figures, or nullopt when it cannot be read (not Linux).
struct ProcessStat {
  double cpu_seconds = 0;         // user + system
  double start_time_seconds = 0;  // since the epoch
  double virtual_bytes = 0;
  double resident_bytes = 0;
};
std::optional<ProcessStat> read_process_stat();
// Entries of /proc/self/fd (-1 when it cannot be read).
double count_open_fds();

class ProcessMetrics {
 public:
  // Registers process_* and outlive_build_info{version,commit} on `registry`.
  static std::shared_ptr<ProcessMetrics> register_on(Registry& registry);
  // process_open_fds is sampled here rather than by the scrape: listing /proc/self/fd takes time
  // in proportion to the descriptors (docs/OPERATING.md), and a scrape runs on an io thread whose
  // sockets wait for it. Call it from a background thread.
  void sample_open_fds() { open_fds_ = count_open_fds(); }

 private:
  std::atomic<double> open_fds_{-1};
};

}  // namespace outlive::metrics
