#pragma once
// The replica's JWT verifier (SPEC 5.1 rev 4): the key set (from the JWKS endpoint, refetched in the
// background, or from the HMAC secret files), the policy of config::Jwt, the viewer a token maps to,
// and the metrics. verify() never blocks: a token whose `kid` the set does not have waits for one
// refetch (at most one per 60 s) on the verifier's own thread, then is answered.
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

class Verifier {
 public:
  // `metrics` may be null (tests). Does not fetch: start() does.
  Verifier(config::Jwt settings, metrics::Registry* metrics);
  ~Verifier();  // stops the fetch thread
  Verifier(const Verifier&) = delete;
  Verifier& operator=(const Verifier&) = delete;

  // Loads the key set: reads the secret files, or fetches the JWKS (2 s timeout) and starts the
  // background refetch thread. Throws outlive::Error naming the URL or file when it cannot
  // (`outlive check` and `outlive serve` at start). Call once, before verify().
  void start();

  // Verifies `token` at the current time. `done` is called exactly once: inline when the answer is
  // known now, or on the verifier's thread after a refetch the token's unknown `kid` asked for.
  // Callable from any thread.
  void verify(const std::string& token, std::function<void(Answer)> done);
  // The same, inline only: an unknown `kid` is Failure::unknown_kid (and asks for a refetch).
  Answer verify_now(const std::string& token);

  const config::Jwt& settings() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The viewer of verified claims (SPEC 5.1 rev 4): id = id_prefix + sub, then ":" and the sorted
// scopes of `scope` (space-separated) or `scp` (an array or a string) as in 6.1; actor and
// accessSubject from the configured claims, else the id without scopes.
auth::Viewer viewer_of(const Claims& claims, const config::Jwt& settings);

}  // namespace outlive::jwt
