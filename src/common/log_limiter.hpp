#pragma once
// How many lines of one message log::limited() writes. A network blip closes thousands of sockets
// within a second and each would say so: an operator needs the first few lines and a count, not
// a hundred thousand lines that block the io threads on stderr and bury everything else.
// Thread-safe; time is passed in, so tests drive it.
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/log.hpp"

namespace outlive::log {

class LineLimiter {
 public:
  using Clock = std::chrono::steady_clock;

  // A token bucket per message: `burst` lines in a row, then `per_second` a second. The lines it
  // refuses are counted and reported once `window` after the first of them was refused.
  LineLimiter(double per_second, double burst,
              std::chrono::milliseconds window = std::chrono::seconds(1));

  enum class Verdict {
    write,
    counted,
    counted_first,  // the first refused since the last report: one is due a window from now
  };
  // Whether a line of `message` may be written at `now`; when not, it is counted (and reported at
  // `level`).
  Verdict admit(std::string_view message, Level level, Clock::time_point now);

  struct Suppressed {
    std::string message;
    Level level = Level::info;
    uint64_t count = 0;
  };
  // The messages whose refused lines have waited a window by `now`, with their counts; those
  // counts start again from zero.
  std::vector<Suppressed> take_due(Clock::time_point now);

  // When take_due() next has something to report; time_point::max() when nothing is counted.
  Clock::time_point next_due() const;

 private:
  struct Bucket {
    double tokens = 0;
    Clock::time_point refilled{};
    uint64_t suppressed = 0;
    Clock::time_point report_at{};  // valid while suppressed > 0
    Level level = Level::info;
  };

  const double per_second_;
  const double burst_;
  const std::chrono::milliseconds window_;
  mutable std::mutex mutex_;
  // Keyed by message text: the messages are literals of the code, so the map stays small.
  std::map<std::string, Bucket, std::less<>> buckets_;
};

}  // namespace outlive::log
