#pragma once
// How the pool tells a connection that died (a Postgres restart, a cut network) from one it may
// hand to the next check (issue 47 items 2 and 6). Kept apart from the pool so the rules are
// unit-tested without a server.
#include <atomic>
#include <cstdint>
#include <exception>

namespace pqxx {
class connection_base;
}

namespace outlive::db {

// Connections are stamped with the generation they were opened in. When one is found dead, the
// ones opened before it died with it as likely as not (a restart ends every backend at once, but
// each socket only says so when next read), so all of them become suspect and are replaced on
// next use instead of each failing one check first.
class Generations {
 public:
  uint64_t current() const { return current_.load(std::memory_order_acquire); }
  // Opened in `stamp`, opened before the latest failure: replace it before use.
  bool suspect(uint64_t stamp) const { return stamp < current(); }
  // A connection stamped `stamp` failed: it and every connection as old are suspect. Later
  // failures of those same old connections move nothing (they are one loss, not several).
  void failed(uint64_t stamp) {
    uint64_t now = current_.load(std::memory_order_acquire);
    while (now <= stamp && !current_.compare_exchange_weak(now, stamp + 1)) {
    }
  }

 private:
  std::atomic<uint64_t> current_{1};
};

// A statement on `conn` threw `e` (nullptr: it answered, but with a failure): whether that was the
// connection's loss (pqxx::broken_connection, or libpq's status is no longer CONNECTION_OK) and
// not the statement's own (a syntax error, a timeout, a refused value).
bool connection_lost(const pqxx::connection_base& conn, const std::exception* e = nullptr);

// An idle connection (no statement running, no LISTEN) that has something to read was told
// goodbye (a shutting-down server's FATAL, or the end of the stream): whether `conn` is closed
// or dead by that sign, without a round trip.
bool idle_connection_dead(const pqxx::connection_base& conn);

}  // namespace outlive::db
