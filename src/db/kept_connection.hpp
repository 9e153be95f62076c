#pragma once
// A background loop's connection (readiness, gauges): kept across its rounds (a backend's start
// and exit cost Postgres more CPU, ~35 ms on a 2-vCPU guest, than these statements) and reopened
// after a failure. Its socket is in `slot` while open, for the owner's stop() to cut short a
// query on a server that does not answer (SocketSlot::interrupt). Used by one thread.
#include <chrono>
#include <memory>
#include <string>

#include "common/socket_slot.hpp"

namespace outlive::db {

class Connection;  // db/connection.hpp

class KeptConnection {
 public:
  // `name` is pg_stat_activity's application_name; statements are cut off after
  // `statement_timeout`.
  KeptConnection(std::string url, std::chrono::seconds connect_timeout, std::string name,
                 std::chrono::milliseconds statement_timeout, SocketSlot& slot);
  ~KeptConnection();  // the slot forgets the socket before the connection closes
  KeptConnection(const KeptConnection&) = delete;
  KeptConnection& operator=(const KeptConnection&) = delete;

  // The open connection, (re)opened now when it is not. Throws when connecting fails.
  Connection& get();
  // db::ping() on it (readiness). Throws when it fails; the caller drop()s.
  void ping();
  // Closes it, for the next get() to reopen (after a failure).
  void drop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outlive::db
