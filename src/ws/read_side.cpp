#include "ws/read_side.hpp"

#include <utility>

namespace outlive::ws {

void ReadSide::hold_early(std::string early) {
  if (!early.empty()) early_ = std::make_unique<std::string>(std::move(early));
}

bool ReadSide::feed_early() {
  if (!early_) return false;
  const auto early = std::move(early_);
  reader_.feed(early->data(), early->size());
  return true;
}

// At most max_waiting_messages wait; beyond that the socket is not read until there is room (the
// rest stays in the kernel, or in reader_): TCP pushes back on the tab.
bool ReadSide::room(size_t queued_bytes) {
  if (closed_) return true;
  if (queued_bytes >= settings_.read_pause_bytes) {
    paused_ = true;
    return false;
  }
  return static_cast<int>(inbox_.size()) < settings_.max_waiting_messages;
}

bool ReadSide::resume_due(size_t queued_bytes) {
  if (!paused_ || queued_bytes > settings_.read_pause_bytes / 2) return false;
  paused_ = false;
  return true;
}

std::optional<Incoming> ReadSide::take(size_t queued_bytes) {
  while (room(queued_bytes)) {
    auto in = reader_.next();
    if (!in) return std::nullopt;
    switch (in->kind) {
      case Incoming::Kind::text:
        if (!closed_) inbox_.push_back(std::move(in->payload));
        break;
      case Incoming::Kind::binary:
        if (!closed_) inbox_.push_back(std::nullopt);  // answered in order: invalid_message
        break;
      case Incoming::Kind::pong:
        break;
      case Incoming::Kind::failure:
        failed_ = true;
        return in;
      case Incoming::Kind::ping:
      case Incoming::Kind::close:
        return in;
    }
  }
  return std::nullopt;
}

std::optional<std::optional<std::string>> ReadSide::next_message() {
  if (inbox_.empty() || closed_) return std::nullopt;
  auto m = std::move(inbox_.front());
  inbox_.pop_front();
  return m;
}

void ReadSide::close() {
  closed_ = true;
  early_.reset();
  inbox_.clear();
}

}  // namespace outlive::ws
