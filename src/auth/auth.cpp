#include "auth/auth.hpp"

#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <pqxx/pqxx>
#include <utility>

#include "common/error.hpp"
#include "db/connection.hpp"
#include "db/typed_query.hpp"
#include "outbox/pg_error.hpp"

namespace outlive::auth {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

// The value of the first cookie called `name` in a Cookie header (RFC 6265 5.4: `a=1; b=2`, the
// name compared exactly, optional whitespace, a value optionally wrapped in double quotes).
std::optional<std::string> cookie_value(std::string_view header, std::string_view name) {
  while (!header.empty()) {
    const size_t end = header.find(';');
    const std::string_view pair = trim(header.substr(0, end));
    header = end == std::string_view::npos ? std::string_view{} : header.substr(end + 1);
    const size_t eq = pair.find('=');
    if (eq == std::string_view::npos) continue;
    if (trim(pair.substr(0, eq)) != name) continue;
    std::string_view value = trim(pair.substr(eq + 1));
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
      value = value.substr(1, value.size() - 2);
    }
    return std::string(value);
  }
  return std::nullopt;
}

// The token of `Authorization: Bearer <token>` (scheme case-insensitive).
std::optional<std::string> bearer_token(std::string_view header) {
  header = trim(header);
  size_t scheme_end = 0;
  while (scheme_end < header.size() && !is_space(header[scheme_end])) ++scheme_end;
  if (!iequals(header.substr(0, scheme_end), "Bearer")) return std::nullopt;
  const std::string_view token = trim(header.substr(scheme_end));
  if (token.empty()) return std::nullopt;
  // A token68 has no inner whitespace: "Bearer a b" is not a Bearer credential.
  if (std::any_of(token.begin(), token.end(), is_space)) return std::nullopt;
  return std::string(token);
}

// A one-dimensional text[] literal as sent by Postgres ({a,"b c",NULL}); NULL elements are dropped.
std::vector<std::string> parse_text_array(const pqxx::field& field) {
  std::vector<std::string> out;
  pqxx::array_parser parser = field.as_array();
  int depth = 0;
  for (;;) {
    auto [juncture, value] = parser.get_next();
    switch (juncture) {
      case pqxx::array_parser::row_start:
        if (++depth > 1) throw Error(Errc::database, "scopes is a nested array, expected text[]");
        break;
      case pqxx::array_parser::row_end:
        --depth;
        break;
      case pqxx::array_parser::null_value:
        break;
      case pqxx::array_parser::string_value:
        out.push_back(std::move(value));
        break;
      case pqxx::array_parser::done:
        return out;
    }
  }
}

pqxx::field column(const pqxx::row& row, const char* name, const std::string& what) {
  for (pqxx::row::size_type i = 0; i < row.size(); ++i) {
    if (std::string_view(row[i].name()) == name) return row[i];
  }
  throw Error(Errc::database, what + ": the query returns no column " + name);
}

// A query's failure as the credential boundary reports it: Errc::database, whatever pqxx threw (a
// missing table included, which the outbox boundary calls not_migrated: the configured query is
// the operator's).
[[noreturn]] void rethrow_as_database_error(const std::string& what) {
  try {
    outbox::rethrow_as_error(what);
  } catch (const Error& e) {
    if (e.code() == Errc::database) throw;
    throw Error(Errc::database, e.what());
  }
}

// Credential queries are prepared once per connection, $1 the hash as text (SPEC 6.1).
const std::vector<std::string> kHashType = {"text"};

// One credential query's rows as a viewer; nullopt when it returned no row.
std::optional<Viewer> viewer_of(const pqxx::result& result, const std::string& what) {
  if (result.empty()) return std::nullopt;
  if (result.size() > 1) {
    throw Error(Errc::database,
                what + ": returned " + std::to_string(result.size()) + " rows, expected at most 1");
  }
  const pqxx::row row = result[0];
  const pqxx::field subject = column(row, "subject", what);
  const pqxx::field actor = column(row, "actor", what);
  const pqxx::field scopes = column(row, "scopes", what);
  const pqxx::field app_session = column(row, "app_session", what);
  if (subject.is_null() || subject.size() == 0)
    throw Error(Errc::database, what + ": subject is null");
  if (actor.is_null()) throw Error(Errc::database, what + ": actor is null");

  Viewer v;
  v.access_subject = subject.c_str();
  v.actor = actor.c_str();
  if (!app_session.is_null()) {
    try {
      v.app_session = app_session.as<bool>();
    } catch (const std::exception& e) {
      throw Error(Errc::database, what + ": app_session is not a boolean: " + e.what());
    }
  }
  if (!scopes.is_null()) {
    try {
      auto list = parse_text_array(scopes);
      std::sort(list.begin(), list.end());
      v.scopes = std::move(list);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(Errc::database, what + ": scopes is not a text[]: " + e.what());
    }
  }
  v.id = viewer_id(v.access_subject, v.app_session, v.scopes);
  return v;
}

}  // namespace

nlohmann::json Viewer::to_json() const {
  nlohmann::json j = {{"id", id}, {"actor", actor}, {"accessSubject", access_subject}};
  j["scopes"] = scopes ? nlohmann::json(*scopes) : nlohmann::json(nullptr);
  return j;
}

std::optional<Credential> credential_from(std::string_view cookie_header,
                                          std::string_view authorization_header,
                                          const std::string& cookie_name,
                                          const std::string& jwt_cookie) {
  if (!cookie_name.empty()) {
    if (auto token = cookie_value(cookie_header, cookie_name); token && !token->empty()) {
      return Credential{CredentialKind::session_cookie, std::move(*token)};
    }
  }
  if (!jwt_cookie.empty()) {
    if (auto token = cookie_value(cookie_header, jwt_cookie); token && !token->empty()) {
      return Credential{CredentialKind::jwt_cookie, std::move(*token)};
    }
  }
  if (auto token = bearer_token(authorization_header)) {
    return Credential{CredentialKind::bearer, std::move(*token)};
  }
  return std::nullopt;
}

