#pragma once
// What the publisher's loop holds per app and per key (publisher.cpp; one thread, no locks).
#include <chrono>
#include <deque>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.hpp"
#include "outbox/partitions.hpp"
#include "publisher/horizon.hpp"

namespace outlive::publisher {

using SystemTime = std::chrono::system_clock::time_point;

// A row this owner read and holds, with when it was read (Published::read_at).
struct Taken {
  outbox::PendingRow row;
  SystemTime read_at;
};

// What the owner holds of one key. At most one row of a key is in flight. A key is "detached"
// while it backs off or holds a full read of rows (a burst): the partition reads skip it, and its
// rows are read by key, from its oldest pending row, when it is due again.
struct KeyState {
  std::deque<Taken> waiting;
  bool in_flight = false;
  uint64_t token = 0;  // of the publish in flight
  bool detached = false;
  std::optional<Clock::time_point> retry_at;
  int partition = 0;
};

struct AppStats;  // publisher.hpp

struct App {
  std::string id;
  std::string subject;
  std::set<int> owned;  // read and published, as the live leases assign them (sql/006)
  Horizon horizon;
  std::unordered_map<std::string, KeyState> keys;
  std::set<std::string> detached;
  std::set<int64_t> known;    // positions held: waiting, in flight, acked or failed until settled
  int held = 0;               // rows waiting or in flight
  AppStats* stats = nullptr;  // the publisher's, for /metrics
  bool read_now = true;
  Clock::time_point next_read{};

  // The key stops being read with its partition. With `retry_at` (it backs off) what it holds is
  // dropped, to be read again by key when due; without, it holds a full read (a burst).
  void detach(const std::string& key, KeyState& k, std::optional<Clock::time_point> retry_at);
  // Drops what waits in the partitions `dropped` says; a key in flight stays until its answer.
  void drop_waiting(const std::function<bool(int partition)>& dropped);
  // Positions held above `cursor`: a read skips them.
  std::vector<int64_t> known_after(int64_t cursor) const;
};

struct InFlight {
  App* app;
  outbox::PendingRow row;
  Clock::time_point deadline;
  SystemTime read_at;
  SystemTime sent_at;
  uint64_t reconnects;  // the NATS connection's reconnect count just before it was sent
};

}  // namespace outlive::publisher
