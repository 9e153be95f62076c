#include "metrics/process.hpp"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#ifndef OUTLIVE_VERSION
#define OUTLIVE_VERSION "unknown"
#endif
#ifndef OUTLIVE_COMMIT
#define OUTLIVE_COMMIT "unknown"
#endif

namespace outlive::metrics {

namespace {

// The boot time (/proc/stat's btime): /proc/self/stat gives the start in ticks since boot.
double boot_time_seconds() {
  std::ifstream in("/proc/stat");
  std::string key;
  double value = 0;
  while (in >> key) {
    if (key == "btime") {
      in >> value;
      return value;
    }
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return 0;
}

}  // namespace

std::optional<ProcessStat> read_process_stat() {
  std::ifstream in("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The command name in parentheses may hold spaces and parentheses: the fields follow the last.
  const auto end_of_name = text.rfind(')');
  if (end_of_name == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(end_of_name + 2));
  std::vector<std::string> f;
  for (std::string field; fields >> field;) f.push_back(field);
  // proc(5) numbers the fields from 1 with the pid; f[0] is field 3 (state).
  const auto at = [&](size_t field) { return std::stod(f.at(field - 3)); };
  if (f.size() < 22) return std::nullopt;
  static const double ticks = double(::sysconf(_SC_CLK_TCK));
  static const double page = double(::sysconf(_SC_PAGESIZE));
  static const double boot = boot_time_seconds();
  ProcessStat s;
  s.cpu_seconds = (at(14) + at(15)) / ticks;
  s.start_time_seconds = boot + at(22) / ticks;
  s.virtual_bytes = at(23);
  s.resident_bytes = at(24) * page;
  return s;
}

double count_open_fds() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return -1;
  double n = 0;
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(dir);
  return n - 1;  // opendir's own descriptor
}

std::shared_ptr<ProcessMetrics> ProcessMetrics::register_on(Registry& registry) {
  auto self = std::make_shared<ProcessMetrics>();
  self->sample_open_fds();
  registry.gauge("outlive_build_info", "The running build (always 1)",
                 {{"version", OUTLIVE_VERSION}, {"commit", OUTLIVE_COMMIT}}, [] { return 1.0; });
  const auto stat = [](double ProcessStat::*field) {
    return [field] {
      const auto s = read_process_stat();
      return s ? (*s).*field : 0.0;
    };
  };
  registry.counter("process_cpu_seconds_total", "User and system CPU time spent in seconds", {},
                   stat(&ProcessStat::cpu_seconds));
  registry.gauge("process_start_time_seconds",
                 "Start time of the process since unix epoch in seconds", {},
                 [start = stat(&ProcessStat::start_time_seconds)()] { return start; });
  registry.gauge("process_virtual_memory_bytes", "Virtual memory size in bytes", {},
                 stat(&ProcessStat::virtual_bytes));
  registry.gauge("process_resident_memory_bytes", "Resident memory size in bytes", {},
                 stat(&ProcessStat::resident_bytes));
  registry.gauge("process_open_fds",
                 "Number of open file descriptors (sampled every 5 s; -1 when unknown)", {},
                 [weak = std::weak_ptr<ProcessMetrics>(self)] {
                   const auto p = weak.lock();
                   return p ? p->open_fds_.load() : -1.0;
                 });
  registry.gauge("process_max_fds", "Maximum number of open file descriptors", {}, [] {
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return -1.0;
    return double(limit.rlim_cur);
  });
  return self;
}

}  // namespace outlive::metrics
