#pragma once
// Who may open a socket (SPEC 5.1, 5.7): the credential a request carries, its origin, socket
// opens per second (per person for session cookies, per client address otherwise) and sockets per
// viewer. Thread-safe. The credential itself is resolved by auth::Authenticator on a pool worker,
// between before_lookup() and after_lookup().
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "auth/auth.hpp"
#include "ws/limits.hpp"

namespace outlive::admission {

struct OpenRequest {
  std::string app;
  std::string cookie;         // the Cookie header
  std::string authorization;  // the Authorization header
  std::string origin;
  std::string address;  // the client address limits count (TrustedProxies::client_address)
  // With auth.hook: the request's headers of auth.hook.forward_headers (lowercase names) it has.
  std::vector<std::pair<std::string, std::string>> hook_headers;
};

struct Refusal {
  std::string code;  // error frame code
  std::string message;
  uint16_t close_code;  // 1008: do not retry; 1013: back off and retry
};

class Admission {
 public:
  using Clock = std::chrono::steady_clock;
  // `ipv6_prefix`: IPv6 client addresses count per prefix of this length (limit_key()).
  // `jwt_cookie`: set when auth.jwt is configured (SPEC 5.1 rev 4), the name of its cookie or
  // empty; then a Bearer token in three base64url parts is a JWT, and a request without a
  // credential may still bring one in the tab's first message (CredentialKind::pending).
  // `hook`: auth.hook is configured (SPEC 5.1 rev 4): a request that carries no JWT of auth.jwt
  // but any of the forwarded headers presents them to the hook, never to the SQL queries.
  Admission(std::string session_cookie, int opens_per_second, int max_sockets_per_viewer,
            int ipv6_prefix = 64, std::optional<std::string> jwt_cookie = std::nullopt,
            bool hook = false);

  // Before the lookup: the credential to resolve, or why the socket is refused.
  std::variant<auth::Credential, Refusal> before_lookup(const OpenRequest& request,
                                                        const std::set<std::string>& origins,
                                                        Clock::time_point opened_at);
  // After it: counts the socket towards its viewer (release() it when it closes), or refuses.
  std::optional<Refusal> after_lookup(const auth::Viewer& viewer,
                                      const auth::Credential& credential,
                                      Clock::time_point opened_at);
  void release(const std::string& viewer_id) { sockets_.remove(viewer_id); }
  // Credential lookups that find nothing (unknown, expired, malformed) are counted per address:
  // once an address has had 5 in the last second, its opens with a credential are refused
  // (rate_limited) without a lookup. At most 5 lookups of an address run at once, the others wait
  // for them, so garbage credentials cost the database at most 5 lookups a second while valid ones
  // from a shared address are only delayed.
  enum class Gate { go, wait, refuse };
  static constexpr int kFailedLookupsPerSecond = 5;
  Gate begin_lookup(const std::string& address, Clock::time_point now);
  // The end of a lookup begin_lookup() let go.
  void lookup_ended(const std::string& address, bool found, Clock::time_point at);
  // Frees the state of addresses and people quiet for a second (a timer calls it once a second:
  // SPEC 5.7 rev 3, nothing is kept per address ever seen).
  // Returns freed memory to the OS (malloc_trim) when it forgot at least kTrimAfterForgetting.
  void forget_quiet(Clock::time_point now);
  static constexpr size_t kTrimAfterForgetting = 1000;
  // Addresses and people with state kept.
  size_t tracked();

 private:
  // Drops the state of addresses quiet for a second (under lookups_mutex_), at most once a second.
  void sweep(Clock::time_point now);

  const std::string session_cookie_;
  const std::optional<std::string> jwt_cookie_;
  const bool hook_;
  const int ipv6_prefix_;
  ws::OpenRateLimiter opens_;
  ws::SocketCounter sockets_;
  std::mutex lookups_mutex_;
  struct Lookups {
    int running = 0;
    std::vector<Clock::time_point> failed;  // (a deque costs ~600 bytes even empty)
  };
  std::unordered_map<std::string, Lookups> lookups_;
  Clock::time_point last_sweep_{};
};

}  // namespace outlive::admission
