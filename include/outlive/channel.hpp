#pragma once
// Channels declared as functions (SPEC 5.4: "A C++ embedding may declare them with functions
// instead"). A code channel answers keys(scope, viewer) and authorize(key, viewers) from the
// application's own code; the replica treats it exactly like an SQL channel of its JSON
// configuration: the same decision cache, the same 10 s deadline (close 1011, the tab resumes from
// its cursor), the same batching (at most 500 viewers per authorize) and the same re-checks after
// an access update.
#include <atomic>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace outlive {

// The one answer to one asynchronous call. Copyable; every copy completes the same call, and only
// the first completion counts (a late answer after the deadline, or a second one, is ignored).
// Complete it from any thread, at any time; never completing it is a timeout (close 1011 after
// 10 s). Dropping every copy without completing is also a timeout.
template <class T>
class Reply {
 public:
  // The replica's side: `handler` receives either a value or an error message.
  using Handler = std::function<void(std::optional<T> value, std::string error)>;
  explicit Reply(Handler handler) : state_(std::make_shared<State>(std::move(handler))) {}

  // Answers with `value`.
  void operator()(T value) const {
    if (!state_->done.exchange(true)) state_->handler(std::move(value), std::string());
  }
  // Answers with a failure: the socket (or the reader waiting on this decision) closes with 1011
  // and nothing is skipped.
  void fail(std::string error) const {
    if (error.empty()) error = "failed";
    if (!state_->done.exchange(true)) state_->handler(std::nullopt, std::move(error));
  }
  // True once answered (by this copy or another).
  bool done() const { return state_->done.load(); }

 private:
  struct State {
    explicit State(Handler h) : handler(std::move(h)) {}
    Handler handler;
    std::atomic<bool> done{false};
  };
  std::shared_ptr<State> state_;
};

// What keys() answers: the keys the subscription follows, or nullopt when the resource does not
// exist or the viewer may not read it (the tab receives `not_found`; the socket stays). A
// collection may answer an empty list. At most 1,000 keys are followed; the rest are logged.
using KeysResult = std::optional<std::vector<std::string>>;
// What authorize() answers: the ids (viewer["id"]) of the viewers who may read the key.
using AllowedViewers = std::vector<std::string>;

// keys(scope, viewer, reply). `scope` has passed the channel's scope schema; `viewer` is the
// viewer object of SPEC 5.1 ({"id", "actor", "accessSubject", "scopes", "appSession"}).
using KeysFunction =
    std::function<void(const nlohmann::json& scope, const nlohmann::json& viewer, Reply<KeysResult> reply)>;
// authorize(key, viewers, reply). `viewers` is a JSON array of 1 to 500 viewer objects.
using AuthorizeFunction = std::function<void(const std::string& key, const nlohmann::json& viewers,
                                             Reply<AllowedViewers> reply)>;

// A channel of one app, declared in code. The functions are called on the replica's channel
// threads (never on a socket's or the delivery's thread), so a function that blocks holds only
// one of those; an asynchronous one returns at once and completes its Reply later. A function
// that throws fails its call as Reply::fail would.
struct CodeChannel {
  std::string app;                   // the app id; must be an app of the replica's configuration
  std::string name;                  // the name a tab gives in `sub`
  nlohmann::json scope = nlohmann::json::object();  // JSON Schema (draft 7) of the sub's scope
  bool collection = false;           // keys() may change without an update (SPEC 5.4)
  KeysFunction keys;
  AuthorizeFunction authorize;
};

// For functions that answer at once: wraps `keys(scope, viewer) -> KeysResult` into a
// KeysFunction (an exception becomes a failure).
inline KeysFunction blocking_keys(
    std::function<KeysResult(const nlohmann::json& scope, const nlohmann::json& viewer)> keys) {
  return [keys = std::move(keys)](const nlohmann::json& scope, const nlohmann::json& viewer,
                                  Reply<KeysResult> reply) { reply(keys(scope, viewer)); };
}

// For functions that answer at once: wraps `authorize(key, viewers) -> AllowedViewers`.
inline AuthorizeFunction blocking_authorize(
    std::function<AllowedViewers(const std::string& key, const nlohmann::json& viewers)> authorize) {
  return [authorize = std::move(authorize)](const std::string& key, const nlohmann::json& viewers,
                                            Reply<AllowedViewers> reply) {
    reply(authorize(key, viewers));
  };
}

}  // namespace outlive
