#pragma once
// The deadlines of one io thread's connections (ping, idle, stall, close, the protocol's) on one
// timer, a wheel of slots a tick apart. A timer per connection costs the timer itself, the wait's
// handler and a place in Asio's timer heap: about 300 bytes per idle socket, which every socket
// keeps since its next ping is always due. Here a connection costs one entry (32 bytes).
// Deadlines fire up to a tick late, and a deadline further away up to 1/32 of its distance late
// (at most 320 ms): far deadlines of many connections (pings every 25 s, idle timeouts) share a
// slot, so they fire together. The timer sleeps until the next slot that holds anything instead of
// waking every tick: an io thread with 2,500 idle sockets wakes a few times a second, not 200.
// When Target names a `DeadlineScope` type, one is open while a slot's deadlines fire (the
// connection's: its pings leave in one batch, ws/send_batch.hpp).
// One per io_context (an Asio service: DeadlineWheel::of(executor)), used on that context's thread
// only, except disarm(). Target is the connection: target.on_deadline_entry(generation).
#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include <algorithm>
#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/execution/context.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/query.hpp>
#include <boost/asio/steady_timer.hpp>
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
  static constexpr size_t kSlots = Slots;       // one turn of the wheel: 10.24 s by default
  static constexpr int64_t kMaxCoalesce = 64;  // ticks: 320 ms

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
    const auto now = Clock::now();
    if (!turning_) next_tick_ = tick_of(now);
    const int64_t tick = std::max(coalesced_tick(at, now), next_tick_);
    slots_[static_cast<size_t>(tick) % kSlots].push_back(Entry{tick, target, generation});
    ++entries_;
    if (!turning_ || tick < wake_tick_) sleep_until(tick);
  }
  // Any thread (a connection may be destroyed anywhere).
  void disarm() { armed_.fetch_sub(1, std::memory_order_relaxed); }

  size_t entries() const { return entries_; }  // stale ones included
  bool turning() const { return turning_; }
  uint64_t wakeups() const { return wakeups_; }  // the timer's, since the wheel was made

 private:
  struct Entry {
    int64_t tick;  // fires once this tick has passed
    std::weak_ptr<Target> target;
    uint32_t generation;
  };

  static int64_t tick_of(Clock::time_point at) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(at.time_since_epoch()).count() /
           kTick.count();
  }
  // The tick `at` falls in, rounded up to a multiple of a power of two no more than 1/32 of the
  // distance (so deadlines far away land on the same few ticks).
  static int64_t coalesced_tick(Clock::time_point at, Clock::time_point now) {
    const int64_t tick = tick_of(at);
    const int64_t slack = (tick - tick_of(now)) / 32;
    int64_t step = 1;
    while (step * 2 <= std::min(slack, kMaxCoalesce)) step *= 2;
    return (tick + step - 1) / step * step;
  }

  void shutdown() override {
    shut_down_ = true;
    timer_.reset();
    slots_.assign(kSlots, {});
    entries_ = 0;
  }

  // The timer ends when `tick` has passed. Moving it cancels the wait it replaces.
  void sleep_until(int64_t tick) {
    turning_ = true;
    wake_tick_ = tick;
    if (!timer_) timer_.emplace(io_);
    timer_->expires_at(Clock::time_point((tick + 1) * kTick));
    timer_->async_wait([this, tick](boost::system::error_code ec) {
      if (!ec && tick == wake_tick_) on_tick();
    });
  }

  void on_tick() {
    ++wakeups_;
    // Every tick that has passed, also those a busy thread missed (a whole turn at most). A
    // tick's slot holds its own deadlines and those of later turns, which stay.
    const int64_t last = std::min(tick_of(Clock::now()) - 1, next_tick_ + int64_t(kSlots) - 1);
    for (; next_tick_ <= last; ++next_tick_) {
      auto& slot = slots_[static_cast<size_t>(next_tick_) % kSlots];
      if (slot.empty()) continue;
      size_t kept = 0;
      for (auto& e : slot) {
        if (e.tick <= next_tick_) {
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
    fire_due();
    if (armed_.load(std::memory_order_relaxed) <= 0) {
      // Nothing armed: what is left is stale. The wheel rests until the next add().
      turning_ = false;
      for (auto& slot : slots_) std::vector<Entry>().swap(slot);
      entries_ = 0;
      return;
    }
    // The next slot that holds anything (its entries may belong to a later turn: then it is
    // looked at again a turn later), the deadlines that fired above and armed again included.
    int64_t tick = next_tick_;
    while (tick < next_tick_ + int64_t(kSlots) - 1 &&
           slots_[static_cast<size_t>(tick) % kSlots].empty())
      ++tick;
    sleep_until(tick);
  }

  void fire_due() {
    if (due_.empty()) return;
    auto fire = [this] {
      for (auto& e : due_) {
        if (auto t = e.target.lock()) t->on_deadline_entry(e.generation);
      }
    };
    if constexpr (requires { typename Target::DeadlineScope; }) {
      typename Target::DeadlineScope scope;
      fire();
    } else {
      fire();
    }
    due_.clear();
  }

  boost::asio::io_context& io_;
  std::optional<boost::asio::steady_timer> timer_;
  std::vector<std::vector<Entry>> slots_;
  std::vector<Entry> due_;  // reused by on_tick()
  int64_t next_tick_ = 0;   // the first tick not processed yet (ticks since the clock's epoch)
  int64_t wake_tick_ = 0;   // the tick the timer waits for
  uint64_t wakeups_ = 0;
  size_t entries_ = 0;
  std::atomic<int64_t> armed_{0};
  bool turning_ = false;
  bool shut_down_ = false;
};

}  // namespace outlive::ws
