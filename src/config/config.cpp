#include "config/config.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.hpp"
#include "config/environment.hpp"
#include "schema/validator.hpp"

namespace outlive::config {
namespace embedded {
const std::vector<std::pair<std::string_view, std::string_view>>& embedded_files();
}

namespace {

const schema::Validator& config_validator() {
  static const schema::Validator validator(
      nlohmann::json::parse(embedded::embedded_files().front().second));
  return validator;
}

std::chrono::milliseconds ms(const nlohmann::json& obj, const char* name,
                             std::chrono::milliseconds fallback) {
  return obj.contains(name) ? std::chrono::milliseconds(obj[name].get<int64_t>()) : fallback;
}

// An address ("10.0.0.1", "::1") or a CIDR range ("10.0.0.0/8", "fd00::/8").
bool address_or_range(const std::string& text) {
  const auto slash = text.find('/');
  const std::string address = text.substr(0, slash);
  unsigned char buffer[sizeof(in6_addr)];
  int bits = 0;
  if (inet_pton(AF_INET, address.c_str(), buffer) == 1) {
    bits = 32;
  } else if (inet_pton(AF_INET6, address.c_str(), buffer) == 1) {
    bits = 128;
  } else {
    return false;
  }
  if (slash == std::string::npos) return true;
  const std::string prefix = text.substr(slash + 1);
  if (prefix.empty() || prefix.size() > 3 ||
      prefix.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  return std::stoi(prefix) <= bits;
}

// `replica` when the configuration has none, so one file serves every replica: the host name
// (a container's or pod's), cut to the schema's 64 characters of [A-Za-z0-9_.-].
std::string host_name() {
  char buffer[256] = {};
  if (gethostname(buffer, sizeof buffer - 1) != 0 || buffer[0] == '\0') return "r1";
  std::string name(buffer);
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '.' && ch != '-')
      ch = '-';
  }
  return name.substr(0, 64);
}

// The path a validation message starts with ("/server/idle_timeout_ms: ..."), if any.
std::string failing_pointer(const std::string& message, const std::string& source) {
  const std::string after = message.substr(std::min(message.size(), source.size() + 2));
  if (after.empty() || after[0] != '/') return {};
  return after.substr(0, after.find(':'));
}

void read_nats_options(const nlohmann::json& n, topic::ConnectOptions& o) {
  o.user = n.value("user", "");
  o.password = n.value("password", "");
  o.password_file = n.value("password_file", "");
  o.token = n.value("token", "");
  o.token_file = n.value("token_file", "");
  o.nkey = n.value("nkey", "");
  o.nkey_seed_file = n.value("nkey_seed_file", "");
  o.creds_file = n.value("creds_file", "");
  if (n.contains("tls")) {
    const auto& t = n["tls"];
    o.tls = true;
    o.tls_ca_file = t.value("ca_file", "");
    o.tls_cert_file = t.value("cert_file", "");
    o.tls_key_file = t.value("key_file", "");
  }
}

}  // namespace

std::vector<std::string> Config::app_ids() const {
  std::vector<std::string> ids;
  for (const auto& [id, _] : apps) ids.push_back(id);
  return ids;
}

