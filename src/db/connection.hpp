#pragma once
// A Postgres connection as the database's users outside db/ see it. Work posted to the pool
// (Pool::Task) gets one and hands it on to the typed queries (access_queries.hpp,
// auth::Authenticator, outbox/gauges.hpp), so session/, access/ and replica/ never name a libpqxx
// type: they only see the declaration in db/pool.hpp. This definition is for db/, outbox/, auth's
// implementation and tests.
#include <pqxx/connection>

namespace outlive::db {

class Connection {
 public:
  // Implicit both ways: tasks and tests written against pqxx::connection& go on working.
  Connection(pqxx::connection& conn) : conn_(&conn) {}   // NOLINT(google-explicit-constructor)
  operator pqxx::connection&() const { return *conn_; }  // NOLINT(google-explicit-constructor)
  pqxx::connection& raw() const { return *conn_; }

 private:
  pqxx::connection* conn_;
};

}  // namespace outlive::db
