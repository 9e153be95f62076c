#pragma once
// One JSON object per line on stderr, logger "events:live" (SPEC 6).
#include <nlohmann/json.hpp>
#include <string_view>

namespace outlive::log {

enum class Level { debug, info, warn, error };

// Writes {"ts","level","logger":"events:live","msg", ...fields}. Thread-safe; lines never
// interleave.
void write(Level level, std::string_view message,
           const nlohmann::json& fields = nlohmann::json::object());

inline void info(std::string_view m, const nlohmann::json& f = nlohmann::json::object()) {
  write(Level::info, m, f);
}
inline void warn(std::string_view m, const nlohmann::json& f = nlohmann::json::object()) {
  write(Level::warn, m, f);
}
inline void error(std::string_view m, const nlohmann::json& f = nlohmann::json::object()) {
  write(Level::error, m, f);
}
inline void debug(std::string_view m, const nlohmann::json& f = nlohmann::json::object()) {
  write(Level::debug, m, f);
}

// Messages below this level are dropped (OUTLIVE_LOG_LEVEL=debug|info|warn|error).
void set_min_level(Level level);

}  // namespace outlive::log
