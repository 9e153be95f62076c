#pragma once
// Configuration from the environment (SPEC 6 rev 3): every field as OUTLIVE_ + its path in upper
// case joined by `__`, applied to the file's JSON before it is validated, so a wrong value fails
// with the same path a wrong file would.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config/config.hpp"

namespace outlive::config {

// Variables as name, value; only the OUTLIVE_ ones matter.
using Environment = std::vector<std::pair<std::string, std::string>>;

// The OUTLIVE_ variables of this process, sorted by name (so a parent such as OUTLIVE_SERVER is
// applied before OUTLIVE_SERVER__PING_INTERVAL_MS refines it).
Environment process_environment();

struct Override {
  std::string variable;  // OUTLIVE_SERVER__PING_INTERVAL_MS
  std::string pointer;   // /server/ping_interval_ms
};

// Sets the fields `env` names in `document`, in order, and returns what it set.
//  - OUTLIVE_A__B__C sets /a/b/c. A segment matches an existing key of the document regardless of
//    case (app ids and channel names keep the file's spelling); a key the document does not have
//    is created in lower case. Two keys that differ only in case make the variable an error.
//  - A name without `__` is configuration only when it names a top-level field (OUTLIVE_REPLICA);
//    others (OUTLIVE_LOG_LEVEL) are left alone. A name with `__` always is, so a misspelled one
//    fails validation instead of being ignored.
//  - The value is JSON when it parses as JSON, else the plain string; a field the schema types as
//    a string always takes the plain string (unless the value is a JSON string literal).
//  - Empty values are ignored, as if unset.
//  - OUTLIVE_DATABASE_URL sets /database, OUTLIVE_DATABASE_URL_FILE reads it from a file (one
//    trailing newline trimmed; setting both is an error), OUTLIVE_NATS_URL sets /nats from a
//    comma-separated list, OUTLIVE_LISTEN sets /listen. They are applied last.
// Throws Error(invalid_input) naming the variable when it cannot be applied.
std::vector<Override> apply_environment(nlohmann::json& document, const Environment& env);

// OUTLIVE_DATABASE_URL, else the content of the file OUTLIVE_DATABASE_URL_FILE names.
std::optional<std::string> database_url_from_environment(const Environment& env);

// load_file(path) with `env` instead of this process's environment: reads the file, applies `env`
// to it, parses it (a validation error caused by a variable names it), resolves relative paths.
Config load_file(const std::string& path, const Environment& env);

}  // namespace outlive::config
