#pragma once
// A cursor is an opaque ASCII string (at most 64 characters) naming a position in one topic: the
// app, the stream instance (its creation time) and the stream sequence (SPEC 4).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace outlive::topic {

struct TopicIdentity {
  std::string app_id;
  int64_t instance = 0;  // the stream's creation time (ns); a recreated stream differs
};

struct Cursor {
  uint32_t app_hash = 0;
  int64_t instance = 0;
  uint64_t position = 0;

  static Cursor at(const TopicIdentity& topic, uint64_t position);
  bool belongs_to(const TopicIdentity& topic) const;
  std::string encode() const;
  // nullopt for anything that is not a cursor we wrote (wrong length, alphabet, version, check).
  static std::optional<Cursor> decode(std::string_view text);
};

constexpr size_t kMaxCursorLength = 64;

}  // namespace outlive::topic
