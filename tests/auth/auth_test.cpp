// SPEC 5.1 / 6.1: credentials from request headers, the viewer id rule, and the configured
// credential queries over SHA-256 hashes against a real PostgreSQL.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <optional>
#include <pqxx/pqxx>
#include <string>
#include <vector>

#include "auth/auth.hpp"
#include "common/error.hpp"
#include "db/connection.hpp"
#include "support/services.hpp"

namespace {

using nlohmann::json;
using outlive::Errc;
using outlive::auth::Authenticator;
using outlive::auth::Credential;
using outlive::auth::credential_from;
using outlive::auth::CredentialKind;
using outlive::auth::sha256_hex;
using outlive::auth::Viewer;
using outlive::auth::viewer_id;
using outlive::testing::fresh_database;
using Scopes = std::optional<std::vector<std::string>>;

// The three queries of the SPEC 6.1 example configuration, verbatim.
const char* const kSessionsSql =
    "SELECT subject, actor, NULL::text[] AS scopes, app_session FROM auth.sessions WHERE "
    "token_sha256 = $1 AND expires_at > now()";
const char* const kApiKeysSql =
    "SELECT subject, actor, scopes, false AS app_session FROM auth.api_keys WHERE key_sha256 = $1 "
    "AND revoked_at IS NULL";
const char* const kOauthSql =
    "SELECT subject, actor, scopes, false AS app_session FROM auth.oauth_tokens WHERE "
    "token_sha256 = $1 AND expires_at > now()";

outlive::config::Auth example_settings() {
  outlive::config::Auth a;
  a.sessions_sql = kSessionsSql;
  a.api_keys_sql = kApiKeysSql;
  a.oauth_tokens_sql = kOauthSql;
  return a;
}

Credential cookie(std::string token) {
  return Credential{CredentialKind::session_cookie, std::move(token)};
}
Credential bearer(std::string token) {
  return Credential{CredentialKind::bearer, std::move(token)};
}

// A fresh migrated database with the example auth schema and a few credentials, hashed in SQL.
std::string auth_database() {
  const std::string url = fresh_database();
  pqxx::connection c(url);
  pqxx::work tx(c);
  tx.exec(R"sql(
    CREATE SCHEMA auth;
    CREATE TABLE auth.sessions (token_sha256 text PRIMARY KEY, subject text NOT NULL,
      actor text NOT NULL, app_session boolean NOT NULL DEFAULT false, expires_at timestamptz NOT NULL);
    CREATE TABLE auth.api_keys (key_sha256 text PRIMARY KEY, subject text NOT NULL,
      actor text NOT NULL, scopes text[], revoked_at timestamptz);
    CREATE TABLE auth.oauth_tokens (token_sha256 text PRIMARY KEY, subject text NOT NULL,
      actor text NOT NULL, scopes text[], expires_at timestamptz NOT NULL);

    INSERT INTO auth.sessions VALUES
      (encode(sha256('sess-ada'::bytea), 'hex'), 'user:ada', 'ada', false, now() + interval '1 hour'),
      (encode(sha256('sess-ada-phone'::bytea), 'hex'), 'user:ada', 'ada', true, now() + interval '1 hour'),
      (encode(sha256('sess-old'::bytea), 'hex'), 'user:bob', 'bob', false, now() - interval '1 second');
    INSERT INTO auth.api_keys VALUES
      (encode(sha256('key-ada'::bytea), 'hex'), 'user:ada', 'ada', ARRAY['write', 'read'], NULL),
      (encode(sha256('key-ci'::bytea), 'hex'), 'service_account:ci', 'ci', ARRAY['deploy'], NULL),
      (encode(sha256('key-none'::bytea), 'hex'), 'user:ada', 'ada', ARRAY[]::text[], NULL),
      (encode(sha256('key-odd'::bytea), 'hex'), 'user:ada', 'ada',
         ARRAY['b "quoted"', 'a,comma', 'c\slash', NULL, 'NULL'], NULL),
      (encode(sha256('key-revoked'::bytea), 'hex'), 'user:ada', 'ada', ARRAY['read'], now());
    INSERT INTO auth.oauth_tokens VALUES
      (encode(sha256('oauth-ada'::bytea), 'hex'), 'user:ada', 'ada', ARRAY['read'], now() + interval '1 hour'),
      (encode(sha256('oauth-old'::bytea), 'hex'), 'user:ada', 'ada', ARRAY['read'], now() - interval '1 second');
  )sql");
  tx.commit();
  return url;
}

}  // namespace