Config parse(const nlohmann::json& doc, const std::string& source) {
  if (auto failure = config_validator().check(doc)) {
    throw Error(Errc::invalid_input, source + ": " + *failure);
  }
  Config c;
  c.replica = doc.contains("replica") ? doc["replica"].get<std::string>() : host_name();
  c.listen = doc.value("listen", c.listen);
  c.database = doc.at("database").get<std::string>();
  c.nats = doc.at("nats").get<std::vector<std::string>>();
  if (doc.contains("trusted_proxies")) {
    c.trusted_proxies = doc["trusted_proxies"].get<std::vector<std::string>>();
    for (size_t i = 0; i < c.trusted_proxies.size(); ++i) {
      if (!address_or_range(c.trusted_proxies[i])) {
        throw Error(Errc::invalid_input,
                    source + ": /trusted_proxies/" + std::to_string(i) +
                        ": not an address or CIDR range: " + c.trusted_proxies[i]);
      }
    }
  }
  if (doc.contains("nats_options")) read_nats_options(doc["nats_options"], c.nats_options);
  if (doc.contains("topic")) c.topic_replicas = doc["topic"].value("replicas", 1);
  if (doc.contains("auth")) {
    const auto& a = doc["auth"];
    c.auth.session_cookie = a.value("session_cookie", c.auth.session_cookie);
    c.auth.sessions_sql = a.value("sessions", "");
    c.auth.api_keys_sql = a.value("api_keys", "");
    c.auth.oauth_tokens_sql = a.value("oauth_tokens", "");
    c.auth.recheck = std::chrono::seconds(a.value("recheck_seconds", 60));
    if (a.contains("jwt")) {
      const auto& j = a["jwt"];
      config::Jwt jwt;
      jwt.jwks_url = j.value("jwks_url", "");
      jwt.hmac_secret_file = j.value("hmac_secret_file", "");
      jwt.hmac_previous_secret_file = j.value("hmac_previous_secret_file", "");
      jwt.algorithms = j.at("algorithms").get<std::vector<std::string>>();
      jwt.issuer = j.value("issuer", "");
      jwt.audience = j.value("audience", "");
      jwt.cookie = j.value("cookie", "");
      jwt.id_prefix = j.value("id_prefix", jwt.id_prefix);
      jwt.actor_claim = j.value("actor_claim", "");
      jwt.access_subject_claim = j.value("access_subject_claim", "");
      jwt.max_lifetime = std::chrono::seconds(j.value("max_lifetime_s", 3600));
      // An HMAC key set takes only HS256, a JWKS never does (its oct keys are not read): the
      // configuration that names the other would refuse every token.
      const bool hmac = !jwt.hmac_secret_file.empty();
      for (const auto& alg : jwt.algorithms) {
        if ((alg == "HS256") != hmac) {
          throw Error(Errc::invalid_input,
                      source + ": /auth/jwt/algorithms: " + alg +
                          (hmac ? " needs jwks_url; hmac_secret_file verifies HS256 only"
                                : " needs hmac_secret_file; a JWKS gives public keys only"));
        }
      }
      if (!jwt.cookie.empty() && jwt.cookie == c.auth.session_cookie) {
        throw Error(Errc::invalid_input,
                    source + ": /auth/jwt/cookie: the same name as auth.session_cookie");
      }
      c.auth.jwt = std::move(jwt);
    }
    if (a.contains("hook")) {
      const auto& h = a["hook"];
      config::AuthHook hook;
      hook.url = h.at("url").get<std::string>();
      hook.timeout = ms(h, "timeout_ms", hook.timeout);
      if (h.contains("forward_headers")) {
        hook.forward_headers = h["forward_headers"].get<std::vector<std::string>>();
        for (auto& name : hook.forward_headers) {
          std::transform(name.begin(), name.end(), name.begin(),
                         [](unsigned char ch) { return std::tolower(ch); });
        }
      }
      // One source of viewers for the credentials that are not JWTs: a query that never runs
      // would only mislead whoever reads the configuration.
      for (const char* query : {"sessions", "api_keys", "oauth_tokens"}) {
        if (a.contains(query)) {
          throw Error(Errc::invalid_input, source + ": /auth/hook: replaces auth." + query +
                                               " (the hook checks every credential that is not a JWT)");
        }
      }
      c.auth.hook = std::move(hook);
    }
  }
  if (doc.contains("publisher")) {
    const auto& p = doc["publisher"];
    auto& o = c.publisher;
    o.lease = ms(p, "lease_ms", o.lease);
    o.poll = ms(p, "poll_ms", o.poll);
    o.publish_timeout = ms(p, "publish_timeout_ms", o.publish_timeout);
    o.batches_in_flight = p.value("batches_in_flight", o.batches_in_flight);
    o.backoff_base = ms(p, "backoff_base_ms", o.backoff_base);
    o.backoff_cap = ms(p, "backoff_cap_ms", o.backoff_cap);
    o.waiting_threshold = ms(p, "waiting_threshold_ms", o.waiting_threshold);
    o.waiting_log_interval = ms(p, "waiting_log_interval_ms", o.waiting_log_interval);
    if (o.lease <= o.publish_timeout) {
      throw Error(Errc::invalid_input,
                  source + ": /publisher/lease_ms must be longer than publish_timeout_ms");
    }
  }
  if (doc.contains("access")) {
    c.access.decision_lifetime =
        ms(doc["access"], "decision_lifetime_ms", c.access.decision_lifetime);
    c.access.collection_refresh =
        ms(doc["access"], "collection_refresh_ms", c.access.collection_refresh);
    c.access.max_decisions = doc["access"].value("max_decisions", c.access.max_decisions);
  }
  if (doc.contains("log")) c.log_level = doc["log"].value("level", c.log_level);
  if (doc.contains("server")) {
    const auto& s = doc["server"];
    auto& o = c.server;
    o.max_connections = s.value("max_connections", o.max_connections);
    o.io_threads = s.value("io_threads", o.io_threads);
    o.io_uring = s.value("io_uring", o.io_uring);
    o.ping_interval = ms(s, "ping_interval_ms", o.ping_interval);
    o.idle_timeout = ms(s, "idle_timeout_ms", o.idle_timeout);
    o.sse_max_seconds = std::chrono::seconds(s.value("sse_max_seconds", o.sse_max_seconds.count()));
    o.sse_keep_alive = ms(s, "sse_keep_alive_ms", o.sse_keep_alive);
    o.progress_after_updates = s.value("progress_after_updates", o.progress_after_updates);
    o.progress_quiet = ms(s, "progress_quiet_ms", o.progress_quiet);
    o.db_pool_size = s.value("db_pool_size", o.db_pool_size);
    o.db_pool_queue = s.value("db_pool_queue", o.db_pool_queue);
    o.db_backend_heap_prime = s.value("db_backend_heap_prime_bytes", o.db_backend_heap_prime);
    o.ipv6_limit_prefix = s.value("ipv6_limit_prefix", o.ipv6_limit_prefix);
    o.admin_listen = s.value("admin_listen", o.admin_listen);
    // A quiet tab shows it is alive only by answering pings: an idle timeout no longer than the
    // ping interval would drop healthy tabs.
    if (o.idle_timeout <= o.ping_interval) {
      throw Error(Errc::invalid_input,
                  source + ": /server/idle_timeout_ms must be longer than ping_interval_ms");
    }
  }
  for (const auto& [id, a] : doc.at("apps").items()) {
    App app;
    app.allowed_origins = a.value("allowed_origins", std::vector<std::string>{});
    app.event_schema = a.value("event_schema", "");
    if (a.contains("channels")) {
      for (const auto& [name, ch] : a["channels"].items()) {
        Channel channel;
        channel.collection = ch.value("collection", false);
        channel.scope = ch.at("scope");
        try {
          schema::Validator check_scope(channel.scope);
        } catch (const Error& e) {
          throw Error(Errc::invalid_input,
                      source + ": /apps/" + id + "/channels/" + name + "/scope: " + e.what());
        }
        // SPEC 5.4 rev 4: a channel answered by the application over HTTP (the schema allows
        // either a hook or keys and authorize).
        if (ch.contains("hook")) {
          config::Channel::Hook hook;
          hook.url = ch["hook"].at("url").get<std::string>();
          hook.timeout = ms(ch["hook"], "timeout_ms", hook.timeout);
          channel.hook = std::move(hook);
        } else {
          channel.keys_sql = ch.at("keys").get<std::string>();
          channel.authorize_sql = ch.at("authorize").get<std::string>();
        }
        app.channels.emplace(name, std::move(channel));
      }
    }
    c.apps.emplace(id, std::move(app));
  }
  c.hook_secret_file = doc.value("hook_secret_file", "");
  if (doc.contains("hooks")) c.hooks.max_in_flight = doc["hooks"].value("max_in_flight", 64);
  if (c.auth.hook && c.hook_secret_file.empty()) {
    throw Error(Errc::invalid_input,
                source + ": /auth/hook: needs hook_secret_file (it signs every hook request)");
  }
  for (const auto& [id, app] : c.apps) {
    for (const auto& [name, channel] : app.channels) {
      if (channel.hook && c.hook_secret_file.empty()) {
        throw Error(Errc::invalid_input, source + ": /apps/" + id + "/channels/" + name +
                                             "/hook: needs hook_secret_file (it signs every hook request)");
      }
    }
  }
  return c;
}

