#pragma once
// What a replica's sockets are given (Services) and how they behave (Settings): set by the replica,
// shared by every socket through session::Context.
#include <chrono>
#include <cstddef>
#include <functional>
#include <string>

namespace outlive::auth {
class Authenticator;
struct Resolution;
}
namespace outlive::db {
class Pool;
}
namespace outlive::jwt {
class Verifier;
}
namespace outlive::metrics {
class Registry;
}
namespace outlive::window {
class AppWindow;
}

namespace outlive::session {

struct Services {
  db::Pool* pool = nullptr;
  const auth::Authenticator* authenticator = nullptr;
  jwt::Verifier* jwt = nullptr;  // with auth.jwt (SPEC 5.1 rev 4); verifies JWT credentials
  // With auth.hook (SPEC 5.1 rev 4): an app's session check of one hook credential (the replica
  // wires hooks::AuthHook), empty when the app has none. The check runs from any thread and never
  // blocks; its callback runs once, on a hook worker, with the answer.
  using HookCheck = std::function<void(const std::string& credential,
                                       std::function<void(const auth::Resolution&)> done)>;
  std::function<HookCheck(const std::string& app_id)> auth_hook_of;
  metrics::Registry* metrics = nullptr;
  std::function<window::AppWindow*(const std::string& app_id)> window_of;
  std::function<bool()> ready;  // /readyz
};

struct Settings {
  int io_threads = 2;
  std::chrono::milliseconds check_timeout = std::chrono::seconds(10);  // auth, keys(), authorize()
  std::chrono::milliseconds request_timeout = std::chrono::seconds(10);  // a complete HTTP request
  std::chrono::milliseconds recheck_interval = std::chrono::seconds(60);
  // SPEC 5.1 rev 4: a socket without a credential waits this long for the tab's auth message; a
  // JWT socket is told auth_expiring this long before its token's exp, and closed 4401 at exp +
  // jwt_leeway without a new one.
  std::chrono::milliseconds auth_message_wait = std::chrono::seconds(5);
  std::chrono::milliseconds auth_expiring_notice = std::chrono::seconds(30);
  std::chrono::seconds jwt_leeway = std::chrono::seconds(30);
  size_t send_buffer_bytes = 256 * 1024;
  size_t replay_send_buffer_bytes = 512 * 1024;  // while catching up from the window
  // How long a cursor ahead of this replica's window waits for the window before resync/topic.
  std::chrono::milliseconds window_catch_up_wait = std::chrono::seconds(2);
  std::chrono::milliseconds ping_interval = std::chrono::seconds(25);
  std::chrono::milliseconds idle_timeout = std::chrono::seconds(60);
  // A socket whose kernel takes no byte this long while frames wait is dropped (1013).
  std::chrono::milliseconds stall_timeout = std::chrono::seconds(30);
  // SPEC 5.9: an SSE stream gets a `: ping` comment this often and ends (1012) after
  // sse_max_duration (server.sse_max_seconds), the tab re-opening it from its cursors.
  std::chrono::milliseconds sse_keep_alive = std::chrono::seconds(15);
  std::chrono::milliseconds sse_max_duration = std::chrono::seconds(600);
  // A socket hears `progress` when its cursor is this many updates behind, or after
  // progress_quiet with the topic moved (config server.progress_*).
  uint64_t progress_after_updates = 1250;
  std::chrono::milliseconds progress_quiet = std::chrono::seconds(30);
  // Deliveries waiting in a socket's mailbox before it leaves live delivery and catches up.
  size_t max_mailbox = 256;
  size_t max_decisions = 1000000;
  size_t dispatcher_max_waiting = 4096;  // updates taken from the topic, not yet handed off
  int max_subscriptions = 16;
  int max_waiting_messages = 24;
  int max_sockets_per_viewer = 16;
  int opens_per_second = 5;
  int ipv6_limit_prefix = 64;  // config server.ipv6_limit_prefix
  size_t max_keys = 1000;
  std::chrono::milliseconds stop_grace = std::chrono::seconds(5);
  std::chrono::milliseconds decision_lifetime = std::chrono::minutes(5);  // cached access decisions
  std::chrono::milliseconds collection_refresh =
      std::chrono::minutes(1);  // keys() again for collections
  // Sockets whose collections' keys() run on the database pool at once (the rest wait in order).
  size_t collection_refreshes_at_once = 16;
};

}  // namespace outlive::session
