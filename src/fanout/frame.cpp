#include "fanout/frame.hpp"

#include <algorithm>

#include "ws/protocol.hpp"

namespace outlive::fanout {

namespace {
std::shared_ptr<const std::string> tail_at(const window::Update& u, const std::string& cursor) {
  if (u.kind != window::Kind::data || !u.data_json) return nullptr;
  return std::make_shared<const std::string>(ws::frames::update_tail(u.key, cursor, *u.data_json));
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
  out.tail = at == update->position && update->tail ? update->tail : tail_at(*update, out.cursor);
  return out;
}

}  // namespace outlive::fanout
