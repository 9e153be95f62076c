#pragma once
// Who is reading: credentials (session cookie, API key, OAuth token) resolved to a viewer by the
// configured SQL queries over SHA-256 hashes of the presented tokens (SPEC 5.1, 6.1).
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.hpp"

namespace outlive::db {
class Connection;  // db/connection.hpp
}

namespace outlive::auth {

struct Viewer {
  std::string id;  // subject [":app"] [":" sorted scopes joined by ",", each "," and "\\" escaped]
  std::string actor;
  std::string access_subject;                      // the credential's subject, e.g. "user:ada"
  std::optional<std::vector<std::string>> scopes;  // nullopt for a full session
  bool app_session = false;

  // {"id","actor","accessSubject","scopes"} as handed to keys() and authorize() queries.
  nlohmann::json to_json() const;
};

// jwt: a Bearer token in three base64url parts, or the token of the tab's auth message, when
// auth.jwt is configured; jwt_cookie: the auth.jwt.cookie (the Origin rule applies); pending: none
// arrived with the upgrade, and with auth.jwt the tab's first message may bring one (SPEC 5.1 rev
// 4). The JWT kinds are verified by jwt::Verifier, never by the SQL queries.
// hook, hook_cookie: with auth.hook, what the request presents to the application's session check
// (hooks::AuthHook), the token being hook_credential()'s JSON; hook_cookie when a Cookie
// header is among it (the Origin rule and the per-person open limit apply as to a session cookie).
enum class CredentialKind { session_cookie, bearer, jwt, jwt_cookie, pending, hook, hook_cookie };

inline bool is_jwt(CredentialKind kind) {
  return kind == CredentialKind::jwt || kind == CredentialKind::jwt_cookie;
}
inline bool is_hook(CredentialKind kind) {
  return kind == CredentialKind::hook || kind == CredentialKind::hook_cookie;
}
// Ambient credentials a page of another origin could make the browser send.
inline bool is_cookie(CredentialKind kind) {
  return kind == CredentialKind::session_cookie || kind == CredentialKind::jwt_cookie ||
         kind == CredentialKind::hook_cookie;
}

struct Credential {
  CredentialKind kind;
  std::string token;
};

// The credential a request carries: the session cookie (by name) wins over a Bearer token when both
// are present. nullopt when neither is there. An empty cookie value or Bearer token counts as
// absent.
// `jwt_cookie`: the cookie of auth.jwt, tried after the session cookie (empty: none).
std::optional<Credential> credential_from(std::string_view cookie_header,
                                          std::string_view authorization_header,
                                          const std::string& cookie_name,
                                          const std::string& jwt_cookie = {});

// Three non-empty base64url parts separated by dots: what SPEC 5.1 rev 4 verifies as a JWT when
// auth.jwt is configured (other Bearer tokens go to the API key and OAuth queries).
bool looks_like_jwt(std::string_view token);

// With auth.hook: what a request presents to the hook, the headers of auth.hook.forward_headers it
// has, its Origin and its client address, as the JSON object text its credential keeps for the
// re-checks (a value that is not UTF-8 is kept with U+FFFD in place of its bad bytes).
std::string hook_credential(const std::vector<std::pair<std::string, std::string>>& headers,
                            const std::string& origin, const std::string& address);

// Lowercase hex SHA-256.
std::string sha256_hex(std::string_view data);

// The SPEC 6.1 viewer id rule.
std::string viewer_id(const std::string& subject, bool app_session,
                      const std::optional<std::vector<std::string>>& scopes);

// One credential's answer from Authenticator::resolve_all(): its viewer (none when the credential
// is unknown, expired or revoked), or why its query failed.
struct Resolution {
  std::optional<Viewer> viewer;
  std::string failure;  // empty unless a query failed
  int64_t expires_in_s = 0;  // auth.hook's expires_in_s: > 0, check again this soon at the latest
  std::string refused;       // auth.hook's reason when it refused
};

// Resolves credentials with the configured queries. Blocking: runs on a database worker thread.
class Authenticator {
 public:
  explicit Authenticator(config::Auth settings);
  // nullopt when the credential is unknown, expired or revoked. A session cookie uses the sessions
  // query; a Bearer token tries the API key query, then the OAuth query. Throws outlive::Error
  // (database) when a query fails.
  std::optional<Viewer> resolve(db::Connection& conn, const Credential& credential) const;
  // Many credentials at once (the re-checks that fall due together): each query sent for all of
  // them in one round trip. Never throws for a query's failure: that credential's Resolution says
  // it, and the others are answered.
  std::vector<Resolution> resolve_all(db::Connection& conn,
                                      const std::vector<Credential>& credentials) const;
  // The configured queries, the cookie name and the recheck interval.
  const config::Auth& settings() const { return settings_; }

 private:
  struct Query {
    const std::string* sql;  // in settings_
    std::string what;        // for errors: "auth: sessions query"
  };
  // The queries that may resolve `credential`, in the order they are tried.
  std::vector<Query> queries_for(const Credential& credential) const;

  config::Auth settings_;
};

}  // namespace outlive::auth
