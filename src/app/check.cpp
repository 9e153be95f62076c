#include "app/check.hpp"

#include "jwt/verifier.hpp"

#include <libpq-fe.h>

#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "hooks/auth_hook.hpp"
#include "hooks/channel_hook.hpp"
#include "hooks/client.hpp"
#include "hooks/signature.hpp"
#include "http_client/url.hpp"
#include "outbox/migrate.hpp"
#include "topic/client.hpp"

namespace outlive::app {
namespace {

// Built-in type OIDs (pg_type.dat), fixed across Postgres versions: the parameter types the
// replica writes in its PREPAREs (db::exec_typed).
constexpr Oid kText = 25;
constexpr Oid kJsonb = 3802;

struct ConnDeleter {
  void operator()(PGconn* c) const { PQfinish(c); }
};
struct ResultDeleter {
  void operator()(PGresult* r) const { PQclear(r); }
};
using Conn = std::unique_ptr<PGconn, ConnDeleter>;
using Result = std::unique_ptr<PGresult, ResultDeleter>;

// Postgres' primary message ("column \"x\" does not exist"), without the LINE and caret lines.
std::string message_of(const PGresult* r, PGconn* conn) {
  if (r != nullptr) {
    if (const char* primary = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY)) return primary;
  }
  std::string text = PQerrorMessage(conn);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

std::string one_line(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  for (char& c : text) {
    if (c == '\n') c = ' ';
  }
  return text;
}

struct Statement {
  std::string path;
  std::string sql;
  std::vector<Oid> types;
  std::vector<std::string> required_columns;  // empty: any, but at least one
};

std::vector<Statement> statements_of(const config::Config& c) {
  std::vector<Statement> out;
  const std::vector<std::string> credential_columns = {"subject", "actor", "scopes", "app_session"};
  const std::pair<const char*, const std::string*> credentials[] = {
      {"sessions", &c.auth.sessions_sql},
      {"api_keys", &c.auth.api_keys_sql},
      {"oauth_tokens", &c.auth.oauth_tokens_sql}};
  for (const auto& [name, sql] : credentials) {
    if (!sql->empty()) {
      out.push_back({std::string("/auth/") + name, *sql, {kText}, credential_columns});
    }
  }
  for (const auto& [id, app] : c.apps) {
    for (const auto& [name, channel] : app.channels) {
      // Declared in C++ by an embedding, or answered over HTTP (check_hooks): no SQL.
      if (channel.code || channel.hook) continue;
      const std::string base = "/apps/" + id + "/channels/" + name;
      out.push_back({base + "/keys", channel.keys_sql, {kJsonb, kJsonb}, {}});
      out.push_back({base + "/authorize", channel.authorize_sql, {kText, kJsonb}, {}});
    }
  }
  return out;
}

// Prepares `s` as the unnamed statement (each replaces the last, so nothing is left behind) and
// describes its result.
std::optional<std::string> prepare(PGconn* conn, const Statement& s) {
  Result prepared(
      PQprepare(conn, "", s.sql.c_str(), static_cast<int>(s.types.size()), s.types.data()));
  if (PQresultStatus(prepared.get()) != PGRES_COMMAND_OK) return message_of(prepared.get(), conn);
  Result described(PQdescribePrepared(conn, ""));
  if (PQresultStatus(described.get()) != PGRES_COMMAND_OK) {
    return message_of(described.get(), conn);
  }
  const int fields = PQnfields(described.get());
  if (fields == 0) return std::string("returns no column (it must return rows)");
  std::set<std::string> columns;
  for (int i = 0; i < fields; ++i) columns.insert(PQfname(described.get(), i));
  std::string missing;
  for (const auto& want : s.required_columns) {
    if (!columns.count(want)) missing += (missing.empty() ? "" : ", ") + want;
  }
  if (!missing.empty()) {
    return "does not return the column(s) " + missing +
           " (a credential query returns subject, actor, scopes, app_session)";
  }
  return std::nullopt;
}

}  // namespace

size_t statement_count(const config::Config& config) { return statements_of(config).size(); }

std::vector<Problem> check_database(const config::Config& config) {
  std::vector<Problem> problems;
  Conn conn(PQconnectdb(config.database.c_str()));
  if (PQstatus(conn.get()) != CONNECTION_OK) {
    problems.push_back({"/database", "cannot connect: " + message_of(nullptr, conn.get())});
    return problems;
  }
  // The replica's own start-up check, so both say the same thing (and name the app).
  try {
    outbox::require_outboxes(config.database, config.app_ids(),
                             [&](const std::string& id, const std::exception& e) {
                               problems.push_back({"/apps/" + id, one_line(e.what())});
                             });
  } catch (const std::exception& e) {
    problems.push_back({"/database", one_line(e.what())});
  }
  for (const auto& s : statements_of(config)) {
    if (auto failure = prepare(conn.get(), s)) problems.push_back({s.path, *failure});
  }
  return problems;
}

std::vector<Problem> check_nats(const config::Config& config, std::chrono::milliseconds timeout) {
  try {
    topic::Client client(config.nats, "outlive-check", config.nats_options, timeout);
  } catch (const std::exception& e) {
    return {{"/nats", e.what()}};
  }
  return {};
}

std::vector<Problem> check_jwt(const config::Config& config) {
  if (!config.auth.jwt) return {};
  try {
    jwt::Verifier verifier(*config.auth.jwt, nullptr);
    verifier.start();
  } catch (const std::exception& e) {
    return {{config.auth.jwt->jwks_url.empty() ? "/auth/jwt/hmac_secret_file" : "/auth/jwt/jwks_url",
             e.what()}};
  }
  return {};
}

std::vector<Problem> check_hooks(const config::Config& config) {
  std::vector<Problem> problems;
  std::unique_ptr<hooks::Client> client;
  for (const auto& [id, app] : config.apps) {
    for (const auto& [name, channel] : app.channels) {
      if (!channel.hook) continue;
      const std::string path = "/apps/" + id + "/channels/" + name + "/hook";
      try {
        if (!client) {
          client = std::make_unique<hooks::Client>(id, hooks::read_secret(config.hook_secret_file), 1);
        }
        // An authorize of no viewers: the hook must answer it as any other, so it shows the URL
        // answers, the secret matches (else 401), and the hook knows the app and channel.
        hooks::Call call{http_client::parse_url(channel.hook->url, path + "/url"), channel.hook->url,
                         nlohmann::json{{"op", "authorize"},
                                        {"app", id},
                                        {"channel", name},
                                        {"key", "outlive:check"},
                                        {"viewers", nlohmann::json::array()}}
                             .dump(),
                         std::chrono::steady_clock::now() + channel.hook->timeout,
                         {}};
        std::promise<hooks::Answer> answered;
        client->post(std::move(call), [&](hooks::Answer a) { answered.set_value(std::move(a)); });
        const auto a = answered.get_future().get();
        if (!a.failure.empty()) {
          problems.push_back({path, a.failure});
        } else {
          hooks::parse_authorize_answer(a.body);
        }
      } catch (const std::exception& e) {
        problems.push_back({path, e.what()});
      }
    }
  }
  if (config.auth.hook) {
    // The session check asked about no credentials, per app: the URL answers, the secret matches,
    // and the body is the shape the replica reads.
    for (const auto& [id, app] : config.apps) {
      const std::string path = "/auth/hook";
      try {
        hooks::Client app_client(id, hooks::read_secret(config.hook_secret_file), 1);
        hooks::Call call{http_client::parse_url(config.auth.hook->url, path + "/url"),
                         config.auth.hook->url,
                         nlohmann::json{{"app", id}, {"credentials", nlohmann::json::array()}}.dump(),
                         std::chrono::steady_clock::now() + config.auth.hook->timeout,
                         {}};
        std::promise<hooks::Answer> answered;
        app_client.post(std::move(call), [&](hooks::Answer a) { answered.set_value(std::move(a)); });
        const auto a = answered.get_future().get();
        if (!a.failure.empty()) {
          problems.push_back({path, "app " + id + ": " + a.failure});
        } else {
          hooks::parse_credentials_answer(a.body, 0);
        }
      } catch (const std::exception& e) {
        problems.push_back({path, "app " + id + ": " + e.what()});
      }
    }
  }
  return problems;
}

}  // namespace outlive::app
