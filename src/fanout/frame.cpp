#include "fanout/frame.hpp"

#include <algorithm>
#include <optional>

#include "access/decider.hpp"
#include "tab/protocol.hpp"

namespace outlive::fanout {

namespace {
std::shared_ptr<const std::string> tail_at(const window::Update& u, const std::string& cursor) {
  if (u.kind != window::Kind::data || !u.data_json) return nullptr;
  return std::make_shared<const std::string>(tab::frames::update_tail(u.key, cursor, *u.data_json));
}

const std::string& name_of(const std::string& channel) { return channel; }
const std::string& name_of(const std::string* channel) { return *channel; }

template <class Channels>
size_t read_access_of(const DecisionLookup& at, const std::string& key, const Channels& channels,
                      const std::string& viewer_id, Access& into) {
  // Scratch of the thread (the dispatcher's, or an io thread): no allocation per decision.
  thread_local std::string id;
  size_t first_missing = kNoneMissing;
  size_t i = 0;
  for (const auto& c : channels) {
    const std::string& channel = name_of(c);
    std::optional<bool> decision;
    if (at.answered && at.answered->key == key && at.answered->channel == channel) {
      decision = at.answered->allowed;
    } else if (!at.none_held) {
      access::Decider::decision_id_into(id, at.app, channel, viewer_id);
      auto until = access::Decisions::Clock::time_point::max();
      decision = at.decisions.get(key, id, at.now, &until);
      if (at.expires) *at.expires = std::min(*at.expires, until);
    }
    into.allowed.emplace_back(channel, decision.value_or(false));
    if (!decision) {
      if (i < 32) into.missing |= 1u << i;
      first_missing = std::min(first_missing, i);
    }
    ++i;
  }
  return first_missing;
}
}  // namespace

void prepare(window::Update& update, const topic::TopicIdentity& identity) {
  update.tail = tail_at(update, topic::Cursor::at(identity, update.position).encode());
}

OutgoingUpdate outgoing(const window::UpdatePtr& update, uint64_t limit,
                        const topic::TopicIdentity& identity) {
  const uint64_t at = std::min(update->position, limit);
  OutgoingUpdate out;
  out.update = update;
  out.cursor = topic::Cursor::at(identity, at).encode();
  out.cursor_position = at;
  out.tail = at == update->position && update->tail ? update->tail : tail_at(*update, out.cursor);
  return out;
}

size_t read_access(const DecisionLookup& at, const std::string& key,
                   const std::vector<std::string>& channels, const std::string& viewer_id,
                   Access& into) {
  return read_access_of(at, key, channels, viewer_id, into);
}

size_t read_access(const DecisionLookup& at, const std::string& key,
                   const boost::container::small_vector<const std::string*, 1>& channels,
                   const std::string& viewer_id, Access& into) {
  return read_access_of(at, key, channels, viewer_id, into);
}

}  // namespace outlive::fanout
