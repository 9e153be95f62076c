#include "config/environment.hpp"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#include "common/error.hpp"

extern char** environ;

namespace outlive::config {
namespace embedded {
const std::vector<std::pair<std::string_view, std::string_view>>& embedded_files();
}

namespace {

constexpr std::string_view kPrefix = "OUTLIVE_";

const nlohmann::json& schema() {
  static const nlohmann::json s = nlohmann::json::parse(embedded::embedded_files().front().second);
  return s;
}

// The schema of `key` under the object schema `node`; null when the schema does not say.
const nlohmann::json* child_schema(const nlohmann::json* node, const std::string& key) {
  if (node == nullptr || !node->is_object()) return nullptr;
  if (auto p = node->find("properties"); p != node->end() && p->contains(key)) return &(*p)[key];
  if (auto a = node->find("additionalProperties"); a != node->end() && a->is_object()) return &*a;
  return nullptr;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::vector<std::string> split_path(const std::string& rest) {
  std::vector<std::string> out;
  size_t from = 0;
  for (;;) {
    const size_t at = rest.find("__", from);
    out.push_back(rest.substr(from, at == std::string::npos ? std::string::npos : at - from));
    if (at == std::string::npos) return out;
    from = at + 2;
  }
}

[[noreturn]] void fail(const std::string& variable, const std::string& why) {
  throw Error(Errc::invalid_input, "environment: " + variable + ": " + why);
}

// The key of `object` that `segment` names: the one spelled alike in any case, else `segment` in
// lower case (a new key).
std::string key_for(const nlohmann::json& object, const std::string& segment,
                    const std::string& variable) {
  const std::string wanted = lower(segment);
  std::string found;
  for (const auto& [key, _] : object.items()) {
    if (lower(key) != wanted) continue;
    if (!found.empty()) fail(variable, "matches both \"" + found + "\" and \"" + key + "\"");
    found = key;
  }
  return found.empty() ? wanted : found;
}

nlohmann::json value_of(const std::string& text, const nlohmann::json* field_schema) {
  const bool is_string = field_schema != nullptr && field_schema->is_object() &&
                         field_schema->value("type", "") == "string";
  auto parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return text;
  if (is_string && !parsed.is_string()) return text;
  return parsed;
}

void set_path(nlohmann::json& document, const std::string& variable, const std::string& value,
              std::vector<Override>& applied) {
  const auto segments = split_path(variable.substr(kPrefix.size()));
  for (const auto& s : segments) {
    if (s.empty()) fail(variable, "an empty path segment (three or more underscores in a row?)");
  }
  if (segments.size() == 1) {
    const auto& top = schema()["properties"];
    if (!top.contains(lower(segments[0]))) return;  // OUTLIVE_LOG_LEVEL and such: not configuration
  }
  nlohmann::json* node = &document;
  const nlohmann::json* node_schema = &schema();
  std::string pointer;
  for (size_t i = 0; i < segments.size(); ++i) {
    if (!node->is_object()) fail(variable, (pointer.empty() ? "/" : pointer) + " is not an object");
    const std::string key = key_for(*node, segments[i], variable);
    pointer += "/" + key;
    node_schema = child_schema(node_schema, key);
    if (i + 1 < segments.size() && !node->contains(key)) (*node)[key] = nlohmann::json::object();
    node = &(*node)[key];
  }
  *node = value_of(value, node_schema);
  applied.push_back({variable, pointer});
}

std::string read_secret(const std::string& variable, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(variable, "cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  // Files written by editors and `echo` end with a newline that is not part of the secret.
  if (!s.empty() && s.back() == '\n') s.pop_back();
  if (!s.empty() && s.back() == '\r') s.pop_back();
  if (s.empty()) fail(variable, path + " is empty");
  return s;
}

const std::string* lookup(const Environment& env, std::string_view name) {
  for (const auto& [k, v] : env) {
    if (k == name && !v.empty()) return &v;
  }
  return nullptr;
}

}  // namespace

Environment process_environment() {
  Environment env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    if (entry.rfind(kPrefix, 0) != 0) continue;
    const auto eq = entry.find('=');
    if (eq == std::string::npos) continue;
    env.emplace_back(entry.substr(0, eq), entry.substr(eq + 1));
  }
  std::sort(env.begin(), env.end());
  return env;
}

std::optional<std::string> database_url_from_environment(const Environment& env) {
  const auto* url = lookup(env, "OUTLIVE_DATABASE_URL");
  const auto* file = lookup(env, "OUTLIVE_DATABASE_URL_FILE");
  if (url && file) {
    fail("OUTLIVE_DATABASE_URL_FILE", "OUTLIVE_DATABASE_URL is set too; set one of them");
  }
  if (url) return *url;
  if (file) return read_secret("OUTLIVE_DATABASE_URL_FILE", *file);
  return std::nullopt;
}

std::vector<Override> apply_environment(nlohmann::json& document, const Environment& env) {
  static const std::vector<std::string_view> kOwnMeaning = {
      "OUTLIVE_DATABASE_URL", "OUTLIVE_DATABASE_URL_FILE", "OUTLIVE_NATS_URL", "OUTLIVE_LISTEN"};
  std::vector<Override> applied;
  if (!document.is_object()) return applied;
  for (const auto& [name, value] : env) {
    if (name.rfind(kPrefix, 0) != 0 || name.size() == kPrefix.size() || value.empty()) continue;
    if (std::find(kOwnMeaning.begin(), kOwnMeaning.end(), name) != kOwnMeaning.end()) continue;
    set_path(document, name, value, applied);
  }
  if (auto url = database_url_from_environment(env)) {
    document["database"] = *url;
    applied.push_back(
        {lookup(env, "OUTLIVE_DATABASE_URL") ? "OUTLIVE_DATABASE_URL" : "OUTLIVE_DATABASE_URL_FILE",
         "/database"});
  }
  if (const auto* nats = lookup(env, "OUTLIVE_NATS_URL")) {
    auto urls = nlohmann::json::array();
    std::stringstream list(*nats);
    std::string item;
    while (std::getline(list, item, ',')) {
      if (!item.empty()) urls.push_back(item);
    }
    document["nats"] = urls;
    applied.push_back({"OUTLIVE_NATS_URL", "/nats"});
  }
  if (const auto* listen = lookup(env, "OUTLIVE_LISTEN")) {
    document["listen"] = *listen;
    applied.push_back({"OUTLIVE_LISTEN", "/listen"});
  }
  return applied;
}

}  // namespace outlive::config
