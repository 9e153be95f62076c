#pragma once
// Long-running loops take a Clock so tests can drive time instead of sleeping.
#include <chrono>

namespace outlive {

class Clock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  using duration = std::chrono::steady_clock::duration;
  virtual ~Clock() = default;
  virtual time_point now() const = 0;
};

class SteadyClock final : public Clock {
 public:
  time_point now() const override { return std::chrono::steady_clock::now(); }
  static const SteadyClock& instance() {
    static const SteadyClock clock;
    return clock;
  }
};

}  // namespace outlive
