#pragma once
// The deadlines of one io thread's connections (ping, idle, stall, close, the protocol's) on one
// timer, a wheel of slots a tick apart. A timer per connection costs the timer itself, the wait's
// handler and a place in Asio's timer heap: about 300 bytes per idle socket, which every socket
// keeps since its next ping is always due. Here a connection costs one entry (32 bytes).
// Deadlines fire up to a tick late; every deadline here is milliseconds to minutes away.
// One per io_context (an Asio service: DeadlineWheel::of(executor)), used on that context's thread
// only, except disarm(). Target is the connection: target.on_deadline_entry(generation).
#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/execution/context.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/query.hpp>
#include <boost/asio/steady_timer.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace outlive::ws {

template <class Target, size_t Slots = 2048>
class DeadlineWheel : public boost::asio::execution_context::service {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kTick{5};
  static constexpr size_t kSlots = Slots;  // one turn of the wheel: 10.24 s by default

  static inline boost::asio::execution_context::id id;
  explicit DeadlineWheel(boost::asio::execution_context& context)
      : boost::asio::execution_context::service(context),
        io_(static_cast<boost::asio::io_context&>(context)),
        slots_(kSlots) {}
  // The wheel of the io_context that runs `executor`.
  static DeadlineWheel& of(const boost::asio::any_io_executor& executor) {
    return boost::asio::use_service<DeadlineWheel>(
        boost::asio::query(executor, boost::asio::execution::context));
  }

  // Calls target->on_deadline_entry(generation) once `at` passed, unless the target is gone.
  // The target counts what it armed: every add() is matched by one disarm(), when the entry
  // fired, was replaced by another, or the target finished or was destroyed. The wheel stops
  // turning while nothing is armed.
  void add(Clock::time_point at, const std::shared_ptr<Target>& target, uint32_t generation) {
    armed_.fetch_add(1, std::memory_order_relaxed);
    if (shut_down_) return;
    if (!turning_) next_tick_ = tick_of(Clock::now());
    slots_[slot_of(at)].push_back(Entry{at, target, generation});
    ++entries_;
    if (!turning_) turn();
  }
  // Any thread (a connection may be destroyed anywhere).
  void disarm() { armed_.fetch_sub(1, std::memory_order_relaxed); }

  size_t entries() const { return entries_; }  // stale ones included
  bool turning() const { return turning_; }

 private:
  struct Entry {
    Clock::time_point at;
    std::weak_ptr<Target> target;
    uint32_t generation;
  };

  static int64_t tick_of(Clock::time_point at) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(at.time_since_epoch()).count() /
           kTick.count();
  }
  // Never behind the tick being processed: a deadline already passed fires at the next tick.
  size_t slot_of(Clock::time_point at) const {
    return static_cast<size_t>(std::max(tick_of(at), next_tick_)) % kSlots;
  }

  void shutdown() override {
    shut_down_ = true;
    timer_.reset();
    slots_.assign(kSlots, {});
    entries_ = 0;
  }

  void turn() {
    turning_ = true;
    if (!timer_) timer_.emplace(io_);
    timer_->expires_at(Clock::time_point((next_tick_ + 1) * kTick));
    timer_->async_wait([this](boost::system::error_code ec) {
      if (!ec) on_tick();
    });
  }

  void on_tick() {
    const auto now = Clock::now();
    // Every tick that has passed, also those a busy thread missed (a whole turn at most). A
    // tick's slot holds its own deadlines and those of later turns, which stay.
    const int64_t last = std::min(tick_of(now) - 1, next_tick_ + int64_t(kSlots) - 1);
    for (; next_tick_ <= last; ++next_tick_) {
      auto& slot = slots_[static_cast<size_t>(next_tick_) % kSlots];
      size_t kept = 0;
      for (auto& e : slot) {
        if (e.at <= now) {
          due_.push_back(std::move(e));
        } else {
          // A later turn's. (Not moved onto itself: a weak_ptr moved onto itself is emptied.)
          if (&slot[kept] != &e) slot[kept] = std::move(e);
          ++kept;
        }
      }
      entries_ -= slot.size() - kept;
      slot.resize(kept);
      if (slot.empty()) std::vector<Entry>().swap(slot);
    }
    for (auto& e : due_) {
      if (auto t = e.target.lock()) t->on_deadline_entry(e.generation);
    }
    due_.clear();
    if (armed_.load(std::memory_order_relaxed) <= 0) {
      // Nothing armed: what is left is stale. The wheel rests until the next add().
      turning_ = false;
      for (auto& slot : slots_) std::vector<Entry>().swap(slot);
      entries_ = 0;
      return;
    }
    turn();
  }

  boost::asio::io_context& io_;
  std::optional<boost::asio::steady_timer> timer_;
  std::vector<std::vector<Entry>> slots_;
  std::vector<Entry> due_;  // reused by on_tick()
  int64_t next_tick_ = 0;   // the first tick not processed yet (ticks since the clock's epoch)
  size_t entries_ = 0;
  std::atomic<int64_t> armed_{0};
  bool turning_ = false;
  bool shut_down_ = false;
};

}  // namespace outlive::ws
