#pragma once
// The replica's HTTP server (SPEC 5, 6): accepts, answers /api/<app>/live/cursor, /healthz, /readyz
// and /metrics, and upgrades /api/<app>/live to a websocket that it hands to a session::Session.
// Delivery is not here: each app's is the replica's (fanout::AppDelivery). Boost.Beast stays
// inside server.cpp; this header is plain.
#include <memory>

namespace outlive::session {
struct Context;
}

namespace outlive::http {

class Server {
 public:
  // `context` is what the sockets share; its apps' deliveries are set and started.
  explicit Server(std::shared_ptr<session::Context> context);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listen address (port 0: any free port) and queues the accepts on the first io
  // thread; the replica starts the io threads.
  void start();
  // No new connection is accepted (SIGTERM): on the first io thread while the io threads run,
  // else at once. The replica orders the rest of the stop (Replica::stop).
  void stop_accepting();
  unsigned short port() const;
  unsigned short admin_port() const;  // server.admin_listen's port, 0 without one

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace outlive::http
