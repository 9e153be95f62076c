#pragma once
// What one socket is fed (SPEC 5.7): the dispatcher's live rounds through a mailbox or, when the
// socket falls behind or a `sub` comes back with a cursor, a pass over the window at the pace the
// tab reads, which rejoins live with no gap and no duplicate. It writes to its socket through a
// narrow sink (FeedSink) and tells the protocol what it did through FeedOwner, so it can be run
// against fakes. Every member runs on the socket's io thread except offer(), which the
// dispatcher's thread calls.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>

#include "access/decisions.hpp"
#include "fanout/delivery.hpp"
#include "fanout/frame.hpp"
#include "fanout/hand_offs.hpp"
#include "fanout/hub.hpp"
#include "session/subscriptions.hpp"
#include "topic/cursor.hpp"
#include "window/window.hpp"
#include "ws/connection.hpp"

namespace outlive::session {

// A lock for a few instructions with rare contention (a socket's mailbox: the dispatcher's thread
// and the socket's io thread). BasicLockable, for std::lock_guard.
class SpinLock {
 public:
  void lock() {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      while (locked_.load(std::memory_order_relaxed)) std::this_thread::yield();
    }
  }
  void unlock() { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

// The socket's transport as delivery uses it.
class FeedSink {
 public:
  virtual void send(ws::Frame frame) = 0;
  virtual size_t queued_bytes() const = 0;  // waiting to be sent
  // While corked, frames queue and leave together at uncork().
  virtual void cork() = 0;
  virtual void uncork() = 0;
  virtual void close(uint16_t code, const std::string& reason) = 0;
  virtual bool closing() const = 0;

 protected:
  ~FeedSink() = default;
};

// What the feed asks of, and tells, the socket's protocol side (session::Session).
class FeedOwner {
 public:
  virtual const fanout::Viewer* viewer() const = 0;  // null until the credential is known
  virtual void unfollow(const std::string& channel, const std::string& key) = 0;
  virtual void end_subscription(const std::string& id) = 0;
  // fanout::Reader's settled position (the progress tick skips a settled reader).
  virtual void settle(uint64_t position) = 0;
  virtual void unsettle() = 0;
  virtual void count_frames(uint64_t frames) = 0;  // update frames sent
  virtual void catch_up_started() = 0;
  virtual void feed_changed() = 0;  // live or catching up changed (gauges)
  // Asks the decider for the viewer's access to `key` through `channel`; `answered` runs on the
  // socket's thread (a failure closes the socket instead).
  virtual void ask_decision(const std::string& key, const std::string& channel,
                            std::function<void(bool allowed)> answered) = 0;
  virtual boost::asio::any_io_executor feed_executor() = 0;
  virtual std::shared_ptr<void> keep_alive() = 0;  // held by the feed's pending timer

 protected:
  ~FeedOwner() = default;
};

// Where the feed reads from: its app's window, its dispatcher's hand-offs and decisions.
struct FeedSource {
  std::string app;
  const window::Window* window = nullptr;
  const fanout::HandOffs* hand_offs = nullptr;
  topic::TopicIdentity identity;
  access::Decisions* decisions = nullptr;
  size_t max_mailbox = 256;                      // deliveries waiting before it catches up
  uint64_t progress_after_updates = 1250;  // progress when the cursor is this far behind,
  std::chrono::milliseconds progress_quiet = std::chrono::seconds(30);  // or quiet this long
  size_t send_buffer_bytes = 256 * 1024;         // live
  size_t replay_send_buffer_bytes = 512 * 1024;  // catching up
};

class Feed {
 public:
  Feed(FeedSink& sink, FeedOwner& owner, Subscriptions& subs);
  Feed(const Feed&) = delete;
  Feed& operator=(const Feed&) = delete;

  // Once the socket's app is known; an unbound feed sends nothing. `source` is the app's, shared
  // by its sockets, and outlives them (a copy per socket was 150 B of an idle socket's memory).
  void bind(const FeedSource& source) { source_ = &source; }

  // The dispatcher's thread: this socket's part of a round. True when the session must post
  // take_mailbox() (one handler waits at most).
  bool offer(std::vector<fanout::Delivery>&& deliveries, uint64_t through);

  void take_mailbox();
  // Leaves live delivery and reads the window after `from` (or goes back to it if already there).
  void start_catch_up(uint64_t from);
  // A `sub` from a cursor followed its keys when the dispatcher had looked up followers up to
  // `position`: the updates up to it were handed to the followers of then, not to this socket, so
  // it takes them from the window only (after their hand-off), never counting on them live.
  void replay_through(uint64_t position) {
    window_only_through_ = std::max(window_only_through_, position);
  }
  // Sends what the pass can (the buffer has room, the decisions are known), rejoins live at the
  // end.
  void pump();
  // The transport wrote some of its queue.
  void on_room();
  // Everything of the app up to `position` has been handed off (the progress tick).
  void on_progress(const fanout::ProgressTick& tick);
  // The tab was told it is at `position` (a progress frame never goes back behind it).
  void advance_cursor(uint64_t position);
  // A subscription was added, live from `position` (its cursor).
  void subscribed_at(uint64_t position);
  // The socket closes: nothing more is taken.
  void stop();
  // Any thread (an events.disconnect, from the dispatcher's): no update after `position` is sent.
  void end_after(uint64_t position) { end_after_.store(position, std::memory_order_release); }
  bool catching_up() const { return catching_up_; }
  // The frames' cursor at `position`, never past an events.disconnect's (end_after): a reader
  // marked to end is told no position after its end.
  std::string cursor_at(uint64_t position) const {
    position = std::min(position, end_after_.load(std::memory_order_acquire));
    return topic::Cursor::at(source_->identity, position).encode();
  }

 private:
  // Applies one update to the subscriptions and queues its frames: the one way an update reaches
  // the tab, live or catching up.
  void deliver(const fanout::Delivery& delivery);
  void deliver(const fanout::OutgoingUpdate& out, const fanout::ChannelAccess& allowed);
  // Sends what the window holds after scan_ (handed off, for this socket) until the buffer is full
  // or a decision is missing; false when it stopped early.
  bool scan();
  // The viewer's access to the update's key for the catch-up: false when a decision is missing
  // (it is asked for, and the pass waits).
  bool decide(const window::Update& u, fanout::Access& access);
  bool rejoin();
  void resync_behind();
  void resync_lost(uint64_t through);
  void resync_short_of(uint64_t position, uint64_t resume);
  void ask_decision(const std::string& key, const std::string& channel);
  void wait_for_hand_off();
  uint64_t safe_position() const;
  // Live, everything up to `position` offered was delivered: every subscription is brought there
  // and, when the tab was told it, the socket is settled there (fanout::Reader::settled).
  void settle_live(uint64_t position);

  FeedSink& sink_;
  FeedOwner& owner_;
  Subscriptions& subs_;
  const FeedSource* source_;

  // Shared with the dispatcher's thread (mailbox_mutex_: held for a few instructions, so a spin
  // lock of one byte rather than a std::mutex of 40 per socket).
  SpinLock mailbox_mutex_;
  bool live_ = true;
  bool mailbox_posted_ = false;
  std::atomic<uint64_t> end_after_{UINT64_MAX};  // an events.disconnect's position
  std::vector<fanout::Delivery> mailbox_;
  uint64_t mailbox_through_ = 0;  // every update up to it that the socket follows was offered

  // The pass over the window.
  bool catching_up_ = false;
  uint64_t scan_ = 0;  // every update up to it was looked at
  // Keys not handed off yet -> first position: a few at most, none while live, so a vector that
  // holds nothing while empty rather than a map (48 B per socket).
  std::vector<std::pair<std::string, uint64_t>> blocked_;
  bool is_blocked(const std::string& key) const {
    return std::any_of(blocked_.begin(), blocked_.end(),
                       [&](const auto& b) { return b.first == key; });
  }
  bool awaiting_decision_ = false;
  std::unique_ptr<fanout::Answered> answered_;  // (heap: only while a pass waits for a decision)
  uint64_t window_only_through_ = 0;
  std::unique_ptr<boost::asio::steady_timer> hand_off_timer_;  // a pass waits for a hand-off
  bool waiting_hand_off_ = false;
  bool pumping_ = false;  // pump() runs: a write finishing inside it asks for another pass
  bool pump_again_ = false;

  // Frames.
  std::vector<std::string> head_ids_;
  std::shared_ptr<const std::string> head_;
  uint64_t frames_in_batch_ = 0;

  // The tab's cursor.
  uint64_t last_cursor_position_ = 0;
  // The lowest cursor a subscription of the tab may hold: raised by a progress frame and by an
  // update frame for every subscription (an update for some of them moves only theirs).
  uint64_t oldest_cursor_position_ = 0;
  std::chrono::steady_clock::time_point last_progress_at_{};  // the tick's time (ProgressTick::at)
  // Since when the tab has heard nothing for all its subscriptions (progress or subscribed).
  std::chrono::steady_clock::time_point quiet_since_{};
};

}  // namespace outlive::session
