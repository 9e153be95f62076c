#pragma once
// One update as a reader is sent it, live (the dispatcher) or catching up from the window (a
// socket's Feed): the frame's cursor, clamped below updates of other keys not sent yet, and its
// shared tail. Both paths build frames here and nowhere else.
#include <cstdint>

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

}  // namespace outlive::fanout
