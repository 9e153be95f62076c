#pragma once
// A Postgres connection as the database's users outside db/ see it. Work posted to the pool
// (Pool::Task) gets one and hands it on to the typed queries (access_queries.hpp,
// auth::Authenticator, outbox/gauges.hpp), so session/, access/ and replica/ never name a libpqxx
// type: they only see the declaration in db/pool.hpp. This definition is for db/, outbox/, auth's
// implementation and tests.
#include <functional>
#include <pqxx/connection>

namespace outlive::db {

class Connection {
 public:
  // Implicit both ways: tasks and tests written against pqxx::connection& go on working.
  Connection(pqxx::connection& conn) : conn_(&conn) {}   // NOLINT(google-explicit-constructor)
  operator pqxx::connection&() const { return *conn_; }  // NOLINT(google-explicit-constructor)
  pqxx::connection& raw() const { return *conn_; }

  // A pool worker's connection can be replaced in place by its worker (db::reopen_if_lost): the
  // task that saw it die retries once on a fresh one instead of failing its check.
  // `reopen` closes the connection, opens a new one at the same address and says whether it could.
  Connection(pqxx::connection& conn, std::function<bool()> reopen)
      : conn_(&conn), reopen_(std::move(reopen)) {}
  bool can_reopen() const { return static_cast<bool>(reopen_); }
  bool reopen() const { return reopen_ && reopen_(); }

 private:
  pqxx::connection* conn_;
  std::function<bool()> reopen_;
};

}  // namespace outlive::db