Config load_file(const std::string& path) { return load_file(path, process_environment()); }

Config load_file(const std::string& path, const Environment& env) {
  std::ifstream in(path);
  if (!in) throw Error(Errc::invalid_input, path + ": cannot read the file");
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(Errc::invalid_input, path + ": not JSON: " + e.what());
  }
  const auto overrides = apply_environment(doc, env);
  Config c;
  try {
    c = parse(doc, path);
  } catch (const Error& e) {
    // A value that came from the environment is fixed there, not in the file: say so.
    const std::string failing = failing_pointer(e.what(), path);
    std::string from;
    for (const auto& o : overrides) {
      bool related = !failing.empty() &&
                     (o.pointer.rfind(failing, 0) == 0 || failing.rfind(o.pointer, 0) == 0);
      // Every path is under "/": there only the variable that added the named property counts.
      if (failing == "/") {
        related = std::string(e.what()).find("'" + o.pointer.substr(1, o.pointer.find('/', 1) - 1) +
                                             "'") != std::string::npos;
      }
      if (related) from += (from.empty() ? " (set by " : ", ") + o.variable;
    }
    if (from.empty()) throw;
    throw Error(e.code(), std::string(e.what()) + from + ")");
  }
  const auto folder = std::filesystem::absolute(path).parent_path();
  for (auto& [id, app] : c.apps) {
    if (!app.event_schema.empty() && std::filesystem::path(app.event_schema).is_relative()) {
      app.event_schema = (folder / app.event_schema).lexically_normal().string();
    }
  }
  for (std::string* file :
       {&c.nats_options.password_file, &c.nats_options.token_file, &c.nats_options.nkey_seed_file,
        &c.nats_options.creds_file, &c.nats_options.tls_ca_file, &c.nats_options.tls_cert_file,
        &c.nats_options.tls_key_file}) {
    if (!file->empty() && std::filesystem::path(*file).is_relative()) {
      *file = (folder / *file).lexically_normal().string();
    }
  }
  if (!c.hook_secret_file.empty() && std::filesystem::path(c.hook_secret_file).is_relative()) {
    c.hook_secret_file = (folder / c.hook_secret_file).lexically_normal().string();
  }
  if (c.auth.jwt) {
    for (std::string* file : {&c.auth.jwt->hmac_secret_file, &c.auth.jwt->hmac_previous_secret_file}) {
      if (!file->empty() && std::filesystem::path(*file).is_relative()) {
        *file = (folder / *file).lexically_normal().string();
      }
    }
  }
  return c;
}

std::optional<std::string> database_url_from_environment() {
  return database_url_from_environment(process_environment());
}

}  // namespace outlive::config
