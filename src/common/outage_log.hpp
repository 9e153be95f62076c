#pragma once
// One dependency's outage as an operator wants to read it (issue 47 item 9): a line when it is
// lost, then at most one line every `repeat` while it stays lost (how many failures since the last
// line), and one line when it is back with the outage's length. A 15 s Postgres outage used to
// write about six lines a second, each with libpq's whole text. Thread-safe; time is passed in, so
// tests drive it.
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/log.hpp"

namespace outlive::log {

class OutageLog {
 public:
  using Clock = std::chrono::steady_clock;
  using Writer = std::function<void(Level, std::string_view message, const nlohmann::json& fields)>;

  // `what` names the dependency and the loss ("publisher: deleting acked updates"); lines read
  // "<what> failed", "<what> still failing", "<what> works again". `write` defaults to log::write.
  explicit OutageLog(std::string what, Level level = Level::warn,
                     std::chrono::milliseconds repeat = std::chrono::seconds(10), Writer write = {});

  // A failure at `now`, with its error and the caller's fields.
  void failed(const std::string& error, const nlohmann::json& fields = nlohmann::json::object(),
              Clock::time_point now = Clock::now());
  // A success at `now`: the line that ends an outage, nothing otherwise.
  void succeeded(Clock::time_point now = Clock::now());
  bool failing() const;

 private:
  const std::string what_;
  const Level level_;
  const std::chrono::milliseconds repeat_;
  const Writer write_;
  mutable std::mutex mutex_;
  std::optional<Clock::time_point> since_;  // the outage's first failure
  Clock::time_point last_line_{};
  uint64_t failures_ = 0;         // in this outage
  uint64_t unreported_ = 0;       // since the last line
};

}  // namespace outlive::log
