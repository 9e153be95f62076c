#pragma once
// What the dispatcher hands to a reader (a socket) and the interface it hands it through. The
// fan-out side knows nothing of websockets: a reader is anything that takes deliveries.
#include <atomic>
#include <boost/container/small_vector.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/viewer_id.hpp"
#include "window/window.hpp"

namespace outlive::fanout {

struct HubEntry;  // the hub's record of a reader (Hub::ReaderRef)

// A socket's viewer once admitted: the id and the object handed to keys() and authorize(), in one
// allocation the socket and the hub's followers share.
struct Viewer {
  std::string id;
  std::string json;
};

// An update as the dispatcher hands it out: built once, shared by every reader that follows its
// key. `tail` is the frame's shared part (key, cursor, data), null for updates without data.
struct OutgoingUpdate {
  window::UpdatePtr update;
  std::shared_ptr<const std::string> tail;
  std::string cursor;
  uint64_t cursor_position = 0;  // the position `cursor` names
};

// A viewer's access to the update's key, per channel it follows the key through (usually one).
using ChannelAccess = boost::container::small_vector<std::pair<std::string, bool>, 2>;

// An update handed to one reader, or (out null) word that the topic lost positions up to
// `lost_through` before the replica read them (window::Update::lost_through): every subscription
// short of it resyncs before anything after it arrives.
struct Delivery {
  std::shared_ptr<const OutgoingUpdate> out;
  ChannelAccess allowed;
  bool broken = false;  // authorize failed or timed out for this viewer: close 1011 instead
  uint64_t lost_through = 0;
};

// What a progress tick tells the readers it visits: everything of the app up to `position` has
// been handed off. `frame` is the tab's progress frame at that position, serialized once and
// shared by every reader that sends it as it is (a reader catching up names a position of its own).
struct ProgressTick {
  uint64_t position = 0;
  std::shared_ptr<const std::string> frame;
  // When the tick was due on the dispatcher's thread: ticks are a second apart there, however
  // late a socket's io thread handles one (its "at most once a second" counts in these).
  std::chrono::steady_clock::time_point at = std::chrono::steady_clock::now();
};

// A reader of live updates. A reader lives on one thread of its own (a socket's io thread): offer()
// is called from the dispatcher's thread, take() and progress() on the reader's own.
class Reader {
 public:
  virtual ~Reader() = default;
  // This reader's part of a round, in topic order per key: with it, every update up to `through`
  // that the reader follows has been offered. A reader that is catching up from the window
  // ignores it (it reads those updates from the window). True when take() must be run on the
  // reader's thread (DeliveryHost::take); false while a take() is scheduled already.
  virtual bool offer(std::vector<Delivery>&& deliveries, uint64_t through) = 0;
  // On the reader's thread: sends what offer() left.
  virtual void take() = 0;
  // On the reader's thread: everything of the app up to `tick.position` has been handed to
  // readers (progress frames).
  virtual void progress(const ProgressTick& tick) = 0;
  // keys() again for the reader's collections (after an access update, and every minute).
  virtual void refresh_collections() = 0;
  // The replica stops: close with 1012.
  virtual void shut_down() = 0;
  // An events.disconnect at `position` names this reader's viewer (SPEC 2.6 rev 4). On the
  // dispatcher's thread, before any update after `position` is handed off: none of them reaches
  // the tab, live or from the window.
  virtual void end_after(uint64_t position) = 0;
  // On the reader's thread, once every update before the disconnect was offered: sends what it
  // was offered of them, then error `unauthorized` with `reason` and close 1008.
  virtual void disconnect(const std::string& reason) = 0;

  // Any thread: the viewer id an events.disconnect of `named` ends (common/viewer_id.hpp); false
  // until the reader's credential is known.
  bool viewed_by(std::string_view named) const;

  // The position up to which progress() has nothing to do: the tab was told it, every
  // subscription was brought to it and nothing offered up to it waits. The progress tick skips a
  // reader settled at its app's hand-off (Hub::unsettled_readers), so a socket that received its
  // updates live costs the tick nothing. Any thread; 0 when unknown.
  uint64_t settled() const { return settled_.load(std::memory_order_acquire); }

 protected:
  void settle(uint64_t position) {
    if (position > settled_.load(std::memory_order_relaxed))
      settled_.store(position, std::memory_order_release);
  }
  // Leaving live delivery, or a subscription changed: the tick visits it again.
  void unsettle() { settled_.store(0, std::memory_order_release); }
  // Once its credential is known (the reader's thread). `viewer` outlives the reader: its owner
  // holds it, and it does not change once set (a refreshed token names the same viewer).
  void set_viewer(const Viewer* viewer) { viewer_.store(viewer, std::memory_order_release); }

 private:
  friend class Round;
  friend class Hub;
  // The round's bookkeeping, on its dispatcher's thread only (a reader is of one app, so of one
  // dispatcher): the round it was last put in and its place in that round. A map from reader to
  // place cost a node per reader per round.
  uint64_t round_ = 0;
  uint32_t slot_ = 0;
  // The hub's entry for this reader (Hub::ReaderRef), under the hub's lock: a socket that leaves a
  // key finds its place without a lookup.
  HubEntry* hub_entry_ = nullptr;
  std::atomic<uint64_t> settled_{0};
  // A disconnect reads it on the dispatcher's thread (a pointer, not a copy of the id under a
  // mutex: 72 B of every socket).
  std::atomic<const Viewer*> viewer_{nullptr};
};

inline bool Reader::viewed_by(std::string_view named) const {
  const Viewer* viewer = viewer_.load(std::memory_order_acquire);
  return viewer != nullptr && viewer_named_by(viewer->id, named);
}

}  // namespace outlive::fanout