TEST_CASE("sha256_hex matches the FIPS 180-2 vectors") {
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex(std::string("a\0b", 3)) != sha256_hex("a"));
}

TEST_CASE("credential_from reads the session cookie among others") {
  auto c = credential_from("a=1; session=tok; b=2", "", "session");
  REQUIRE(c);
  CHECK(c->kind == CredentialKind::session_cookie);
  CHECK(c->token == "tok");

  c = credential_from("session=only", "", "session");
  REQUIRE(c);
  CHECK(c->token == "only");

  c = credential_from("  a=1 ;\tsession = spaced ;b=2", "", "session");
  REQUIRE(c);
  CHECK(c->token == "spaced");

  c = credential_from("a=1; session=\"quoted\"", "", "session");
  REQUIRE(c);
  CHECK(c->token == "quoted");

  // Values may contain '=' (base64 padding); the first cookie of that name wins.
  c = credential_from("session=abc==; session=second", "", "session");
  REQUIRE(c);
  CHECK(c->token == "abc==");

  // A name that merely ends or starts with the cookie name is another cookie.
  CHECK_FALSE(credential_from("my_session=x; sessionid=y; flag", "", "session"));
}

TEST_CASE("credential_from without a credential") {
  CHECK_FALSE(credential_from("", "", "session"));
  CHECK_FALSE(credential_from("a=1; b=2", "", "session"));
  CHECK_FALSE(credential_from("session=", "", "session"));
  CHECK_FALSE(credential_from("", "Basic dXNlcjpwYXNz", "session"));
  CHECK_FALSE(credential_from("", "Bearer", "session"));
  CHECK_FALSE(credential_from("", "Bearer   ", "session"));
  CHECK_FALSE(credential_from("", "Bearertok", "session"));
}

TEST_CASE("credential_from uses the configured cookie name") {
  auto c = credential_from("session=default; sid=custom", "", "sid");
  REQUIRE(c);
  CHECK(c->kind == CredentialKind::session_cookie);
  CHECK(c->token == "custom");
  CHECK_FALSE(credential_from("session=default", "", "sid"));
  CHECK_FALSE(credential_from("Session=x", "", "session"));  // cookie names are case-sensitive
}

TEST_CASE("credential_from reads a Bearer token with any case of the scheme") {
  for (const char* header : {"Bearer tok", "bearer tok", "BEARER tok", "bEaReR   tok  "}) {
    INFO(header);
    auto c = credential_from("", header, "session");
    REQUIRE(c);
    CHECK(c->kind == CredentialKind::bearer);
    CHECK(c->token == "tok");
  }
}

TEST_CASE("credential_from prefers the cookie when both are present") {
  auto c = credential_from("session=cookie-tok", "Bearer bearer-tok", "session");
  REQUIRE(c);
  CHECK(c->kind == CredentialKind::session_cookie);
  CHECK(c->token == "cookie-tok");

  // Another cookie does not hide the Bearer token.
  c = credential_from("theme=dark", "Bearer bearer-tok", "session");
  REQUIRE(c);
  CHECK(c->kind == CredentialKind::bearer);
  CHECK(c->token == "bearer-tok");
}

TEST_CASE("viewer_id follows SPEC 6.1") {
  CHECK(viewer_id("user:ada", false, std::nullopt) == "user:ada");
  CHECK(viewer_id("user:ada", true, std::nullopt) == "user:ada:app");
  CHECK(viewer_id("user:ada", false, Scopes{{"write", "read"}}) == "user:ada:read,write");
  CHECK(viewer_id("service_account:ci", false, Scopes{{"deploy"}}) == "service_account:ci:deploy");
  CHECK(viewer_id("user:ada", false, Scopes{std::vector<std::string>{}}) == "user:ada:");
  CHECK(viewer_id("user:ada", true, Scopes{{"b", "a"}}) == "user:ada:app:a,b");
}

