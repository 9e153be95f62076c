#include "common/outage_log.hpp"

namespace outlive::log {

namespace {
double seconds(OutageLog::Clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

OutageLog::OutageLog(std::string what, Level level, std::chrono::milliseconds repeat, Writer write)
    : what_(std::move(what)),
      level_(level),
      repeat_(repeat),
      write_(write ? std::move(write) : Writer([](Level l, std::string_view m, const nlohmann::json& f) {
        log::write(l, m, f);
      })) {}

void OutageLog::failed(const std::string& error, const nlohmann::json& fields, Clock::time_point now) {
  std::unique_lock lock(mutex_);
  ++failures_;
  ++unreported_;
  nlohmann::json out = fields.is_object() ? fields : nlohmann::json::object();
  out["error"] = error;
  if (!since_) {
    since_ = now;
    last_line_ = now;
    unreported_ = 0;
    lock.unlock();
    return write_(level_, what_ + " failed", out);
  }
  if (now - last_line_ < repeat_) return;
  out["failures"] = unreported_;
  out["failing_for_s"] = seconds(now - *since_);
  last_line_ = now;
  unreported_ = 0;
  lock.unlock();
  write_(level_, what_ + " still failing", out);
}

void OutageLog::succeeded(Clock::time_point now) {
  std::unique_lock lock(mutex_);
  if (!since_) return;
  const nlohmann::json out = {{"outage_s", seconds(now - *since_)}, {"failures", failures_}};
  since_.reset();
  failures_ = 0;
  unreported_ = 0;
  lock.unlock();
  write_(Level::info, what_ + " works again", out);
}

bool OutageLog::failing() const {
  std::lock_guard lock(mutex_);
  return since_.has_value();
}

}  // namespace outlive::log
