#pragma once
// The clocks the Verifier reads: the real ones, or a test's ManualTime, so refetch schedules
// (max-age up to an hour, the 60 s unknown-kid limit, the 24 h a stale key set is kept) are
// tested by moving time instead of waiting for it.
#include <atomic>
#include <chrono>
#include <cstdint>

namespace outlive::jwt {

class Time {
 public:
  virtual ~Time() = default;
  // For schedules.
  virtual std::chrono::steady_clock::time_point steady() const = 0;
  // For `exp`, `nbf` and `iat`: unix seconds.
  virtual int64_t unix_seconds() const = 0;
};

class RealTime final : public Time {
 public:
  std::chrono::steady_clock::time_point steady() const override {
    return std::chrono::steady_clock::now();
  }
  int64_t unix_seconds() const override {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

// Stands still from the moment it is made until advance() moves both clocks; then call
// Verifier::time_moved() so the refetch thread looks at it again.
class ManualTime final : public Time {
 public:
  ManualTime()
      : steady_start_(std::chrono::steady_clock::now()), unix_start_(RealTime().unix_seconds()) {}
  std::chrono::steady_clock::time_point steady() const override {
    return steady_start_ + std::chrono::seconds(offset_.load());
  }
  int64_t unix_seconds() const override { return unix_start_ + offset_.load(); }
  void advance(std::chrono::seconds by) { offset_ += by.count(); }

 private:
  const std::chrono::steady_clock::time_point steady_start_;
  const int64_t unix_start_;
  std::atomic<int64_t> offset_{0};
};

}  // namespace outlive::jwt