std::string hook_credential(const std::vector<std::pair<std::string, std::string>>& headers,
                            const std::string& origin, const std::string& address) {
  nlohmann::json h = nlohmann::json::object();
  for (const auto& [name, value] : headers) h[name] = value;
  return nlohmann::json{{"headers", std::move(h)}, {"origin", origin}, {"address", address}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
}

bool looks_like_jwt(std::string_view token) {
  int dots = 0;
  size_t part = 0;  // characters in the current part
  for (const char c : token) {
    if (c == '.') {
      if (part == 0 || ++dots > 2) return false;
      part = 0;
    } else if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') {
      ++part;
    } else {
      return false;
    }
  }
  return dots == 2 && part > 0;
}

std::string sha256_hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(data.data(), data.size(), digest, &length, EVP_sha256(), nullptr) != 1) {
    throw Error(Errc::internal, "SHA-256 failed (OpenSSL EVP_Digest)");
  }
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(length * 2);
  for (unsigned int i = 0; i < length; ++i) {
    out += hex[digest[i] >> 4];
    out += hex[digest[i] & 0x0f];
  }
  return out;
}

std::string viewer_id(const std::string& subject, bool app_session,
                      const std::optional<std::vector<std::string>>& scopes) {
  std::string id = subject;
  if (app_session) id += ":app";
  if (scopes) {
    std::vector<std::string> sorted = *scopes;
    std::sort(sorted.begin(), sorted.end());
    id += ':';
    for (size_t i = 0; i < sorted.size(); ++i) {
      if (i > 0) id += ',';
      // Escaped so that ["a,b"] and ["a", "b"] never share an id, nor their decisions (rev 2).
      for (const char c : sorted[i]) {
        if (c == ',' || c == '\\') id += '\\';
        id += c;
      }
    }
  }
  return id;
}

Authenticator::Authenticator(config::Auth settings) : settings_(std::move(settings)) {}

std::optional<Viewer> Authenticator::resolve(db::Connection& conn,
                                             const Credential& credential) const {
  for (const Query& q : queries_for(credential)) {
    pqxx::result rows;
    try {
      rows = db::exec_typed(conn, *q.sql, kHashType, {sha256_hex(credential.token)});
    } catch (...) {
      rethrow_as_database_error(q.what);
    }
    if (auto v = viewer_of(rows, q.what)) return v;
  }
  return std::nullopt;
}

std::vector<Resolution> Authenticator::resolve_all(
    db::Connection& conn, const std::vector<Credential>& credentials) const {
  std::vector<Resolution> out(credentials.size());
  std::vector<std::string> hashes(credentials.size());
  // Each credential's queries in turn (a Bearer token: API keys, then OAuth tokens); the nth
  // round runs, for every credential not yet resolved, its nth query, one batch per statement.
  std::vector<std::vector<Query>> queries(credentials.size());
  size_t rounds = 0;
  for (size_t i = 0; i < credentials.size(); ++i) {
    queries[i] = queries_for(credentials[i]);
    if (!queries[i].empty()) hashes[i] = sha256_hex(credentials[i].token);
    rounds = std::max(rounds, queries[i].size());
  }
  for (size_t round = 0; round < rounds; ++round) {
    std::map<const std::string*, std::vector<size_t>> by_sql;  // which credentials run which query
    for (size_t i = 0; i < credentials.size(); ++i) {
      if (round < queries[i].size() && !out[i].viewer && out[i].failure.empty())
        by_sql[queries[i][round].sql].push_back(i);
    }
    for (const auto& [sql, who] : by_sql) {
      const std::string& what = queries[who.front()][round].what;
      std::vector<std::vector<std::string>> rows;
      rows.reserve(who.size());
      for (size_t i : who) rows.push_back({hashes[i]});
      std::vector<pqxx::result> results;
      try {
        results = db::exec_typed_batch(conn, *sql, kHashType, rows);
      } catch (...) {
        // Which one failed is not known: each alone, so only its own failure is reported.
        for (size_t i : who) {
          try {
            out[i].viewer = viewer_of(db::exec_typed(conn, *sql, kHashType, {hashes[i]}), what);
          } catch (const Error& e) {
            out[i].failure = e.what();
          } catch (const std::exception& e) {
            try {
              rethrow_as_database_error(what);
            } catch (const Error& wrapped) {
              out[i].failure = wrapped.what();
            }
          }
        }
        continue;
      }
      for (size_t j = 0; j < who.size(); ++j) {
        try {
          out[who[j]].viewer = viewer_of(results[j], what);
        } catch (const Error& e) {
          out[who[j]].failure = e.what();
        }
      }
    }
  }
  return out;
}

std::vector<Authenticator::Query> Authenticator::queries_for(const Credential& credential) const {
  std::vector<Query> out;
  if (credential.token.empty() || is_jwt(credential.kind) || is_hook(credential.kind) ||
      credential.kind == CredentialKind::pending) {
    return out;  // (jwt::Verifier's, the hook's, or no credential yet)
  }
  if (credential.kind == CredentialKind::session_cookie) {
    if (!settings_.sessions_sql.empty())
      out.push_back({&settings_.sessions_sql, "auth: sessions query"});
    return out;
  }
  if (!settings_.api_keys_sql.empty())
    out.push_back({&settings_.api_keys_sql, "auth: api_keys query"});
  if (!settings_.oauth_tokens_sql.empty())
    out.push_back({&settings_.oauth_tokens_sql, "auth: oauth_tokens query"});
  return out;
}

}  // namespace outlive::auth
