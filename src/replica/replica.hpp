#pragma once
#include <memory>
#include <outlive/channel.hpp>
#include <vector>

#include "config/config.hpp"

namespace outlive::replica {

// A running replica: publisher, one window per app, the websocket server. The constructor does
// every startup check (fatal errors throw outlive::Error with a clear message); stop() is the
// SIGTERM path: stop claiming and release claims, close every socket with 1012.
class Replica {
 public:
  // `channels` are declared in code (an embedding); each must name an app of `config` and a
  // channel name the configuration does not declare, else the constructor throws
  // Error(invalid_input) before anything starts.
  explicit Replica(config::Config config, std::vector<CodeChannel> channels = {});
  ~Replica();
  void stop();
  unsigned short port() const;
  unsigned short admin_port() const;  // server.admin_listen's port, 0 without one
  // The topic's head of `app` as a cursor (SPEC 2.2 cursor()).
  std::string head_cursor(const std::string& app) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outlive::replica
