#pragma once
// The replica's JSON configuration (SPEC 6.1), validated against schemas/config.schema.json.
#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <outlive/channel.hpp>
#include <string>
#include <vector>

#include "topic/connect_options.hpp"

namespace outlive::config {

// An SQL channel of the JSON configuration, or (`code` set) a channel declared as functions by a
// C++ embedding; the access decider dispatches on which (SPEC 5.4).
struct Channel {
  bool collection = false;
  nlohmann::json scope;  // JSON Schema of the sub's scope
  std::string keys_sql;
  std::string authorize_sql;
  std::shared_ptr<const CodeChannel> code;
  // SPEC 5.4 rev 4: keys and authorize answered by the application over HTTP. The replica turns
  // such a channel into a code channel whose functions call the hook (hooks/channel_hook.hpp).
  struct Hook {
    std::string url;
    std::chrono::milliseconds timeout{2000};
  };
  std::optional<Hook> hook;
};

struct App {
  std::vector<std::string> allowed_origins;
  std::string event_schema;  // path, relative to the config file's folder
  std::map<std::string, Channel> channels;
};

// auth.jwt (SPEC 5.1 rev 4): tokens of an identity provider, verified by the replica itself.
struct Jwt {
  std::string jwks_url;                   // http:// or https://; or the HMAC secret files below
  std::string hmac_secret_file;           // HS256: the secret is the file's bytes (trailing newlines dropped)
  std::string hmac_previous_secret_file;  // accepted too, during a rotation
  std::vector<std::string> algorithms;    // of RS256, ES256, EdDSA, HS256; never "none"
  std::string issuer;                     // checked against `iss` when not empty
  std::string audience;                   // checked against `aud` (a string or an array) when not empty
  std::string cookie;                     // a cookie that carries the token; empty: none
  std::string id_prefix = "user:";        // viewer id = id_prefix + sub (+ ":" scopes)
  std::string actor_claim;                // empty: the actor is the id without scopes
  std::string access_subject_claim;       // empty: accessSubject is the id without scopes
  std::chrono::seconds max_lifetime{3600};  // how long a token can be valid (events.disconnect)
};

// auth.hook (SPEC 5.1 rev 4): the application's own session check over HTTP. With it, every
// credential that is not a JWT of auth.jwt goes to the hook, never to SQL queries (the
// configuration then has none).
struct AuthHook {
  std::string url;
  std::chrono::milliseconds timeout{2000};
  std::vector<std::string> forward_headers = {"cookie", "authorization"};  // lowercase
};

struct Auth {
  std::optional<Jwt> jwt;
  std::optional<AuthHook> hook;  // SPEC 5.1 rev 4; nullopt: the SQL credential queries answer
  std::string session_cookie = "session";
  std::string sessions_sql;
  std::string api_keys_sql;
  std::string oauth_tokens_sql;
  std::chrono::seconds recheck = std::chrono::seconds(60);
};

struct Publisher {
  std::chrono::milliseconds lease{30000};
  std::chrono::milliseconds poll{1000};
  std::chrono::milliseconds publish_timeout{5000};
  int batches_in_flight = 4;
  std::chrono::milliseconds backoff_base{1000};
  std::chrono::milliseconds backoff_cap{300000};
  std::chrono::milliseconds waiting_threshold{60000};
  std::chrono::milliseconds waiting_log_interval{60000};
};

struct Access {
  std::chrono::milliseconds decision_lifetime{300000};
  std::chrono::milliseconds collection_refresh{60000};
  size_t max_decisions = 1000000;
};

struct Config {
  std::string replica = "r1";
  std::string listen = "127.0.0.1:8080";
  std::string database;
  std::vector<std::string> nats;
  topic::ConnectOptions nats_options;  // credentials and TLS for every NATS connection
  // Peers whose X-Forwarded-For names the client (SPEC 5.1): addresses and CIDR ranges, checked
  // to parse.
  std::vector<std::string> trusted_proxies = {"127.0.0.0/8", "::1"};
  int topic_replicas = 1;
  Auth auth;
  Publisher publisher;
  Access access;
  struct Server {
    int max_connections = 100000;
    int io_threads = 0;    // 0: the number of cores
    bool io_uring = true;  // a round's writes in one io_uring submission where the kernel has it
    std::chrono::milliseconds ping_interval{25000};
    std::chrono::milliseconds idle_timeout{60000};  // longer than ping_interval
    std::chrono::seconds sse_max_seconds{600};      // SPEC 5.9: an SSE stream then ends (1012)
    std::chrono::milliseconds sse_keep_alive{15000};  // an SSE stream's `: ping` interval
    // A socket is sent `progress` only when its cursor would otherwise be at risk: this many
    // updates behind the app's hand-off (a quarter of the 5,000-update window), or the topic moved
    // and it heard no progress for progress_quiet. 1: whenever the topic moved (at most 1/s).
    int progress_after_updates = 1250;
    std::chrono::milliseconds progress_quiet{30000};
    int db_pool_size = 8;
    int db_pool_queue = 16384;  // tasks waiting for a pool connection; beyond it a check fails
    int64_t db_backend_heap_prime = 4 << 20;  // db::PoolOptions::backend_heap_prime
    int ipv6_limit_prefix = 64;  // IPv6 clients count towards per-address limits per this prefix
    std::string admin_listen;    // empty: /metrics, /healthz, /readyz on the public listener
  } server;
  std::map<std::string, App> apps;
  // Signs every hook request (SPEC 5.1, 5.4 rev 4); required when a hook is configured.
  std::string hook_secret_file;
  struct Hooks {
    int max_in_flight = 64;  // per app
  } hooks;
  // log.level: debug, info, warn or error (the schema allows no other); OUTLIVE_LOG_LEVEL wins
  // over it (log::configured_level).
  std::string log_level = "info";

  std::vector<std::string> app_ids() const;
};

// Validates and reads a configuration; throws outlive::Error(invalid_input) naming the failing
// path ("config.json: /apps/inventory/channels/warehouse: missing property keys").
Config parse(const nlohmann::json& document, const std::string& source = "config");
// Reads the file, applies this process's OUTLIVE_ variables to it (config/environment.hpp: every
// field, and OUTLIVE_DATABASE_URL[_FILE], OUTLIVE_NATS_URL, OUTLIVE_LISTEN), parses it, and
// resolves relative paths against its folder. parse() defaults `replica` to the host name.
Config load_file(const std::string& path);

// The database URL from the environment: OUTLIVE_DATABASE_URL, else the content of the file named
// by OUTLIVE_DATABASE_URL_FILE (trailing newlines dropped), else nullopt. Throws
// Error(invalid_input) when that file cannot be read. For commands without a configuration file
// (`outlive migrate`), so the password need not be on the command line.
std::optional<std::string> database_url_from_environment();

}  // namespace outlive::config
