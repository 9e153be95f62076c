#include "auth/auth.hpp"

#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <utility>

#include "common/error.hpp"
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

// Runs one credential query; nullopt when it returns no row.
std::optional<Viewer> run_query(pqxx::transaction_base& tx, const std::string& sql,
                                const std::string& hash, const std::string& what) {
  pqxx::result result;
  try {
    result = tx.exec_params(sql, hash);
  } catch (...) {
    try {
      outbox::rethrow_as_error(what);
    } catch (const Error& e) {
      // The configured query is the operator's: whatever failed (a missing table included, which
      // the outbox boundary calls not_migrated), it is a database failure here.
      if (e.code() == Errc::database) throw;
      throw Error(Errc::database, e.what());
    }
  }
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
                                          const std::string& cookie_name) {
  if (!cookie_name.empty()) {
    if (auto token = cookie_value(cookie_header, cookie_name); token && !token->empty()) {
      return Credential{CredentialKind::session_cookie, std::move(*token)};
    }
  }
  if (auto token = bearer_token(authorization_header)) {
    return Credential{CredentialKind::bearer, std::move(*token)};
  }
  return std::nullopt;
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

std::optional<Viewer> Authenticator::resolve(pqxx::connection_base& conn,
                                             const Credential& credential) const {
  if (credential.token.empty()) return std::nullopt;
  const bool session = credential.kind == CredentialKind::session_cookie;
  if (session && settings_.sessions_sql.empty()) return std::nullopt;
  if (!session && settings_.api_keys_sql.empty() && settings_.oauth_tokens_sql.empty()) {
    return std::nullopt;
  }
  const std::string hash = sha256_hex(credential.token);
  std::optional<pqxx::nontransaction> tx;
  try {
    tx.emplace(conn, "outlive-auth");
  } catch (...) {
    try {
      outbox::rethrow_as_error("auth: opening a transaction");
    } catch (const Error& e) {
      if (e.code() == Errc::database) throw;
      throw Error(Errc::database, e.what());
    }
  }
  if (session) return run_query(*tx, settings_.sessions_sql, hash, "auth: sessions query");
  if (!settings_.api_keys_sql.empty()) {
    if (auto v = run_query(*tx, settings_.api_keys_sql, hash, "auth: api_keys query")) return v;
  }
  if (!settings_.oauth_tokens_sql.empty()) {
    return run_query(*tx, settings_.oauth_tokens_sql, hash, "auth: oauth_tokens query");
  }
  return std::nullopt;
}

}  // namespace outlive::auth
