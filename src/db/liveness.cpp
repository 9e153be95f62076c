#include "db/liveness.hpp"

#include <poll.h>

#include <pqxx/pqxx>

namespace outlive::db {

bool connection_lost(const pqxx::connection_base& conn, const std::exception* e) {
  if (e != nullptr && dynamic_cast<const pqxx::broken_connection*>(e) != nullptr) return true;
  return !conn.is_open();
}

bool idle_connection_dead(const pqxx::connection_base& conn) {
  if (!conn.is_open()) return true;
  const int fd = conn.sock();
  if (fd < 0) return true;
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  // The pool's connections never LISTEN, so anything that arrived unasked is the server ending
  // the session; reading it here would only tell the same thing one round later.
  return ::poll(&p, 1, 0) > 0;
}

}  // namespace outlive::db
