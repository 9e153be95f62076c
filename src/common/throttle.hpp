#pragma once
// At most `limit` jobs hold a slot at once; the others wait in order. Work that thousands of
// sockets ask for at the same moment (keys() for every collection after an access update, and
// every minute) goes to the database pool a few at a time instead of overflowing its bounded
// queue (SPEC 5.8), where each refused task would close its socket with 1011.
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>

namespace outlive {

class Throttle {
 public:
  // Held by a job's work; given back when its last copy goes (the work finished, or was dropped
  // with every callback that held it), which starts the next waiting job.
  using Slot = std::shared_ptr<void>;
  using Job = std::function<void(Slot)>;

  explicit Throttle(size_t limit) : state_(std::make_shared<State>(limit ? limit : 1)) {}

  // Runs `job` at once on this thread when a slot is free, otherwise on the thread that gives one
  // back. A job must not block (it usually posts its work to its own thread). After stop(), jobs
  // are dropped.
  void run(Job job) {
    {
      std::lock_guard lock(state_->mutex);
      if (state_->stopped) return;
      if (state_->running >= state_->limit) {
        state_->waiting.push_back(std::move(job));
        return;
      }
      ++state_->running;
    }
    job(slot_of(state_));
  }

  // Drops the waiting jobs (outside the lock: they may hold the last reference to their owner);
  // slots given back later start nothing.
  void stop() {
    std::deque<Job> dropped;
    std::lock_guard lock(state_->mutex);
    state_->stopped = true;
    dropped.swap(state_->waiting);
  }

  size_t running() const {
    std::lock_guard lock(state_->mutex);
    return state_->running;
  }
  size_t waiting() const {
    std::lock_guard lock(state_->mutex);
    return state_->waiting.size();
  }

 private:
  struct State {
    explicit State(size_t l) : limit(l) {}
    mutable std::mutex mutex;
    const size_t limit;
    size_t running = 0;
    bool stopped = false;
    std::deque<Job> waiting;
  };

  // (the deleter holds the state: a slot may outlive the throttle, e.g. in a pool task)
  static Slot slot_of(const std::shared_ptr<State>& state) {
    return Slot(static_cast<void*>(nullptr), [state](void*) { give_back(state); });
  }

  static void give_back(const std::shared_ptr<State>& state) {
    Job next;
    {
      std::lock_guard lock(state->mutex);
      if (state->stopped || state->waiting.empty()) {
        --state->running;
        return;
      }
      next = std::move(state->waiting.front());
      state->waiting.pop_front();
    }
    next(slot_of(state));  // the slot passes to it: running stays the same
  }

  std::shared_ptr<State> state_;
};

}  // namespace outlive
