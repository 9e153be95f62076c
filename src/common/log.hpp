#pragma once
// One JSON object per line on stderr, logger "events:live" (SPEC 6); docs/OPERATING.md section 7.
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace outlive::log {

enum class Level { debug, info, warn, error };

// Writes {"time","level","logger":"events:live","msg", ...fields} as one line. Thread-safe; lines
// never interleave. Fields named like the first four are left out (the line stays valid JSON).
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

// For what one socket (or one check) says, which a network blip or a database outage makes
// thousands of sockets say at once: per message, at most kLimitedBurst lines in a row and then
// kLimitedPerSecond a second are written; the rest are counted and reported a second after the
// first of them as one line, "<message> (suppressed)" with "suppressed": N. `message` must be a
// fixed text (the details go in `fields`): it is what the lines are counted by.
void limited(Level level, std::string_view message,
             const nlohmann::json& fields = nlohmann::json::object());
constexpr double kLimitedPerSecond = 10;
constexpr double kLimitedBurst = 10;

// Messages below this level are dropped.
void set_min_level(Level level);

// "debug", "info", "warn" or "error", exactly: the same spelling as every other value of the
// configuration, so a level that is accepted here is never a surprise elsewhere.
std::optional<Level> parse_level(std::string_view text);
const char* level_name(Level level);

// The level OUTLIVE_LOG_LEVEL asks for (`value`, or this process's environment): info when unset
// or empty. Throws Error(invalid_input) naming the variable and its value for anything else: a
// mistyped level would otherwise hide the warnings it was set to show.
Level level_from_environment(const char* value);
Level level_from_environment();
// The level once the configuration is read: OUTLIVE_LOG_LEVEL's (`environment`) when it is set,
// as the environment wins over the file for every field, else the configuration's log.level
// (`configured`, checked by the schema; info if it is not a level).
Level configured_level(const char* environment, std::string_view configured);

// RFC 3339 in UTC with milliseconds: 2026-12-04T11:25:03.123Z.
std::string format_time(std::chrono::system_clock::time_point at);
// The line write() writes (with its newline).
std::string format_line(Level level, std::string_view message, const nlohmann::json& fields,
                        std::chrono::system_clock::time_point at);

}  // namespace outlive::log
