#pragma once
// One update as a reader is sent it, live (the dispatcher) or catching up from the window (a
// socket's Feed): the reader's access to the update's key (read_access), the frame's cursor,
// clamped below updates of other keys not sent yet (CursorClamp), and its shared tail. Both paths
// build an update's frame through reader_frame_value() and nowhere else: live shared among the
// update's readers (reader_frame), catching up on the socket's stack.
#include <algorithm>
#include <boost/container/small_vector.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "access/decisions.hpp"
#include "fanout/delivery.hpp"
#include "topic/cursor.hpp"
#include "window/window.hpp"

namespace outlive::fanout {

// Fills `update.tail` at the update's own cursor, once, before it is shared (window::Sink).
void prepare(window::Update& update, const topic::TopicIdentity& identity);

// `update` as sent while the updates of other keys after `limit` are not all sent yet: the frame's
// cursor is the update's own position, or `limit` when that is lower, so a tab that resumes from
// it receives those updates (and this one again, at least once). The tail is the update's shared
// one unless the cursor was clamped.
OutgoingUpdate outgoing(const window::UpdatePtr& update, uint64_t limit,
                        const topic::TopicIdentity& identity);

// A decision authorize() has just given, used before the cache: an access update read meanwhile
// keeps it out of the cache, and it still answers the update it was asked for.
struct Answered {
  std::string key, channel;
  bool allowed = false;
};

// Where a reader's decisions are read: one app's decision cache at one moment.
struct DecisionLookup {
  const access::Decisions& decisions;
  const std::string& app;
  access::Decisions::Clock::time_point now;
  // The key's access update forgot all its decisions: every one is missing, none is looked up.
  bool none_held = false;
  // When set, lowered to the earliest expiry among the decisions read (a hot key's memo).
  access::Decisions::Clock::time_point* expires = nullptr;
  const Answered* answered = nullptr;
};

// A reader's access to one update's key, per channel it follows the key through, in order.
struct Access {
  ChannelAccess allowed;  // a decision not known reads as refused until it is answered
  uint32_t missing = 0;   // bit i: channel i has no decision yet (the first 32 channels)
  bool broken = false;    // authorize() failed or timed out: the reader closes 1011
};

constexpr size_t kNoneMissing = std::numeric_limits<size_t>::max();

// Appends the reader's access through each of `channels` to `into` and returns the index of the
// first channel without a decision (kNoneMissing when every one is known). Channels past the 32nd
// get no bit in `into.missing`: live delivery refuses them rather than asking.
size_t read_access(const DecisionLookup& at, const std::string& key,
                   const std::vector<std::string>& channels, const std::string& viewer_id,
                   Access& into);
size_t read_access(const DecisionLookup& at, const std::string& key,
                   const boost::container::small_vector<const std::string*, 1>& channels,
                   const std::string& viewer_id, Access& into);

// How far a frame's cursor may go: never past an update of another key the reader has not been
// sent yet (a tab that resumes from it then receives that one), and, for an update handed off
// `early` (some of its readers still wait for authorize()), below the update itself, as the frames
// of other keys meanwhile are: a reader's cursors never go back.
class CursorClamp {
 public:
  explicit CursorClamp(bool early = false) : early_(early) {}
  // `first_unsent`: the first update of another key not sent yet.
  void below(uint64_t first_unsent) { limit_ = std::min(limit_, first_unsent - 1); }
  uint64_t cursor_for(uint64_t position) const {
    return std::min(early_ ? position - 1 : position, limit_);
  }

 private:
  bool early_;
  uint64_t limit_ = std::numeric_limits<uint64_t>::max();
};

// The frame of one update for one reader, by value: its cursor clamped by `clamp()` and the tail.
// A socket catching up is the frame's only reader, so it keeps the frame on its stack (one heap
// allocation per frame less); reader_frame() shares the same frame among live readers.
template <class Clamp>
OutgoingUpdate reader_frame_value(const window::UpdatePtr& update, Clamp&& clamp,
                                  const topic::TopicIdentity& identity) {
  const CursorClamp c = clamp();
  return outgoing(update, c.cursor_for(update->position), identity);
}

// One update turned into one reader's delivery: its access (complete), the frame's cursor clamped
// by `clamp()` and the tail. `shared` is the update's frame for all its readers: built by the first
// call, whose clamp holds for the later ones (live: lanes only move forward), so `clamp` runs only
// then.
template <class Clamp>
Delivery reader_frame(const window::UpdatePtr& update, Access&& access, Clamp&& clamp,
                      const topic::TopicIdentity& identity,
                      std::shared_ptr<const OutgoingUpdate>& shared) {
  if (!shared) {
    shared = std::make_shared<const OutgoingUpdate>(
        reader_frame_value(update, std::forward<Clamp>(clamp), identity));
  }
  return Delivery{shared, std::move(access.allowed), access.broken};
}

}  // namespace outlive::fanout
