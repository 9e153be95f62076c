#pragma once
// Follows an app's stream: delivers every message from a sequence on, in stream order, exactly
// once each, across reconnects and nats-server restarts. nats.c stays in follower.cpp.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "topic/client.hpp"

namespace outlive::topic {

class Follower {
 public:
  // `created_at_us` is the Outlive-Created-At header (microseconds since the epoch), 0 if absent.
  using Handler = std::function<void(const StoredMessage&, int64_t created_at_us)>;

  // Starts a thread that calls `handler` for every message of `app_id`'s stream with a sequence
  // >= `from_sequence` (0 counts as 1), in order, once each, and keeps following the stream as it
  // grows. Messages the stream no longer holds (deleted by its limits) are skipped. The handler
  // runs on that one thread; it should not throw (an exception is logged, counted as a topic thread
  // failure, and the message counts as delivered: the handler owns what that means for the data). `client` must outlive the Follower.
  Follower(Client& client, const std::string& app_id, uint64_t from_sequence, Handler handler);
  // Stops following; once it returns the handler is not running and will not run again. Must not
  // be called from the handler.
  ~Follower();
  Follower(const Follower&) = delete;
  Follower& operator=(const Follower&) = delete;

  // The sequence the next delivered message will have at least (the last delivered + 1).
  uint64_t next_sequence() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace outlive::topic
