#pragma once
// The application's own session check (SPEC 5.1 rev 4, auth.hook): credentials the replica cannot
// verify itself go to the application, POST {"app","credentials":[{"ref","headers","origin",
// "address"},...]}, answered {"results":{"<ref>":{"viewer":{...},"expires_in_s":N} |
// {"refused":"reason"}}}. The checks asked while an app's call waits for a free connection join
// that call (at most 64 credentials), so a reconnect storm costs the application a few calls, not
// one per tab; the body is written when a worker takes the call (hooks::Call::make_body).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "hooks/channel_hook.hpp"

namespace outlive::hooks {

class Client;

// One credential's answer.
struct CredentialAnswer {
  nlohmann::json viewer;     // {"id","actor","accessSubject","scopes"} when admitted, else null
  int64_t expires_in_s = 0;  // > 0: ask again this soon at the latest
  std::string refused;       // the application's reason, when it refused (viewer null)
  std::string failure;       // not empty: no usable answer (a failed check, not a refusal)

  bool admitted() const { return failure.empty() && !viewer.is_null(); }
};

// The answers of a call that asked for refs "1".."count" (pure; tests call it). Throws
// outlive::Error(invalid_input) when the body as a whole is malformed; a ref with no result, or a
// result that is neither a viewer nor a refusal, is that credential's failure only.
std::vector<CredentialAnswer> parse_credentials_answer(const std::string& body, size_t count);

class AuthHook {
 public:
  static constexpr size_t kBatch = 64;
  using Done = std::function<void(CredentialAnswer)>;

  // `client` (the app's) must outlive every check. Throws outlive::Error(invalid_input) when the
  // URL is not http(s).
  AuthHook(std::string app, const config::AuthHook& settings, std::shared_ptr<Client> client,
           ObserveCall observe = {});
  ~AuthHook();

  // From any thread, never blocks: `done` runs once, on a hook worker (or on the calling thread
  // when the app's queue has no room), with the answer. `credential`: the text of
  // auth::hook_credential().
  void check(const std::string& credential, Done done);

 private:
  struct Shared;
  struct Batch;
  void send(const std::shared_ptr<Batch>& batch);

  std::shared_ptr<Shared> shared_;
  std::shared_ptr<Client> client_;
};

}  // namespace outlive::hooks
