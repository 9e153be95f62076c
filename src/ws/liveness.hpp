#pragma once
// The clocks that keep a websocket connection honest, pure (the time is given): a ping every
// ping_interval, a drop after idle_timeout of silence (1001), a drop after stall_timeout with
// frames waiting and no byte taken by the kernel (1013), the end of a close the tab never answers,
// and the protocol's one deadline. The connection waits for next() on its thread's deadline wheel
// and asks, when it fires, which of them is due.
#include <algorithm>
#include <chrono>
#include <cstddef>

namespace outlive::ws {

struct ConnectionSettings {
  std::chrono::milliseconds ping_interval{25000};
  std::chrono::milliseconds idle_timeout{60000};
  std::chrono::milliseconds stall_timeout{30000};  // frames wait and the kernel takes nothing
  // Our close waits this long for the tab's answer, then TCP is closed (SPEC 5.7 rev 3: 5 s).
  std::chrono::milliseconds close_timeout{5000};
  int max_waiting_messages = 24;
  // While this much waits to be sent the socket is not read (SPEC 5.7 rev 3): a tab that writes
  // and never reads cannot grow our queue with the replies to its own messages; it costs this
  // and the kernel's buffers, and TCP pushes back on it. Reading resumes at half.
  size_t read_pause_bytes = 768 * 1024;
};

class Liveness {
 public:
  using Clock = std::chrono::steady_clock;
  // Unset deadlines (an optional would double each).
  static constexpr Clock::time_point kNever = Clock::time_point::max();

  explicit Liveness(const ConnectionSettings& settings) : settings_(settings) {}

  void start(Clock::time_point now) { last_received_ = last_ping_ = last_taken_ = now; }
  void received(Clock::time_point now) { last_received_ = now; }  // the tab sent bytes
  void taken(Clock::time_point now) { last_taken_ = now; }        // the kernel took bytes
  // Our close went into the queue: the tab has close_timeout to answer.
  void closing(Clock::time_point now) { close_deadline_ = now + settings_.close_timeout; }
  void set_deadline(Clock::time_point at) { deadline_ = at; }  // the protocol's
  void clear_deadline() { deadline_ = kNever; }

  // The earliest of them; `writing`: frames wait for the kernel to take more (the stall counts).
  Clock::time_point next(bool writing) const {
    auto at =
        std::min(last_ping_ + settings_.ping_interval, last_received_ + settings_.idle_timeout);
    if (writing) at = std::min(at, last_taken_ + settings_.stall_timeout);
    return std::min({at, close_deadline_, deadline_});
  }

  // Due at `now`, in the order a connection handles them.
  bool close_unanswered(Clock::time_point now) const { return now >= close_deadline_; }
  bool stalled(Clock::time_point now, bool writing) const {
    return writing && now - last_taken_ >= settings_.stall_timeout;
  }
  // True once, when the protocol's deadline passed (a new one may be set then).
  bool take_deadline(Clock::time_point now) {
    if (now < deadline_) return false;
    deadline_ = kNever;
    return true;
  }
  bool silent(Clock::time_point now) const {
    return now - last_received_ >= settings_.idle_timeout;
  }
  // True when a ping is due; it counts as sent.
  bool take_ping(Clock::time_point now) {
    if (now - last_ping_ < settings_.ping_interval) return false;
    last_ping_ = now;
    return true;
  }

 private:
  const ConnectionSettings& settings_;
  Clock::time_point last_received_{};
  Clock::time_point last_ping_{};
  Clock::time_point last_taken_{};
  Clock::time_point close_deadline_ = kNever;  // then the connection is dropped
  Clock::time_point deadline_ = kNever;        // the protocol's
};

}  // namespace outlive::ws