TEST_CASE("viewer_id escapes a comma or a backslash inside a scope (SPEC 6.1 rev 2)") {
  CHECK(viewer_id("user:ada", false, Scopes{{"a,b"}}) == R"(user:ada:a\,b)");
  CHECK(viewer_id("user:ada", false, Scopes{{"a", "b"}}) == "user:ada:a,b");
  CHECK(viewer_id("user:ada", false, Scopes{{"c\\d"}}) == R"(user:ada:c\\d)");
  CHECK(viewer_id("user:ada", true, Scopes{{"x,", "\\"}}) == R"(user:ada:app:\\,x\,)");
  // Lists that a plain join would confuse.
  const std::vector<Scopes> lists{
      Scopes{{"a,b"}},     Scopes{{"a", "b"}},  Scopes{{"a\\", "b"}}, Scopes{{"a\\,b"}},
      Scopes{{"a\\\\,b"}}, Scopes{{"a,", "b"}}, Scopes{{"a", ",b"}},  Scopes{{",", ""}},
      Scopes{{","}},       Scopes{{"", ""}},    Scopes{{"\\"}},       Scopes{{"\\", ""}},
  };
  for (size_t i = 0; i < lists.size(); ++i) {
    for (size_t j = i + 1; j < lists.size(); ++j) {
      INFO(i << " " << j);
      CHECK(viewer_id("user:ada", false, lists[i]) != viewer_id("user:ada", false, lists[j]));
    }
  }
}

TEST_CASE("Viewer::to_json has id, actor, accessSubject and scopes") {
  Viewer session{"user:ada", "ada", "user:ada", std::nullopt, false};
  CHECK(session.to_json() == json{{"id", "user:ada"},
                                  {"actor", "ada"},
                                  {"accessSubject", "user:ada"},
                                  {"scopes", nullptr}});
  Viewer key{"user:ada:read,write", "ada", "user:ada", Scopes{{"read", "write"}}, false};
  const json j = key.to_json();
  CHECK(j.size() == 4);
  CHECK(j["scopes"] == json::array({"read", "write"}));
  Viewer none{"user:ada:", "ada", "user:ada", Scopes{std::vector<std::string>{}}, false};
  CHECK(none.to_json()["scopes"] == json::array());
}

