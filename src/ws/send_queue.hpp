#pragma once
// A connection's frames waiting to be written, already framed: how many bytes wait (the protocol's
// send-buffer limit reads it), how much of the front one is written, corking (a round's frames
// leave together), one pong at most, and the close frame, after which nothing is written. Pure:
// the connection does the writing and hands back what the kernel took.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ws/fifo.hpp"
#include "ws/framing.hpp"

struct iovec;

namespace outlive::ws {

// A frame to send, already framed: the header, then this socket's own bytes, then bytes shared
// with other sockets (an update's head for a set of ids, and its data, serialised once).
struct Frame {
  FrameHeader header;
  std::string own;
  std::shared_ptr<const std::string> head;
  std::shared_ptr<const std::string> shared;

  static Frame text(std::string text);
  static Frame update(std::shared_ptr<const std::string> head,
                      std::shared_ptr<const std::string> shared);
  static Frame shared_text(std::shared_ptr<const std::string> text);
  static Frame control(Opcode opcode, std::string payload);
  bool is(Opcode opcode) const { return (header.bytes[0] & 0x0F) == static_cast<uint8_t>(opcode); }
  size_t size() const {
    return header.size + own.size() + (head ? head->size() : 0) + (shared ? shared->size() : 0);
  }
};

class SendQueue {
 public:
  // While corked, frames wait for the end of the batch unless this much waits already: the
  // kernel's buffer takes its share before ours counts towards the send-buffer limit.
  static constexpr size_t kCorkedBytes = 64 * 1024;

  bool empty() const { return frames_.empty(); }
  size_t bytes() const { return bytes_; }  // waiting, the front's written part included
  void push(Frame frame);
  // A pong answering the latest ping (RFC 6455 5.5.3): replaces the one waiting and not started,
  // so a tab that pings and never reads cannot grow the queue. True when it replaced one.
  bool push_pong(std::string payload);
  // Once a close frame is queued nothing follows it.
  bool close_queued() const { return close_queued_; }

  void cork() { corked_ = true; }
  void uncork() { corked_ = false; }
  // Corked with less than kCorkedBytes waiting: not written yet.
  bool held() const { return corked_ && bytes_ < kCorkedBytes; }

  // Up to `max_frames` frames from the front as iovecs (`parts` of them, at most 4 a frame),
  // stopping after a close frame; their byte count.
  size_t gather(iovec* iov, size_t max_frames, size_t& parts) const;
  struct Taken {
    bool popped = false;      // some frame left the queue
    bool close_sent = false;  // the close frame went out (nothing after it is taken)
  };
  // Takes `written` bytes off the front.
  Taken consume(size_t written);
  // Drops every frame except one partly written (a frame cut in half would break the stream).
  void drop_unstarted();

 private:
  Fifo<Frame> frames_;
  size_t bytes_ = 0;
  size_t front_written_ = 0;  // bytes of the front frame already written
  bool corked_ = false;
  bool close_queued_ = false;
};

}  // namespace outlive::ws
