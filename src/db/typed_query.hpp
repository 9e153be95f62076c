#pragma once
// Configured queries (keys(), authorize(), credentials) run with explicit parameter types: the
// SPEC's queries use $1->>'warehouse' and $1::uuid, so Postgres must be told that $1 is jsonb or
// text rather than guess.
#include <pqxx/pqxx>
#include <string>
#include <vector>

namespace outlive::db {

// Runs `sql` as a statement prepared once per connection with the parameter `types` (Postgres
// type names such as "text", "jsonb", "uuid", "text[]"), binding `params` in order. A statement is
// remembered only after its PREPARE succeeded, so one that failed (say its table was created after
// the replica started) is prepared again on the next call; a reopened connection (new backend pid)
// prepares again too. Postgres' errors surface as pqxx exceptions carrying its message; a `types`
// entry that is not a plain type name, or a count that differs from `params`, is
// std::invalid_argument. Opens its own nontransaction, so `conn` must have no transaction open. A
// connection is used by one thread at a time.
pqxx::result exec_typed(pqxx::connection& conn, const std::string& sql,
                        const std::vector<std::string>& types,
                        const std::vector<std::string>& params);

// The same statement once per entry of `rows`, every EXECUTE sent in one round trip (a pqxx
// pipeline): one wait for the server instead of one per row. A result per row, in order. When one
// fails, the whole call throws (that query's error); nothing tells which rows ran, so a caller that
// must know runs them again one at a time.
std::vector<pqxx::result> exec_typed_batch(pqxx::connection& conn, const std::string& sql,
                                           const std::vector<std::string>& types,
                                           const std::vector<std::vector<std::string>>& rows);

}  // namespace outlive::db
