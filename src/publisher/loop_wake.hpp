#pragma once
// How the publisher's loop waits (docs/ARCHITECTURE.md "The publisher loop"): in poll() on an
// eventfd that other threads signal (acks, deletes, the stop) and on a LISTEN connection of its
// own, so a wake reaches the loop with no hop through another thread (which on a busy machine can
// take milliseconds). Everything runs on the loop's thread except signal() and interrupt().
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/outage_log.hpp"
#include "common/clock.hpp"
#include "common/socket_slot.hpp"

namespace outlive::outbox {
class WakeConnection;
}

namespace outlive::publisher {

class LoopWake {
 public:
  LoopWake(std::string database_url, const Clock& clock);
  ~LoopWake();
  LoopWake(const LoopWake&) = delete;
  LoopWake& operator=(const LoopWake&) = delete;

  // Any thread: the loop runs again.
  void signal();
  // Any thread: a round trip on the LISTEN connection (UNLISTEN at close) fails at once.
  void interrupt() { slot_.interrupt(); }
  // Before the loop starts again.
  void reset() { slot_.reset(); }

  // LISTENs when it does not, at most one attempt a second (the loop passes after every ack, and
  // a server out of connections would otherwise be asked, and logged, at that rate). True when
  // it has just begun: whatever committed while nobody listened is to be read.
  bool listen();
  // Until signal(), a notification or `timeout`: the apps woken (their payloads). A lost LISTEN
  // connection is logged and made again by the next listen(); the poll covers the wakes meanwhile.
  std::vector<std::string> wait(Clock::duration timeout);
  // poll()'s timeout for `timeout`: whole milliseconds, rounded up. Truncated, a deadline less
  // than a millisecond away was a timeout of 0, and the loop turned on it until it passed: with
  // acks waiting to be settled, the last millisecond of every 20 ms settle interval, some 11,000
  // turns a second at 2,000 updates/s (docs/CAPACITY.md "A key per user").
  static int poll_timeout_ms(Clock::duration timeout);
  // UNLISTEN and close (a round trip).
  void close();

 private:
  const std::string url_;
  const Clock& clock_;
  const int event_fd_;
  SocketSlot slot_;
  std::unique_ptr<outbox::WakeConnection> conn_;
  Clock::time_point next_attempt_{};
  // Lost, retried every second: one line, a repeat every 10 s, one when it listens again.
  log::OutageLog outage_{"publisher: wake listener"};
};

}  // namespace outlive::publisher
