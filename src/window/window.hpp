#pragma once
// The replica's window of an app's topic: the latest updates (at most 5,000 and 32 MiB), filled
// from the stream at start and followed live (SPEC 5.6). Shared by every socket of the replica.
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "topic/cursor.hpp"

namespace outlive::window {

// resync: an oversized update ({"resync":"oversized"}); disconnect: an events.disconnect (SPEC 2.6
// rev 4), one of the 64 copies written into every partition, never kept in the window; gap: not
// read from the topic but made by AppWindow when the update at `position` failed to reach the
// delivery (the topic thread's error policy), never kept in the window, its lost_through is
// `position`: the readers short of it resync.
enum class Kind { data, access, resync, disconnect, gap };

// An events.disconnect as read from the topic: its 64 copies share `id`.
struct Disconnect {
  std::string id;
  std::string viewer;  // ends this viewer id and the ids under it (common/viewer_id.hpp)
  std::string reason;
  int64_t at_ms = 0;   // when it was written (Postgres's clock, unix milliseconds)
};

// One update as read from the topic, parsed once. `data_json` is the JSON text of "d", serialised
// once and shared by every socket that sends it.
struct Update {
  uint64_t position = 0;
  std::string key;
  Kind kind = Kind::data;
  bool access = false;  // an access update (SPEC 2.3); may also carry data in later versions
  std::shared_ptr<const std::string> data_json;  // null unless kind == data
  std::shared_ptr<const Disconnect> disconnect;  // null unless kind == disconnect
  int64_t created_at_us = 0;  // commit time (Outlive-Created-At header), 0 if unknown
  // Non-zero when the topic positions after the previous update up to this one's lost_through
  // were gone before this replica read them (the stream's retention discarded them while the
  // replica was behind): every subscription short of it receives resync (SPEC 1, no silent gap).
  uint64_t lost_through = 0;
  size_t bytes() const;  // what it costs the window's byte budget

  // The update frame's shared part at the update's own cursor (key, cursor, data), built once
  // before the update is shared (window::Sink::prepare) and sent as is by every socket, live or
  // catching up; null for updates without data.
  std::shared_ptr<const std::string> tail;
  // The data's top-level fields that are scalars (an object; empty when the data is not an
  // object), what subscription filters compare with (SPEC 5.2 rev 3). Parsed once, by the first
  // socket with a filter that looks at the update: updates no filter looks at cost nothing. Not
  // counted in bytes(): at most the size of the data, and only while a filter needs it. Lives as
  // long as the update.
  const nlohmann::json& scalar_fields() const;

 private:
  struct Fields {  // a copy parses its own; set once, owned here (a plain load per socket, no
                   // refcount)
    mutable std::atomic<const nlohmann::json*> fields{nullptr};
    Fields() = default;
    Fields(const Fields&) {}
    Fields& operator=(const Fields&) { return *this; }
    ~Fields();
  } fields_;
};

using UpdatePtr = std::shared_ptr<const Update>;

// Parses a topic message (the envelope JSON) at `position`. nullopt for a message that is not an
// outlive envelope (it is skipped, and logged by the caller).
std::optional<Update> parse_envelope(uint64_t position, std::string_view envelope_json,
                                     int64_t created_at_us = 0);

// Where an app's updates go, on the topic reader's thread, in topic order, the fill included
// (updates before ready() are the fill): the app's delivery (fanout::AppDelivery).
class Sink {
 public:
  // Before the update is shared (it is immutable from then on): what every reader of it will
  // share is derived here once (Update::tail). `identity` is the topic's, read by start().
  virtual void prepare(Update& update, const topic::TopicIdentity& identity) = 0;
  // After it is in the window.
  virtual void push(const UpdatePtr& update) = 0;

 protected:
  ~Sink() = default;
};

struct Limits {
  size_t max_updates = 5000;
  size_t max_bytes = 32u * 1024 * 1024;
};

// Thread-safe: one reader appends, any socket reads.
class Window {
 public:
  explicit Window(Limits limits = {});

  // Appends an update with a position above every other; evicts the oldest beyond the limits.
  void append(UpdatePtr update);
  // Marks the topic's position as `position` without an update (a skipped or deleted sequence).
  void advance_to(uint64_t position);
  // The topic's positions up to `position` that are not here are gone (its retention discarded
  // them before they were read): no cursor before `position` is replayable any more.
  void lose_through(uint64_t position);
  // Empties the window and makes `position` both its head and its oldest replayable cursor: the
  // window holds everything after it (it is filled from position + 1 on). For a window that does
  // not start at the topic's first message.
  void start_at(uint64_t position);

  // The last position the window has seen (0 before anything).
  uint64_t head() const;
  // Positions strictly after `oldest_replayable()` can be replayed: a cursor c is inside the window
  // when oldest_replayable() <= c <= head().
  uint64_t oldest_replayable() const;
  // Every update with position > after (in order), or nullopt when `after` is older than the
  // window.
  std::optional<std::vector<UpdatePtr>> since(uint64_t after) const;
  // The same, at most `max_count` of them (a reader catching up takes the window piece by piece).
  std::optional<std::vector<UpdatePtr>> since(uint64_t after, size_t max_count) const;

  size_t size() const;
  size_t bytes() const;

 private:
  void evict_locked();
  Limits limits_;
  mutable std::mutex mutex_;
  std::deque<UpdatePtr> updates_;
  size_t bytes_ = 0;
  uint64_t head_ = 0;
  uint64_t floor_ = 0;  // the window holds everything after floor_
};

}  // namespace outlive::window
