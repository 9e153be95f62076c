#pragma once
// Which of an app's updates its dispatcher has started to hand to the live readers. A reader
// catching up from the window sends only those, deciding its own access (their decisions exist by
// then): one not handed off yet will reach it live, so it is never both skipped and missed. Kept
// here, by the dispatcher, rather than as a flag on the window's updates: an update carries no
// delivery state.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>

namespace outlive::fanout {

class HandOffs {
 public:
  // The dispatcher's thread, in topic order: `position` was taken and waits in its key's lane.
  void taken(uint64_t position) {
    std::lock_guard lock(mutex_);
    taken_ = position;
    waiting_.push_back(position);
    publish_locked();
  }
  // The dispatcher's thread: handing `position` off begins, before any reader of it is looked at
  // (a reader that rejoins live meanwhile finds it handed off, or receives it live).
  void handed(uint64_t position) {
    std::lock_guard lock(mutex_);
    const auto it = std::lower_bound(waiting_.begin(), waiting_.end(), position);
    if (it == waiting_.end() || *it != position) return;
    waiting_.erase(it);
    publish_locked();
  }
  // The dispatcher's thread, after an exception there (its error policy): every position up to
  // `position` counts as handed off; the live readers were told to resync at it, and a reader
  // catching up sends those updates from the window itself.
  void abandon_through(uint64_t position) {
    std::lock_guard lock(mutex_);
    taken_ = std::max(taken_, position);
    while (!waiting_.empty() && waiting_.front() <= position) waiting_.pop_front();
    publish_locked();
  }
  // Any thread. Usually one atomic load: only an update above a key still waiting for its
  // authorize() takes the lock.
  bool handed_off(uint64_t position) const {
    if (position <= through_.load(std::memory_order_seq_cst)) return true;
    std::lock_guard lock(mutex_);
    return position <= taken_ && !std::binary_search(waiting_.begin(), waiting_.end(), position);
  }

 private:
  void publish_locked() {
    through_.store(waiting_.empty() ? taken_ : waiting_.front() - 1, std::memory_order_seq_cst);
  }

  mutable std::mutex mutex_;
  std::deque<uint64_t> waiting_;  // taken and not handed off, ascending (mostly one or none)
  uint64_t taken_ = 0;
  std::atomic<uint64_t> through_{0};  // every position up to it is handed off
};

}  // namespace outlive::fanout
