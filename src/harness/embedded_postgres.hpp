#pragma once
#include <string>

#include "harness/process.hpp"

namespace outlive::harness {

struct PostgresOptions {
  bool durable = false;  // false: fsync/synchronous_commit off (tests, benchmarks)
  int port = 0;          // 0: a free port
  std::string data_dir;  // empty: a temp dir removed on stop
  int max_connections = 300;
};

// A real PostgreSQL 15 server on 127.0.0.1, initdb'd into a temp dir (as user postgres when we run
// as root, since Postgres refuses root). Ready when the constructor returns; gone after stop() or
// the destructor, also when a test fails.
class EmbeddedPostgres {
 public:
  explicit EmbeddedPostgres(PostgresOptions options = {});
  ~EmbeddedPostgres();
  EmbeddedPostgres(const EmbeddedPostgres&) = delete;
  EmbeddedPostgres& operator=(const EmbeddedPostgres&) = delete;

  int port() const { return port_; }
  // postgresql://postgres@127.0.0.1:<port>/<database>
  std::string url(const std::string& database = "postgres") const;
  // CREATE DATABASE <name>; returns its url.
  std::string create_database(const std::string& name);
  void stop();

 private:
  void wait_ready();
  PostgresOptions options_;
  std::string dir_;
  bool owns_dir_ = false;
  int port_ = 0;
  ChildProcess server_;
};

// Where Debian keeps the server binaries (initdb, postgres).
std::string postgres_bin_dir();

}  // namespace outlive::harness
