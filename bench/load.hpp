#pragma once
// The load gate (issue 13): a figure measured while the machine was busy with other work says
// little about the code, so each phase records the 1-minute load average at its start and end and
// a verdict is refused when either was above the limit.
#include <algorithm>
#include <fstream>
#include <string>

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

inline std::string machine_line() {
  return command_output("nproc") + " CPUs (nproc), " + cpu_model() + ", kernel " +
         command_output("uname -r");
}

}  // namespace outlive::bench
