#pragma once
// The checks of `outlive check` and of `outlive serve` at start (SPEC 6 rev 3): every SQL
// statement of the configuration prepared on the database, as the replica will prepare it, and
// the servers answering. Each failure names its configuration path.
#include <chrono>
#include <string>
#include <vector>

#include "config/config.hpp"

namespace outlive::app {

struct Problem {
  std::string path;     // JSON pointer into the configuration: /apps/inventory/channels/w/keys
  std::string message;  // Postgres' (or NATS') own message
};

// Connects to the configuration's database, checks the outbox is migrated (a problem at
// /apps/<id>, worded as the replica's own check), and prepares the
// credential queries of `auth` and every SQL channel's keys and authorize with the parameter
// types the replica binds (credentials: $1 text; keys: $1 jsonb scope, $2 jsonb viewer;
// authorize: $1 text key, $2 jsonb viewers). A credential query must also return the columns
// subject, actor, scopes and app_session, and keys and authorize at least one column. A database
// that cannot be reached is one problem at /database.
std::vector<Problem> check_database(const config::Config& config);

// Connects to the configuration's NATS servers; a problem at /nats when none answers in `timeout`.
std::vector<Problem> check_nats(const config::Config& config, std::chrono::milliseconds timeout);

// With auth.jwt: loads its key set as the replica does (the JWKS fetched, or the secret files
// read); a problem at /auth/jwt/jwks_url or /auth/jwt/hmac_secret_file when it cannot.
std::vector<Problem> check_jwt(const config::Config& config);

// Every hook channel's URL (SPEC 5.4 rev 4): a signed authorize of no viewers, which must be
// answered 200 with {"allowed":[...]} within the hook's timeout (a wrong secret shows as 401); and
// with auth.hook, per app, a signed session check of no credentials, answered {"results":{}}.
std::vector<Problem> check_hooks(const config::Config& config);

// How many statements check_database prepares.
size_t statement_count(const config::Config& config);

}  // namespace outlive::app
