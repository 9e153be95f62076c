#pragma once
#include <memory>

#include "config/config.hpp"

namespace outlive::replica {

// A running replica: publisher, one window per app, the websocket server. The constructor does
// every startup check (fatal errors throw outlive::Error with a clear message); stop() is the
// SIGTERM path: stop claiming and release claims, close every socket with 1012.
class Replica {
 public:
  explicit Replica(config::Config config);
  ~Replica();
  void stop();
  unsigned short port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outlive::replica
