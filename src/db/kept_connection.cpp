#include "db/kept_connection.hpp"

#include <optional>
#include <pqxx/pqxx>

#include "db/connection.hpp"
#include "db/liveness.hpp"
#include "db/pool.hpp"

namespace outlive::db {

struct KeptConnection::Impl {
  std::string url;  // with connect_timeout and the name
  std::chrono::milliseconds statement_timeout;
  SocketSlot& slot;
  std::optional<pqxx::connection> conn;
  std::optional<Connection> handle;  // of conn
};

KeptConnection::KeptConnection(std::string url, std::chrono::seconds connect_timeout,
                               std::string name, std::chrono::milliseconds statement_timeout,
                               SocketSlot& slot)
    : impl_(new Impl{named(with_connect_timeout(url, connect_timeout), name), statement_timeout,
                     slot, std::nullopt, std::nullopt}) {}

KeptConnection::~KeptConnection() { impl_->slot.clear(); }

Connection& KeptConnection::get() {
  auto& i = *impl_;
  // One that died while idle (a Postgres restart) is replaced before its round fails on it.
  if (!i.conn || idle_connection_dead(*i.conn)) {
    drop();
    i.conn.emplace(i.url);
    i.handle.emplace(*i.conn);
    i.slot.set(i.conn->sock());
    pqxx::nontransaction(*i.conn).exec("SET statement_timeout = " +
                                       std::to_string(i.statement_timeout.count()));
  }
  return *i.handle;
}

void KeptConnection::ping() { db::ping(get()); }

void KeptConnection::drop() {
  impl_->slot.clear();
  impl_->handle.reset();
  impl_->conn.reset();
}

}  // namespace outlive::db
