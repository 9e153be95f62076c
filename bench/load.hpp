#pragma once
// The load gate (issue 13): a figure measured while the machine was busy with other work says
// little about the code, so each phase records the 1-minute load average at its start and end and
// a verdict is refused when either was above the limit.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "bench/common.hpp"

namespace outlive::bench {

constexpr double kLoadLimit = 1.0;

struct LoadWindow {
  double start = 0, end = 0;
  double max() const { return std::max(start, end); }
  bool quiet() const { return max() <= kLoadLimit; }
};

// Starts at construction; stop() takes the end sample.
class LoadSampler {
 public:
  LoadSampler() { w_.start = load_average(); }
  LoadWindow stop() {
    w_.end = load_average();
    return w_;
  }

 private:
  LoadWindow w_;
};

// "" when every phase was quiet, else "no verdict: load X during phase Y" (the worst).
template <typename Phases>  // range of (name, LoadWindow)
std::string no_verdict(const Phases& phases) {
  double worst = 0;
  std::string where;
  for (const auto& [name, w] : phases) {
    if (!w.quiet() && w.max() > worst) {
      worst = w.max();
      where = name;
    }
  }
  if (where.empty()) return "";
  return "no verdict: load " + fixed(worst, 2) + " during phase " + where;
}

// Waits until the 1-minute load average is at most `limit` or `max_seconds` passed; returns the
// seconds waited. A phase that starts at 0.5 on two cores and keeps them busy for 10 s ends near
// 0.7 (the average decays with a 1-minute time constant), so a run that settles before each phase
// can keep the whole phase under the gate's 1.0; one that does not starts each phase with the
// previous phase's tail.
inline double settle_load(double limit, double max_seconds) {
  const auto start = std::chrono::steady_clock::now();
  auto waited = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  while (load_average() > limit && waited() < max_seconds)
    std::this_thread::sleep_for(std::chrono::seconds(1));
  return waited();
}

inline std::string machine_line() {
  return command_output("nproc") + " CPUs (nproc), " + cpu_model() + ", kernel " +
         command_output("uname -r");
}

}  // namespace outlive::bench
