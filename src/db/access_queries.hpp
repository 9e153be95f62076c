#pragma once
// The configured access queries of a SQL channel (SPEC 5.4, 5.5), run on a pool worker's
// connection with the parameter types Postgres must be told (typed_query.hpp): access/ asks them
// through these and names no libpqxx type.
#include <optional>
#include <string>
#include <vector>

namespace outlive::db {

class Connection;  // db/connection.hpp

// The first column of every row a query returned, in order; NULL is nullopt (callers tell "no
// row" from "a row of NULL": keys() and authorize() give them different meanings).
using Column = std::vector<std::optional<std::string>>;

struct AccessQueries {
  // keys(scope, viewer): $1 jsonb, $2 jsonb.
  static Column keys(Connection& conn, const std::string& sql, const std::string& scope_json,
                     const std::string& viewer_json);
  // keys(scope, viewer) for each of `scope_jsons` with one viewer, sent in one round trip
  // (exec_typed_batch): a column per scope, in order. When one fails, the call throws.
  static std::vector<Column> keys(Connection& conn, const std::string& sql,
                                  const std::vector<std::string>& scope_jsons,
                                  const std::string& viewer_json);
  // authorize(key, viewers): $1 text, $2 jsonb (an array of viewer objects).
  static Column authorize(Connection& conn, const std::string& sql, const std::string& key,
                          const std::string& viewers_json);
};

}  // namespace outlive::db
