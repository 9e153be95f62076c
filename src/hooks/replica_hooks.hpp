#pragma once
// A replica's hooks (SPEC 5.1, 5.4 rev 4): one Client per app that has any, the configuration's
// hook channels turned into code channels that call them, and each app's auth.hook. Built once at
// start, before the channels are handed to the decider; metrics per app, channel and op.
#include <map>
#include <memory>
#include <string>

#include "config/config.hpp"

namespace outlive::metrics {
class Registry;
}

namespace outlive::hooks {

class AuthHook;
class Client;

class ReplicaHooks {
 public:
  // Sets `code` on every channel of `config` that has a hook. Reads hook_secret_file when any hook
  // is configured. Throws outlive::Error(invalid_input) for a hook URL that is not http(s) or a
  // secret file that cannot be read. `metrics` may be null (tests).
  ReplicaHooks(config::Config& config, metrics::Registry* metrics);
  ~ReplicaHooks();  // stop()
  ReplicaHooks(const ReplicaHooks&) = delete;
  ReplicaHooks& operator=(const ReplicaHooks&) = delete;

  // The client of `app`'s hooks, null when it has none.
  Client* client(const std::string& app) const;
  bool empty() const { return clients_.empty(); }
  // `app`'s session check (auth.hook), null without one.
  AuthHook* auth_hook(const std::string& app) const;

  // Every client's stop(): waiting calls fail, running ones end within their timeout.
  void stop();

 private:
  std::map<std::string, std::shared_ptr<Client>> clients_;
  std::map<std::string, std::unique_ptr<AuthHook>> auth_hooks_;
};

}  // namespace outlive::hooks
