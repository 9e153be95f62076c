#include "ws/send_queue.hpp"

#include <sys/uio.h>

#include <iterator>
#include <string_view>
#include <utility>

namespace outlive::ws {

Frame Frame::text(std::string text) {
  Frame f;
  f.header = frame_header(Opcode::text, text.size());
  f.own = std::move(text);
  return f;
}

Frame Frame::update(std::shared_ptr<const std::string> head,
                    std::shared_ptr<const std::string> shared) {
  Frame f;
  f.header = frame_header(Opcode::text, head->size() + shared->size());
  f.head = std::move(head);
  f.shared = std::move(shared);
  return f;
}

Frame Frame::shared_text(std::shared_ptr<const std::string> text) {
  Frame f;
  f.header = frame_header(Opcode::text, text->size());
  f.shared = std::move(text);
  return f;
}

Frame Frame::control(Opcode opcode, std::string payload) {
  Frame f;
  f.header = frame_header(opcode, payload.size());
  f.own = std::move(payload);
  return f;
}

void SendQueue::push(Frame frame) {
  if (frame.is(Opcode::close)) close_queued_ = true;
  bytes_ += frame.size();
  frames_.push_back(std::move(frame));
}

bool SendQueue::push_pong(std::string payload) {
  for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
    const bool started = it == std::prev(frames_.rend()) && front_written_ > 0;
    if (!it->is(Opcode::pong) || started) continue;
    bytes_ -= it->size();
    *it = Frame::control(Opcode::pong, std::move(payload));
    bytes_ += it->size();
    return true;
  }
  push(Frame::control(Opcode::pong, std::move(payload)));
  return false;
}

size_t SendQueue::gather(iovec* iov, size_t max_frames, size_t& parts) const {
  size_t offered = 0;
  size_t skip = front_written_;
  size_t frames = 0;
  parts = 0;
  for (const Frame& f : frames_) {
    if (frames++ == max_frames) break;
    const std::string_view pieces[4] = {
        f.header.view(), f.own, f.head ? std::string_view(*f.head) : std::string_view(),
        f.shared ? std::string_view(*f.shared) : std::string_view()};
    for (auto piece : pieces) {
      if (skip >= piece.size()) {
        skip -= piece.size();
        continue;
      }
      piece.remove_prefix(skip);
      skip = 0;
      iov[parts++] = iovec{const_cast<char*>(piece.data()), piece.size()};
      offered += piece.size();
    }
    if (f.is(Opcode::close)) break;  // nothing follows it
  }
  return offered;
}

SendQueue::Taken SendQueue::consume(size_t written) {
  Taken taken;
  while (written > 0 && !frames_.empty()) {
    Frame& f = frames_.front();
    const size_t left = f.size() - front_written_;
    if (written < left) {
      front_written_ += written;
      break;
    }
    written -= left;
    front_written_ = 0;
    bytes_ -= f.size();
    const bool close = f.is(Opcode::close);
    frames_.pop_front();
    taken.popped = true;
    if (close) {
      taken.close_sent = true;
      break;
    }
  }
  return taken;
}

void SendQueue::drop_unstarted() {
  while (frames_.size() > (front_written_ > 0 ? 1u : 0u)) frames_.pop_back();
  bytes_ = frames_.empty() ? 0 : frames_.front().size();
}

}  // namespace outlive::ws
