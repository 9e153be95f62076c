#pragma once
// Helpers the benchmark programs share: number formatting for their tables, the machine's
// description (CPU model, load, time) and CPU seconds per process from /proc.
#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace outlive::bench {

inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

inline std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// 1234567 -> "1,234,567"
inline std::string thousands(double v) {
  const bool negative = v < 0;
  std::string s = std::to_string(static_cast<long long>(std::fabs(v) + 0.5));
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return negative ? "-" + s : s;
}

inline double load_average() {
  double l = 0;
  std::ifstream("/proc/loadavg") >> l;
  return l;
}

inline std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  return s.substr(i);
}

inline std::string command_output(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[256];
    while (fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  return trim(out);
}

inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return trim(line.substr(colon + 1));
    }
  }
  return "unknown";
}

inline std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&t));
  return buf;
}

struct ProcStat {
  int pid = 0;
  int ppid = 0;
  std::string comm;
  double own = 0;       // utime + stime, seconds
  double children = 0;  // cutime + cstime (reaped children), seconds
};

inline std::optional<ProcStat> read_proc(const std::string& pid) {
  static const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  std::ifstream in("/proc/" + pid + "/stat");
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  const auto open = line.find('('), close = line.rfind(')');
  if (open == std::string::npos || close == std::string::npos) return std::nullopt;
  ProcStat p;
  p.pid = std::atoi(pid.c_str());
  p.comm = line.substr(open + 1, close - open - 1);
  std::istringstream rest(line.substr(close + 2));
  std::vector<std::string> fields;  // from field 3 (state) on
  for (std::string f; rest >> f;) fields.push_back(f);
  if (fields.size() < 15) return std::nullopt;
  p.ppid = std::atoi(fields[1].c_str());
  p.own = (std::atof(fields[11].c_str()) + std::atof(fields[12].c_str())) / tick;
  p.children = (std::atof(fields[13].c_str()) + std::atof(fields[14].c_str())) / tick;
  return p;
}

// Seconds a process (or thread) has spent on a CPU, from /proc/<pid>/schedstat: nanoseconds,
// exact, where /proc/<pid>/stat counts 10 ms ticks. nullopt when it is gone.
inline std::optional<double> on_cpu_seconds(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/schedstat");
  double ns = 0;
  if (!(in >> ns)) return std::nullopt;
  return ns / 1e9;
}

// A process's CPU seconds so far by thread name (/proc/<pid>/task/<tid>/comm and schedstat):
// outlive names its threads (outlive-io-0, outlive-fanout, outlive-db-3, ...).
inline std::map<std::string, double> on_cpu_seconds_by_thread(int pid) {
  std::map<std::string, double> out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream comm(dir + "/" + e->d_name + "/comm");
    std::string name;
    std::getline(comm, name);
    if (const auto s = on_cpu_seconds(std::stoi(e->d_name))) out[name] += *s;
  }
  closedir(d);
  return out;
}

// "outlive-io-0 28.1 ms, outlive-fanout 9.9 ms, ...": the CPU each thread name used between two
// readings, largest first, those under 0.5 ms left out.
inline std::string thread_cpu_since(const std::map<std::string, double>& before,
                                    const std::map<std::string, double>& after) {
  std::vector<std::pair<double, std::string>> used;
  for (const auto& [name, s] : after) {
    auto b = before.find(name);
    const double ms = (s - (b == before.end() ? 0 : b->second)) * 1e3;
    if (ms >= 0.5) used.emplace_back(ms, name);
  }
  std::sort(used.rbegin(), used.rend());
  std::string out;
  for (const auto& [ms, name] : used) {
    if (!out.empty()) out += ", ";
    out += name + " " + fixed(ms, 1) + " ms";
  }
  return out.empty() ? "none" : out;
}

// Every process on the machine, as /proc shows it now.
inline std::vector<ProcStat> read_procs() {
  std::vector<ProcStat> out;
  DIR* dir = opendir("/proc");
  if (dir == nullptr) return out;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    if (auto p = read_proc(e->d_name)) out.push_back(std::move(*p));
  }
  closedir(dir);
  return out;
}

// This process's CPU seconds so far (user + system, its threads included).
inline double self_cpu_seconds() {
  rusage self{};
  getrusage(RUSAGE_SELF, &self);
  return static_cast<double>(self.ru_utime.tv_sec) + self.ru_utime.tv_usec / 1e6 +
         static_cast<double>(self.ru_stime.tv_sec) + self.ru_stime.tv_usec / 1e6;
}

// The PostgreSQL postmasters among `procs` that `parent` started (src/harness's embedded servers).
inline std::vector<int> postmasters_of(const std::vector<ProcStat>& procs, int parent = getpid()) {
  std::vector<int> out;
  for (const auto& p : procs)
    if (p.ppid == parent && p.comm == "postgres") out.push_back(p.pid);
  return out;
}

// The CPU seconds so far of the services a bench runs as its own children: PostgreSQL (each
// postmaster, the backends it reaped and its live ones) and nats-server.
struct ServiceCpu {
  double postgres = 0, nats = 0;
  ServiceCpu operator-(const ServiceCpu& o) const { return {postgres - o.postgres, nats - o.nats}; }
};

inline ServiceCpu service_cpu(const std::vector<ProcStat>& procs, int parent = getpid()) {
  ServiceCpu c;
  const auto postmasters = postmasters_of(procs, parent);
  for (const auto& p : procs) {
    if (p.ppid == parent && p.comm == "postgres") {
      c.postgres += p.own + p.children;
    } else if (p.ppid == parent && p.comm == "nats-server") {
      c.nats += p.own;
    } else if (std::find(postmasters.begin(), postmasters.end(), p.ppid) != postmasters.end()) {
      c.postgres += p.own;
    }
  }
  return c;
}

// The drain after a phase's writing: waits until `count()` reaches `want`, polling every 20 ms.
// Gives up when the count has not moved for `stall_s` or after `timeout_s` in all, and says so
// in `note` ("no new <what> for 10 s; ").
struct Drained {
  bool complete = false;
  std::string note;
};

template <typename Count>
Drained wait_drained(Count&& count, int64_t want, double timeout_s, const std::string& what,
                     double stall_s = 10) {
  using Clock = std::chrono::steady_clock;
  Drained d;
  const auto start = Clock::now();
  int64_t last_seen = -1;
  auto last_change = start;
  for (;;) {
    const auto got = static_cast<int64_t>(count());
    if (got != last_seen) {
      last_seen = got;
      last_change = Clock::now();
    }
    if (got >= want) {
      d.complete = true;
      return d;
    }
    if (seconds_since(last_change) > stall_s) {
      d.note = "no new " + what + " for " + fixed(stall_s, 0) + " s; ";
      return d;
    }
    if (seconds_since(start) > timeout_s) {
      d.note = "drain timeout " + fixed(timeout_s, 0) + " s; ";
      return d;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace outlive::bench
