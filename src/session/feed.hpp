#pragma once
// What one socket is fed (SPEC 5.7): the dispatcher's live rounds through a mailbox or, when the
// socket falls behind or a `sub` comes back with a cursor, a pass over the window at the pace the
// tab reads, which rejoins live with no gap and no duplicate. Part of a Session, which owns the
// subscriptions and the transport; every member runs on the session's io thread except offer(),
// which the dispatcher's thread calls.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <map>
#include <mutex>
#include <thread>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include <boost/asio/steady_timer.hpp>

#include "fanout/delivery.hpp"
#include "session/subscriptions.hpp"
#include "window/window.hpp"

namespace outlive::session {

class Session;

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

class Feed {
 public:
  explicit Feed(Session& session);
  Feed(const Feed&) = delete;
  Feed& operator=(const Feed&) = delete;

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
  void on_progress(uint64_t position);
  // The tab was told it is at `position` (a progress frame never goes back behind it).
  void advance_cursor(uint64_t position);
  // The socket closes: nothing more is taken.
  void stop();
  bool catching_up() const { return catching_up_; }

 private:
  // Applies one update to the subscriptions and queues its frames.
  void deliver(const window::Update& u, const std::string& cursor,
               const std::shared_ptr<const std::string>& tail,
               const fanout::ChannelAccess& allowed);
  // Sends what the window holds after scan_ (handed off, for this socket) until the buffer is full
  // or a decision is missing; false when it stopped early.
  bool scan();
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

  Session& session_;

  // Shared with the dispatcher's thread (mailbox_mutex_: held for a few instructions, so a spin
  // lock of one byte rather than a std::mutex of 40 per socket).
  SpinLock mailbox_mutex_;
  bool live_ = true;
  bool mailbox_posted_ = false;
  std::vector<fanout::Delivery> mailbox_;
  uint64_t mailbox_through_ = 0;  // every update up to it that the socket follows was offered

  // The pass over the window.
  bool catching_up_ = false;
  uint64_t scan_ = 0;                                  // every update up to it was looked at
  // Keys not handed off yet -> first position: a few at most, none while live, so a vector that
  // holds nothing while empty rather than a map (48 B per socket).
  std::vector<std::pair<std::string, uint64_t>> blocked_;
  bool is_blocked(const std::string& key) const {
    return std::any_of(blocked_.begin(), blocked_.end(), [&](const auto& b) { return b.first == key; });
  }
  bool awaiting_decision_ = false;
  struct Answered {
    std::string key, channel;
    bool allowed;
  };
  std::unique_ptr<Answered> answered_;  // (heap: only while a pass waits for a decision)
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
  std::chrono::steady_clock::time_point last_progress_at_{};
};

}  // namespace outlive::session
