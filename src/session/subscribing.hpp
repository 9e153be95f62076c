#pragma once
// One socket's subscriptions protocol (SPEC 5.2–5.6): its messages in arrival order (sub, unsub),
// a sub's keys() check and its start (live, resync, or a catch-up from its cursor), the wait for
// the window behind a failover cursor, and the refresh of its collections' keys. The socket's
// lifecycle, its viewer's admission and the checks' deadline stay in Session, whose part this is.
// Every member runs on the socket's io thread unless it says otherwise.
#include <atomic>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "common/throttle.hpp"
#include "ws/protocol.hpp"

namespace outlive::session {

class Session;

class Subscribing {
 public:
  explicit Subscribing(Session& session) : s_(session) {}

  // Handles the waiting messages until one has to wait (a check, the window) or none is left.
  void process_next();
  void end_subscription(const std::string& id);
  // keys() again for the collections (after an access update, and every minute). From any thread.
  void refresh_collections();
  // The socket is closing: the wait for the window ends.
  void stop();

 private:
  void handle_sub(ws::SubMessage m);
  void handle_unsub(const ws::UnsubMessage& m);
  bool wait_for_window(const ws::SubMessage& m);
  void start_subscription(const ws::SubMessage& m, const nlohmann::json& result);
  void run_collection_refresh(Throttle::Slot slot);
  void on_collections_refreshed(const nlohmann::json& result);
  void note_collections();

  Session& s_;
  bool sub_checking_ = false;
  std::unique_ptr<ws::SubMessage> retry_;  // a sub to handle again (an access update was read)
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
