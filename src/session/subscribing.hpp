#pragma once
// One socket's subscriptions protocol (SPEC 5.2–5.6): its messages in arrival order (sub, unsub),
// a sub's keys() check and its start (live, resync, or a catch-up from its cursor), the wait for
// the window behind a failover cursor, and the refresh of its collections' keys. The socket's
// lifecycle and its viewer's admission stay in Session, whose part this is; it reaches the socket
// only through SubscribingHost, and runs its checks through the socket's Checks. Every member runs
// on the socket's io thread unless it says otherwise.
#include <atomic>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/throttle.hpp"
#include "fanout/hub.hpp"
#include "tab/protocol.hpp"
#include "ws/send_queue.hpp"

namespace outlive::session {

struct AppRuntime;
class Checks;
struct Context;
class Feed;
class Subscriptions;

// What the subscriptions protocol asks of, and tells, its socket (session::Session).
class SubscribingHost {
 public:
  // The transport, as the feed's sink has it.
  virtual void send(ws::Frame frame) = 0;
  virtual void close(uint16_t code, const std::string& reason) = 0;
  virtual bool closing() const = 0;
  // From any thread (the decider's): work for a closed socket is dropped.
  virtual bool closed() const = 0;
  // The next message the tab sent (nullopt inside: a binary message); nullopt when none waits.
  virtual std::optional<std::optional<std::string>> next_message() = 0;
  virtual const fanout::Viewer* viewer() const = 0;  // null until admitted: no message is read
  // An auth message (SPEC 5.1 rev 4) after admission: a new token for this socket.
  virtual void authenticate(std::string token) = 0;
  // The hub: follows `keys` through `channel` for this socket's reader and viewer, returns the
  // position live delivery of them starts after (fanout::Hub::follow).
  virtual uint64_t follow(const std::set<std::string>& keys, const std::string& channel) = 0;
  virtual void unfollow(const std::string& channel, const std::string& key) = 0;
  virtual void unsettle() = 0;               // new keys: the next tick or round brings them
  virtual void subscriptions_changed() = 0;  // (gauges)
  virtual boost::asio::any_io_executor executor() = 0;
  // Held by the protocol's pending work; null once the socket is being destroyed (so from any
  // thread: refresh_collections() comes from the hub, which holds no reference).
  virtual std::shared_ptr<void> keep_alive() = 0;

 protected:
  ~SubscribingHost() = default;
};

class Subscribing {
 public:
  // All outlive it: the socket holds the context and its other parts.
  Subscribing(SubscribingHost& host, Context& context, Subscriptions& subs, Feed& feed,
              Checks& checks)
      : host_(host), context_(context), subs_(subs), feed_(feed), checks_(checks) {}

  // Once the socket's app is known (no message is read before).
  void bind(AppRuntime& app) { app_ = &app; }

  // Handles the waiting messages until one has to wait (a check, the window) or none is left.
  void process_next();
  void end_subscription(const std::string& id);
  // keys() again for the collections (after an access update, and every minute). From any thread.
  void refresh_collections();
  // The socket is closing: the wait for the window ends.
  void stop();

 private:
  // What became of a sub offered to the batch being gathered.
  enum class Offered {
    gathered,  // its keys() is asked with the batch's
    answered,  // refused with an error, or waiting for the window
    later,     // it has to be handled alone: after the batch
  };
  std::optional<std::optional<std::string>> take_message();
  void handle_other(tab::ClientMessage parsed);
  Offered offer_sub(tab::SubMessage& m, std::vector<tab::SubMessage>& batch);
  void check_subs(std::vector<tab::SubMessage> batch);
  void handle_unsub(const tab::UnsubMessage& m);
  bool cursor_ahead_of_window(const tab::SubMessage& m) const;
  bool wait_for_window(const tab::SubMessage& m);
  // False when an access update was read while its keys() was asked: it is asked again.
  bool start_subscription(const tab::SubMessage& m, const nlohmann::json& result);
  void again_first(std::vector<tab::SubMessage>::iterator from,
                   std::vector<tab::SubMessage>::iterator to);
  void run_collection_refresh(Throttle::Slot slot);
  void on_collections_refreshed(const nlohmann::json& result);
  void note_collections();

  void send_error(const std::string& code, const std::string& message,
                  const std::optional<std::string>& id);

  SubscribingHost& host_;
  Context& context_;
  Subscriptions& subs_;
  Feed& feed_;
  Checks& checks_;
  AppRuntime* app_ = nullptr;
  bool sub_checking_ = false;
  // Subs to handle again before the next message, in order: asked while an access update was
  // read, waited for the window, or held back from a batch (heap: rare).
  std::unique_ptr<std::deque<tab::SubMessage>> again_;
  // A message read while a batch was gathered that is not a sub: handled after the batch.
  std::unique_ptr<std::optional<std::string>> held_message_;
  // The sub waiting for the window behind a failover cursor, and until when (heap: rare).
  std::unique_ptr<std::pair<std::string, std::chrono::steady_clock::time_point>> window_wait_;
  bool waiting_for_window_ = false;
  // Made at the first wait for the window (a failover cursor): most sockets never wait.
  std::unique_ptr<boost::asio::steady_timer> window_timer_;
  bool refreshing_ = false;
  bool refresh_pending_ = false;
  // Some subscription is a collection (set on the socket's thread; refresh_collections() reads it
  // from the dispatcher's or the tick's).
  std::atomic<bool> has_collections_{false};
};

}  // namespace outlive::session