TEST_CASE("Authenticator resolves credentials with the example queries") {
  const std::string url = auth_database();
  pqxx::connection raw(url);
  outlive::db::Connection conn(raw);
  const Authenticator auth(example_settings());

  SECTION("a valid session") {
    auto v = auth.resolve(conn, cookie("sess-ada"));
    REQUIRE(v);
    CHECK(v->id == "user:ada");
    CHECK(v->actor == "ada");
    CHECK(v->access_subject == "user:ada");
    CHECK_FALSE(v->scopes);
    CHECK_FALSE(v->app_session);
    CHECK(v->to_json() == json{{"id", "user:ada"},
                               {"actor", "ada"},
                               {"accessSubject", "user:ada"},
                               {"scopes", nullptr}});
  }
  SECTION("an app session") {
    auto v = auth.resolve(conn, cookie("sess-ada-phone"));
    REQUIRE(v);
    CHECK(v->id == "user:ada:app");
    CHECK(v->app_session);
    CHECK(v->access_subject == "user:ada");
  }
  SECTION("an expired session") { CHECK_FALSE(auth.resolve(conn, cookie("sess-old"))); }
  SECTION("an unknown token") {
    CHECK_FALSE(auth.resolve(conn, cookie("nope")));
    CHECK_FALSE(auth.resolve(conn, bearer("nope")));
  }
  SECTION("a session token is not accepted as a Bearer token, nor a key as a cookie") {
    CHECK_FALSE(auth.resolve(conn, bearer("sess-ada")));
    CHECK_FALSE(auth.resolve(conn, cookie("key-ada")));
  }
  SECTION("an API key") {
    auto v = auth.resolve(conn, bearer("key-ada"));
    REQUIRE(v);
    CHECK(v->id == "user:ada:read,write");
    CHECK(v->actor == "ada");
    CHECK(v->access_subject == "user:ada");
    REQUIRE(v->scopes);
    CHECK(*v->scopes == std::vector<std::string>{"read", "write"});
    CHECK(v->to_json()["scopes"] == json::array({"read", "write"}));
  }
  SECTION("a service account key") {
    auto v = auth.resolve(conn, bearer("key-ci"));
    REQUIRE(v);
    CHECK(v->id == "service_account:ci:deploy");
    CHECK(v->access_subject == "service_account:ci");
  }
  SECTION("an API key without a scope") {
    auto v = auth.resolve(conn, bearer("key-none"));
    REQUIRE(v);
    CHECK(v->id == "user:ada:");
    REQUIRE(v->scopes);
    CHECK(v->scopes->empty());
    CHECK(v->to_json()["scopes"] == json::array());
  }
  SECTION("quoted array elements; NULL elements are dropped") {
    auto v = auth.resolve(conn, bearer("key-odd"));
    REQUIRE(v);
    REQUIRE(v->scopes);
    CHECK(*v->scopes == std::vector<std::string>{"NULL", "a,comma", "b \"quoted\"", "c\\slash"});
    CHECK(v->id == R"(user:ada:NULL,a\,comma,b "quoted",c\\slash)");
  }
  SECTION("a revoked API key") { CHECK_FALSE(auth.resolve(conn, bearer("key-revoked"))); }
  SECTION("an OAuth token") {
    auto v = auth.resolve(conn, bearer("oauth-ada"));
    REQUIRE(v);
    CHECK(v->id == "user:ada:read");
    CHECK(v->access_subject == "user:ada");
    CHECK(v->scopes == Scopes{{"read"}});
  }
  SECTION("an expired OAuth token") { CHECK_FALSE(auth.resolve(conn, bearer("oauth-old"))); }
  SECTION("the connection stays usable after lookups") {
    CHECK_FALSE(auth.resolve(conn, cookie("nope")));
    CHECK(auth.resolve(conn, cookie("sess-ada")));
    CHECK(auth.resolve(conn, bearer("oauth-ada")));
  }
}

TEST_CASE("Authenticator: an empty query refuses that kind of credential") {
  const std::string url = auth_database();
  pqxx::connection raw(url);
  outlive::db::Connection conn(raw);

  auto settings = example_settings();
  settings.sessions_sql.clear();
  CHECK_FALSE(Authenticator(settings).resolve(conn, cookie("sess-ada")));
  CHECK(Authenticator(settings).resolve(conn, bearer("key-ada")));

  settings = example_settings();
  settings.api_keys_sql.clear();
  CHECK_FALSE(Authenticator(settings).resolve(conn, bearer("key-ada")));
  CHECK(Authenticator(settings).resolve(conn, bearer("oauth-ada")));

  settings = example_settings();
  settings.oauth_tokens_sql.clear();
  CHECK(Authenticator(settings).resolve(conn, bearer("key-ada")));
  CHECK_FALSE(Authenticator(settings).resolve(conn, bearer("oauth-ada")));

  settings.api_keys_sql.clear();
  CHECK_FALSE(Authenticator(settings).resolve(conn, bearer("key-ada")));
  CHECK_FALSE(Authenticator(example_settings()).resolve(conn, cookie("")));
}

TEST_CASE("Authenticator: a failing query throws Error(database)") {
  const std::string url = auth_database();
  pqxx::connection raw(url);
  outlive::db::Connection conn(raw);

  auto expect_database_error = [&](const outlive::config::Auth& settings, const Credential& c) {
    try {
      (void)Authenticator(settings).resolve(conn, c);
      FAIL("no error");
    } catch (const outlive::Error& e) {
      INFO(e.what());
      CHECK(e.code() == Errc::database);
    }
  };

  SECTION("a missing table") {
    auto settings = example_settings();
    settings.sessions_sql =
        "SELECT subject, actor, NULL::text[] AS scopes, false AS app_session FROM auth.missing "
        "WHERE token_sha256 = $1";
    expect_database_error(settings, cookie("sess-ada"));
    // The connection is still usable afterwards.
    CHECK(Authenticator(example_settings()).resolve(conn, cookie("sess-ada")));
  }
  SECTION("a syntax error") {
    auto settings = example_settings();
    settings.api_keys_sql = "SELEC nothing";
    expect_database_error(settings, bearer("key-ada"));
  }
  SECTION("a query without the expected columns") {
    auto settings = example_settings();
    settings.api_keys_sql = "SELECT subject FROM auth.api_keys WHERE key_sha256 = $1";
    expect_database_error(settings, bearer("key-ada"));
  }
  SECTION("a query that returns more than one row") {
    auto settings = example_settings();
    settings.api_keys_sql =
        "SELECT subject, actor, scopes, false AS app_session FROM auth.api_keys WHERE $1 <> ''";
    expect_database_error(settings, bearer("key-ada"));
  }
}

