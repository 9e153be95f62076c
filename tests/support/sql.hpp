#pragma once
// SQL the integration fixtures run against their test database: a connection per call, so a
// test thread never shares one with the replica's pool.
#include <pqxx/pqxx>
#include <string>
#include <vector>

namespace outlive::testing {

// `statements` in one transaction; then events.wake(`wake_app`) so the publisher claims at once.
inline void run_tx(const std::string& db, const std::vector<std::string>& statements,
                   const std::string& wake_app = "inventory") {
  pqxx::connection c(db);
  pqxx::work w(c);
  for (const auto& s : statements) w.exec(s);
  w.commit();
  pqxx::nontransaction(c).exec("SELECT events.wake(" + c.quote(wake_app) + ")");
}

inline void run_sql(const std::string& db, const std::string& statement) {
  pqxx::connection c(db);
  pqxx::work w(c);
  w.exec(statement);
  w.commit();
}

// The first column of the first row (0 when it is null).
inline int64_t query_scalar(const std::string& db, const std::string& query) {
  pqxx::connection c(db);
  return pqxx::nontransaction(c).exec(query)[0][0].as<int64_t>(0);
}

}  // namespace outlive::testing
