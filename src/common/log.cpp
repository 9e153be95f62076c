#include "common/log.hpp"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <thread>

#include "common/error.hpp"
#include "common/log_limiter.hpp"
#include "common/thread_name.hpp"

namespace outlive::log {
namespace {

constexpr const char* kVariable = "OUTLIVE_LOG_LEVEL";

// Before main() checks the variable (and in an embedding, which has no main of ours): a level that
// does not parse leaves info rather than failing a static initialiser.
Level initial_level() {
  const char* env = std::getenv(kVariable);
  return env ? parse_level(env).value_or(Level::info) : Level::info;
}

std::atomic<Level> min_level{initial_level()};

// Leaked: the reporter thread may write while static destructors run at exit.
std::mutex& write_mutex() {
  static auto* m = new std::mutex;
  return *m;
}

void emit(const std::string& text) {
  std::lock_guard lock(write_mutex());
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

// The counts of limited() lines, reported by a thread of their own: the line that says how many
// were suppressed must come even when no line of that message follows. Started at the first
// suppressed line (most processes never need it) and leaked, like write_mutex().
class Reporter {
 public:
  static Reporter& instance() {
    static auto* r = new Reporter;
    return *r;
  }

  LineLimiter limiter{kLimitedPerSecond, kLimitedBurst};

  // After admit() counted the first line of a window: the thread waits for an earlier time, if
  // any, and must look again. (Under mutex_: the thread reads next_due() under it and waits
  // atomically, so this cannot fall between the two.)
  void wake() {
    std::lock_guard lock(mutex_);
    if (!started_) {
      started_ = true;
      std::thread([this] { run(); }).detach();
    }
    cv_.notify_one();
  }

 private:
  void run() {
    // Never the thread a stop signal goes to: main() waits for those with sigwait.
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);
    name_this_thread("log-reporter");
    std::unique_lock lock(mutex_);
    for (;;) {
      const auto next = limiter.next_due();
      if (next == LineLimiter::Clock::time_point::max()) {
        cv_.wait(lock);
      } else {
        cv_.wait_until(lock, next);
      }
      lock.unlock();
      for (const auto& s : limiter.take_due(LineLimiter::Clock::now())) {
        write(s.level, s.message + " (suppressed)", {{"suppressed", s.count}});
      }
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  bool started_ = false;
};

bool reserved(const std::string& key) {
  return key == "time" || key == "level" || key == "logger" || key == "msg";
}

std::string dump(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::optional<Level> parse_level(std::string_view text) {
  for (Level l : {Level::debug, Level::info, Level::warn, Level::error}) {
    if (text == level_name(l)) return l;
  }
  return std::nullopt;
}

const char* level_name(Level level) {
  switch (level) {
    case Level::debug:
      return "debug";
    case Level::info:
      return "info";
    case Level::warn:
      return "warn";
    case Level::error:
      return "error";
  }
  return "info";
}

Level level_from_environment(const char* value) {
  if (value == nullptr || *value == '\0') return Level::info;
  if (const auto level = parse_level(value)) return *level;
  throw Error(Errc::invalid_input, std::string(kVariable) + ": " + dump(std::string(value)) +
                                       " is not a log level (debug, info, warn or error, in "
                                       "lower case)");
}

Level level_from_environment() { return level_from_environment(std::getenv(kVariable)); }

Level configured_level(const char* environment, std::string_view configured) {
  if (environment != nullptr && *environment != '\0') return level_from_environment(environment);
  return parse_level(configured).value_or(Level::info);
}

void set_min_level(Level level) { min_level = level; }

std::string format_time(std::chrono::system_clock::time_point at) {
  const auto ms = std::chrono::floor<std::chrono::milliseconds>(at.time_since_epoch()).count();
  // Floor division: a time before 1970 still gets milliseconds in 0..999.
  const time_t seconds = static_cast<time_t>(ms / 1000 - (ms % 1000 < 0 ? 1 : 0));
  const int milli = static_cast<int>(ms - static_cast<int64_t>(seconds) * 1000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char text[64];  // (room for any int the compiler cannot rule out)
  std::snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, milli);
  return text;
}

// Built by hand rather than as a json object: the fixed fields come first, where a reader looks,
// and no lock is held while it is built.
std::string format_line(Level level, std::string_view message, const nlohmann::json& fields,
                        std::chrono::system_clock::time_point at) {
  std::string line = "{\"time\":\"" + format_time(at) + "\",\"level\":\"" + level_name(level) +
                     "\",\"logger\":\"events:live\",\"msg\":" + dump(std::string(message));
  if (fields.is_object()) {
    for (const auto& [key, value] : fields.items()) {
      if (reserved(key)) continue;
      line += ',';
      line += dump(key);
      line += ':';
      line += dump(value);
    }
  }
  line += "}\n";
  return line;
}

void write(Level level, std::string_view message, const nlohmann::json& fields) {
  if (level < min_level.load(std::memory_order_relaxed)) return;
  emit(format_line(level, message, fields, std::chrono::system_clock::now()));
}

void limited(Level level, std::string_view message, const nlohmann::json& fields) {
  if (level < min_level.load(std::memory_order_relaxed)) return;
  auto& reporter = Reporter::instance();
  switch (reporter.limiter.admit(message, level, LineLimiter::Clock::now())) {
    case LineLimiter::Verdict::write:
      return emit(format_line(level, message, fields, std::chrono::system_clock::now()));
    case LineLimiter::Verdict::counted_first:
      return reporter.wake();
    case LineLimiter::Verdict::counted:
      return;
  }
}

}  // namespace outlive::log
