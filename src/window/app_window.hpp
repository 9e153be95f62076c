#pragma once
// One app's window on one replica: reads the app's topic once, fills the window with the latest
// updates at start, then follows the topic live and hands each new update to the app's delivery
// (SPEC 5.6).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "topic/client.hpp"
#include "topic/cursor.hpp"
#include "topic/follower.hpp"
#include "window/window.hpp"

namespace outlive::window {

class AppWindow {
 public:
  using OnUpdate = std::function<void(const UpdatePtr&)>;

  // `on_update` runs on the topic reader's thread for every update appended to the window (the
  // fill included: updates before ready() are the fill), after it is in the window, in topic order.
  // `client` must outlive the AppWindow.
  AppWindow(topic::Client& client, std::string app_id, Limits limits = {}, OnUpdate on_update = {});
  // The same, into `sink` (which must outlive the AppWindow).
  AppWindow(topic::Client& client, std::string app_id, Limits limits, Sink& sink);
  ~AppWindow();  // stop()
  AppWindow(const AppWindow&) = delete;
  AppWindow& operator=(const AppWindow&) = delete;

  // Reads the stream's state (the stream must exist: topic::Client::ensure_stream) and starts
  // filling the window from the latest `max_updates` messages; throws outlive::Error when the
  // stream cannot be read. Cursors from the message before the fill on are replayable.
  void start();
  // Stops reading the topic; on_update does not run once it returns. The window keeps its contents.
  void stop();

  // True once the window holds everything up to the topic's last message at start().
  bool ready() const { return ready_.load(); }
  // Waits until ready() or `timeout`; returns ready().
  bool wait_ready(std::chrono::milliseconds timeout) const;

  const Window& window() const { return window_; }
  // The topic's identity (app and stream instance) as read by start().
  topic::TopicIdentity identity() const;
  const std::string& app_id() const { return app_id_; }
  // Topic positions this replica never read because the stream no longer held them.
  uint64_t lost() const { return lost_.load(); }

 private:
  void on_message(const topic::StoredMessage& message, int64_t created_at_us);
  void take(const topic::StoredMessage& message, int64_t created_at_us);
  // An exception while the message at `position` was taken in: counted, and unless the delivery
  // has it already, a gap is handed in its place (its readers resync).
  void failed(uint64_t position, const std::string& what);
  void mark_ready();

  topic::Client& client_;
  const std::string app_id_;
  const Limits limits_;
  const OnUpdate on_update_;
  Sink* const sink_ = nullptr;
  Window window_;

  mutable std::mutex mutex_;  // identity_, follower_ (start/stop), and ready waits
  mutable std::condition_variable ready_changed_;
  topic::TopicIdentity identity_;
  std::unique_ptr<topic::Follower> follower_;
  std::atomic<bool> ready_{false};
  std::atomic<uint64_t> ready_at_{0};  // the topic's last sequence at start()
  std::atomic<uint64_t> skipped_{0};   // messages that were not outlive envelopes
  std::atomic<uint64_t> lost_{0};      // positions gone from the topic before they were read
  uint64_t lost_through_ = 0;          // lost, not yet announced by an update (follower thread)
  uint64_t handed_through_ = 0;        // the last position the delivery has (follower thread)
  std::chrono::steady_clock::time_point lost_logged_at_{};
};

}  // namespace outlive::window
