#pragma once
// The inventory demo as the websocket tests use it: SPEC 6.1's auth tables, two warehouses
// (north, south) and their members table, the viewer ada and the channel queries over them. Each
// test file adds its own other people, sessions and keys.
#include <nlohmann/json.hpp>
#include <string>

namespace outlive::testing {

inline const std::string kInventoryTables = R"SQL(
CREATE SCHEMA auth;
CREATE TABLE auth.sessions (token_sha256 text PRIMARY KEY, subject text, actor text, app_session boolean, expires_at timestamptz);
CREATE TABLE auth.api_keys (key_sha256 text PRIMARY KEY, subject text, actor text, scopes text[], revoked_at timestamptz);
CREATE TABLE auth.oauth_tokens (token_sha256 text PRIMARY KEY, subject text, actor text, scopes text[], expires_at timestamptz);
CREATE SCHEMA inventory;
CREATE TABLE inventory.warehouses (id uuid PRIMARY KEY, public_id text UNIQUE);
CREATE TABLE inventory.members (warehouse_id uuid, subject text);
INSERT INTO inventory.warehouses VALUES ('00000000-0000-0000-0000-00000000000a', 'north'),
                                        ('00000000-0000-0000-0000-00000000000b', 'south');
)SQL";

inline const std::string kNorth =
    "00000000-0000-0000-0000-00000000000a";  // the key of warehouse north
inline const std::string kSouth = "00000000-0000-0000-0000-00000000000b";
inline const nlohmann::json kNorthScope = {{"warehouse", "north"}};
inline const nlohmann::json kSouthScope = {{"warehouse", "south"}};

// ada, the viewer most websocket tests sign in as: user:ada, a member of north, with a session
// whose token is kAdaToken (the cookie kAdaCookie). A test file adds its other people, ada's other
// memberships and credentials after it.
inline const std::string kAdaToken = "ada-session";
inline const std::string kAdaCookie = "session=" + kAdaToken;  // a Cookie header's value
inline const std::string kAdaSeed =
    "INSERT INTO inventory.members VALUES ('" + kNorth + "', 'user:ada');\n" +
    "INSERT INTO auth.sessions VALUES (encode(sha256('" + kAdaToken +
    "'), 'hex'), 'user:ada', 'user:ada', false, now() + interval '1 hour');\n";

inline const char* kWarehouseKeys =
    "SELECT id::text AS key FROM inventory.warehouses WHERE public_id = $1->>'warehouse'";
inline const char* kWarehouseAuthorize =
    "SELECT v->>'id' AS id FROM jsonb_array_elements($2) v JOIN inventory.members m ON "
    "m.warehouse_id = $1::uuid AND m.subject = v->>'accessSubject'";

// The scope of a channel that follows one warehouse: {"warehouse": "<public id>"}.
inline const nlohmann::json kWarehouseScopeSchema = {
    {"type", "object"},
    {"properties", {{"warehouse", {{"type", "string"}}}}},
    {"required", {"warehouse"}},
    {"additionalProperties", false}};

// The config's "auth" section over those tables (SPEC 6.1), re-checking every `recheck_seconds`.
inline nlohmann::json inventory_auth(int recheck_seconds = 60) {
  return {{"session_cookie", "session"},
          {"recheck_seconds", recheck_seconds},
          {"sessions",
           "SELECT subject, actor, NULL::text[] AS scopes, app_session FROM auth.sessions "
           "WHERE token_sha256 = $1 AND expires_at > now()"},
          {"api_keys",
           "SELECT subject, actor, scopes, false AS app_session FROM auth.api_keys "
           "WHERE key_sha256 = $1 AND revoked_at IS NULL"},
          {"oauth_tokens",
           "SELECT subject, actor, scopes, false AS app_session FROM auth.oauth_tokens "
           "WHERE token_sha256 = $1 AND expires_at > now()"}};
}

// The channel most tests subscribe to: "warehouse", a SQL channel over those tables.
inline nlohmann::json warehouse_channels() {
  return {{"warehouse",
           {{"scope", kWarehouseScopeSchema},
            {"keys", kWarehouseKeys},
            {"authorize", kWarehouseAuthorize}}}};
}

// A replica's config serving the app "inventory" with `channels` on those tables.
inline nlohmann::json inventory_replica_config(const std::string& db, const std::string& nats,
                                               const std::string& replica,
                                               const nlohmann::json& channels,
                                               int recheck_seconds = 60) {
  return {
      {"replica", replica},
      {"listen", "127.0.0.1:0"},
      {"database", db},
      {"nats", {nats}},
      {"publisher", {{"poll_ms", 100}}},
      {"auth", inventory_auth(recheck_seconds)},
      {"apps",
       {{"inventory", {{"allowed_origins", {"http://localhost:8080"}}, {"channels", channels}}}}}};
}

}  // namespace outlive::testing
