#include "hooks/replica_hooks.hpp"

#include "hooks/auth_hook.hpp"
#include "hooks/channel_hook.hpp"
#include "hooks/client.hpp"
#include "hooks/signature.hpp"
#include "metrics/metrics.hpp"

namespace outlive::hooks {

namespace {

ObserveCall observer(metrics::Registry* metrics, const std::string& app) {
  if (metrics == nullptr) return {};
  return [metrics, app](const std::string& channel_name, const char* op, const char* result,
                        double seconds) {
    metrics
        ->counter("outlive_hook_calls_total",
                  "Calls to the application's hooks, by result: ok, timeout, status "
                  "(not 200), malformed (the answer), failed (connection, TLS, no room)",
                  {{"app", app}, {"channel", channel_name}, {"op", op}, {"result", result}})
        .fetch_add(1, std::memory_order_relaxed);
    metrics->observe("outlive_hook_call_seconds",
                     "Latency of calls to the application's hooks, from queued to answered",
                     {{"app", app}, {"channel", channel_name}, {"op", op}}, seconds);
  };
}

}  // namespace

ReplicaHooks::ReplicaHooks(config::Config& config, metrics::Registry* metrics) {
  std::string secret;
  auto client_of = [&](const std::string& app) -> std::shared_ptr<Client>& {
    if (secret.empty()) secret = read_secret(config.hook_secret_file);
    auto& client = clients_[app];
    if (!client) client = std::make_shared<Client>(app, secret, config.hooks.max_in_flight);
    return client;
  };
  for (auto& [app, settings] : config.apps) {
    for (auto& [name, channel] : settings.channels) {
      if (!channel.hook) continue;
      auto& client = client_of(app);
      channel.code = std::make_shared<const CodeChannel>(
          hook_channel(app, name, channel, client, observer(metrics, app)));
    }
    // (op "credentials", channel "": the same series as the channel hooks' calls)
    if (config.auth.hook) {
      auth_hooks_[app] = std::make_unique<AuthHook>(app, *config.auth.hook, client_of(app),
                                                    observer(metrics, app));
    }
  }
}

ReplicaHooks::~ReplicaHooks() { stop(); }

Client* ReplicaHooks::client(const std::string& app) const {
  const auto it = clients_.find(app);
  return it == clients_.end() ? nullptr : it->second.get();
}

AuthHook* ReplicaHooks::auth_hook(const std::string& app) const {
  const auto it = auth_hooks_.find(app);
  return it == auth_hooks_.end() ? nullptr : it->second.get();
}

void ReplicaHooks::stop() {
  for (auto& [app, client] : clients_) client->stop();
}

}  // namespace outlive::hooks