TEST_CASE("Authenticator::resolve_all answers many credentials as resolve() answers each") {
  const std::string url = auth_database();
  pqxx::connection raw(url);
  outlive::db::Connection conn(raw);
  const Authenticator auth(example_settings());
  const std::vector<Credential> credentials = {
      cookie("sess-ada"),       bearer("key-ada"), bearer("oauth-ada"), cookie("sess-old"),
      bearer("key-revoked"),    bearer("nope"),    cookie(""),          bearer("sess-ada"),
      cookie("sess-ada-phone"), bearer("key-ci"),  bearer("oauth-old"), bearer("key-odd")};
  const auto answers = auth.resolve_all(conn, credentials);
  REQUIRE(answers.size() == credentials.size());
  for (size_t i = 0; i < credentials.size(); ++i) {
    INFO(credentials[i].token);
    CHECK(answers[i].failure.empty());
    const auto alone = auth.resolve(conn, credentials[i]);
    REQUIRE(bool(answers[i].viewer) == bool(alone));
    if (alone) {
      CHECK(answers[i].viewer->id == alone->id);
      CHECK(answers[i].viewer->to_json() == alone->to_json());
    }
  }
  CHECK(answers[0].viewer->id == "user:ada");
  CHECK(answers[2].viewer->id == "user:ada:read");  // a Bearer token found by the OAuth query
  CHECK_FALSE(answers[3].viewer);
  CHECK(auth.resolve_all(conn, {}).empty());
}

TEST_CASE("Authenticator::resolve_all: a failing query fails its own credentials only") {
  const std::string url = auth_database();
  pqxx::connection raw(url);
  outlive::db::Connection conn(raw);
  auto settings = example_settings();
  // Divides by zero for ada's phone session only: the batch fails, each is then run alone.
  settings.sessions_sql =
      "SELECT subject, actor, NULL::text[] AS scopes, app_session FROM auth.sessions WHERE "
      "token_sha256 = $1 AND expires_at > now() AND 1 / (CASE WHEN $1 = "
      "encode(sha256('sess-ada-phone'::bytea), 'hex') "
      "THEN 0 ELSE 1 END) = 1";
  // Every API key's row for ada's key (the query author's mistake: more than one row), none for
  // the others.
  settings.api_keys_sql =
      "SELECT subject, actor, scopes, false AS app_session FROM auth.api_keys WHERE $1 = "
      "encode(sha256('key-ada'::bytea), 'hex')";
  const auto answers = Authenticator(settings).resolve_all(
      conn, {cookie("sess-ada"), cookie("sess-ada-phone"), bearer("key-ada"), bearer("oauth-ada"),
             cookie("sess-old")});
  REQUIRE(answers.size() == 5);
  CHECK(answers[0].viewer);
  CHECK(answers[0].failure.empty());
  CHECK_FALSE(answers[1].viewer);
  CHECK_THAT(answers[1].failure, Catch::Contains("division by zero"));
  CHECK_FALSE(answers[2].viewer);
  CHECK_THAT(answers[2].failure, Catch::Contains("rows, expected at most 1"));
  CHECK(answers[3].viewer);  // API keys found nothing: its OAuth query answered
  CHECK(answers[3].failure.empty());
  CHECK_FALSE(answers[4].viewer);
  CHECK(answers[4].failure.empty());
  // The connection goes on serving.
  CHECK(Authenticator(example_settings()).resolve(conn, cookie("sess-ada")));
}
