#pragma once
// The replica's JWT verifier (SPEC 5.1 rev 4): the key set (from the JWKS endpoint, refetched in the
// background, or from the HMAC secret files), the policy of config::Jwt, the viewer a token maps to,
// and the metrics. verify() never blocks: a token whose `kid` the set does not have waits for one
// refetch (at most one per 60 s) on the verifier's own thread, then is answered.
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "auth/auth.hpp"
#include "config/config.hpp"
#include "jwt/token.hpp"

namespace outlive::metrics {
class Registry;
}

namespace outlive::jwt {

// A verified token as the replica uses it.
struct Verified {
  auth::Viewer viewer;
  int64_t expires_at;  // unix seconds (`exp`)
  std::optional<int64_t> issued_at;
};

using Answer = std::variant<Verified, Failure>;

class Time;  // jwt/verifier_time.hpp

// How the key set is refreshed (SPEC 5.1 rev 4), as constants the tests and docs name.
constexpr std::chrono::milliseconds kJwksFetchTimeout{2000};
constexpr std::chrono::seconds kJwksDefaultMaxAge{300};  // a response without Cache-Control max-age
constexpr std::chrono::seconds kJwksMinMaxAge{60};
constexpr std::chrono::seconds kJwksMaxMaxAge{3600};
constexpr std::chrono::seconds kJwksRetryAfterFailure{30};  // the next try after a failed fetch
constexpr std::chrono::seconds kUnknownKidRefetchInterval{60};
constexpr std::chrono::seconds kJwksKeptWhileFailing{24 * 3600};  // then every token: no_keys
constexpr std::chrono::seconds kJwksFailureLogInterval{10};

class Verifier {
 public:
  // `metrics` may be null (tests). Does not fetch: start() does. Throws outlive::Error
  // (invalid_input) for settings it cannot work with: neither or both of jwks_url and
  // hmac_secret_file, no algorithm, an algorithm other than RS256, ES256, EdDSA and HS256.
  Verifier(config::Jwt settings, metrics::Registry* metrics);
  // Tests: the clocks of `time` (a ManualTime) instead of the real ones.
  Verifier(config::Jwt settings, metrics::Registry* metrics, std::shared_ptr<const Time> time);
  ~Verifier();  // stops the fetch thread
  Verifier(const Verifier&) = delete;
  Verifier& operator=(const Verifier&) = delete;

  // Loads the key set: reads the secret files, or fetches the JWKS (2 s timeout) and starts the
  // background refetch thread. Throws outlive::Error naming the URL or file when it cannot
  // (`outlive check` and `outlive serve` at start). Call once, before verify().
  void start();

  // Verifies `token` at the current time. `done` is called exactly once: inline when the answer is
  // known now, or on the verifier's thread after a refetch the token's unknown `kid` asked for
  // (or joined: one in flight), then with that refetch's key set. An unknown `kid` within 60 s of
  // the last refetch it asked for is answered unknown_kid inline, without a request. When the JWKS
  // has not been fetched for 24 h every token is Failure::no_keys (a check that cannot be made, not
  // the token's fault). Callable from any thread; `done` must not call back into this verifier's
  // destructor. A verifier destroyed with tokens waiting answers them unknown_kid.
  void verify(const std::string& token, std::function<void(Answer)> done);
  // The same, inline only: an unknown `kid` is Failure::unknown_kid (and asks for a refetch).
  Answer verify_now(const std::string& token);

  const config::Jwt& settings() const;

  // Tests that moved a ManualTime: the refetch thread looks at the time again.
  void time_moved();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The viewer of verified claims (SPEC 5.1 rev 4): id = id_prefix + sub, then ":" and the sorted
// scopes of `scope` (space-separated) or `scp` (an array or a string) as in 6.1; actor and
// accessSubject from the configured claims, else the id without scopes.
auth::Viewer viewer_of(const Claims& claims, const config::Jwt& settings);

}  // namespace outlive::jwt
