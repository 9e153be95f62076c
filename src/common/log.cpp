#include "common/log.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace outlive::log {
namespace {

Level level_from_env() {
  const char* env = std::getenv("OUTLIVE_LOG_LEVEL");
  if (env == nullptr) return Level::info;
  if (std::strcmp(env, "debug") == 0) return Level::debug;
  if (std::strcmp(env, "warn") == 0) return Level::warn;
  if (std::strcmp(env, "error") == 0) return Level::error;
  return Level::info;
}

std::atomic<Level> min_level{level_from_env()};
std::mutex write_mutex;

const char* name(Level level) {
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

}  // namespace

void set_min_level(Level level) { min_level = level; }

void write(Level level, std::string_view message, const nlohmann::json& fields) {
  if (level < min_level.load()) return;
  nlohmann::json line = {
      {"ts", std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::system_clock::now().time_since_epoch())
                 .count()},
      {"level", name(level)},
      {"logger", "events:live"},
      {"msg", message},
  };
  if (fields.is_object()) line.update(fields);
  const std::string text =
      line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::lock_guard lock(write_mutex);
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

}  // namespace outlive::log
