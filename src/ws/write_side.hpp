#pragma once
// The write side of a websocket connection: its SendQueue (frames already framed), written with
// one writev for all that wait, or through its thread's SendBatch during a round; a write the
// kernel did not take whole waits until the socket takes more. It decides what a write's result
// means (write on, wait for room, the peer is gone, the close frame went out) and tells its owner,
// the connection, which waits on the socket, runs the close handshake and the liveness deadlines.
// The closing and finished flags live here, not in the connection: send() and every write read
// them, and the hot path must not call back for them.
#include <cstddef>
#include <memory>
#include <string>

#include "ws/framing.hpp"
#include "ws/send_queue.hpp"

struct iovec;
struct msghdr;

namespace outlive::ws {

class WriteSide {
 public:
  // What the write side needs of its connection: once per write completion at most, never per
  // frame.
  class Owner {
   public:
    // The kernel takes nothing more now: wait until the socket is writable, then on_writable().
    virtual void wait_writable() = 0;
    // A write took `bytes` (0 or more) off the queue, and `what` says what left.
    virtual void taken(size_t bytes, SendQueue::Taken what) = 0;
    // Closing, with nothing queued or being written: the close frame is due (send_control).
    virtual void drained() = 0;
    // The socket failed a write (the peer is gone) or its wait for room.
    virtual void write_failed() = 0;
    // Holds the connection while this write side waits in the round's batch.
    virtual std::shared_ptr<WriteSide> batch_hold() = 0;

   protected:
    ~Owner() = default;
  };

  // `fd`: the connection's socket, open (and non-blocking once writes start) until finish().
  WriteSide(Owner& owner, int fd) : owner_(owner), fd_(fd) {}
  WriteSide(const WriteSide&) = delete;
  WriteSide& operator=(const WriteSide&) = delete;

  // A frame of the protocol's: dropped once closing.
  void send(Frame frame) {
    if (closing_) return;
    queue_.push(std::move(frame));
    do_write();
  }
  // A pong, a ping or our close (answering the peer's or our own): not the protocol's to bound.
  void send_control(Opcode opcode, std::string payload);
  // While corked, frames queue and leave together at uncork() (unless 64 KiB wait already).
  void cork() { queue_.cork(); }
  void uncork() {
    queue_.uncork();
    do_write();
  }
  // Writes what waits, unless a write or a wait for room is under way (or corked, or finished).
  void do_write();
  // The socket's wait for room ended (`ok`: it is writable).
  void on_writable(bool ok);
  // Drops every queued frame except one partly written.
  void drop_unstarted() { queue_.drop_unstarted(); }
  // At shutdown: a frame waiting in this thread's batch goes out first (see the .cpp).
  void flush_batched();

  size_t queued_bytes() const { return queue_.bytes(); }
  bool close_queued() const { return queue_.close_queued(); }
  bool writing() const { return writing_; }  // waiting until the socket takes more
  bool batched() const { return batched_; }
  bool closing() const { return closing_; }
  bool finished() const { return finished_; }
  // True when closing begins now (false when it had): nothing new is sent from then on.
  bool begin_closing() { return !closing_ && (closing_ = true); }
  // True when the connection finishes now: nothing is written from then on.
  bool finish() { return !finished_ && (finished_ = true); }

  // --- for ws::SendBatch: the socket, the write it asks for, and its result (-errno or bytes) ---
  int fd() const { return fd_; }
  bool prepare_batched(msghdr& msg, iovec* iov, size_t max_frames, size_t& offered);
  void on_batched_write(int result, size_t offered);

 private:
  void write_now();  // do_write() without the batch: sendmsg until the queue or the kernel is done
  // What the kernel did with a write of `offered` bytes (`error` when `written` < 0): true when
  // the next write may follow at once.
  bool on_written(long written, int error, size_t offered);
  bool consume(size_t written);
  void wait_writable();
  void maybe_close();

  Owner& owner_;
  // no_unique_address: the flags and the fd fill the queue's tail padding (issue 37 counts each
  // connection's bytes); the queue is never assigned as a whole.
  [[no_unique_address]] SendQueue queue_;
  bool writing_ = false;  // waiting until the socket takes more
  bool in_write_ = false;
  bool batched_ = false;  // in this thread's SendBatch until the round's end
  bool closing_ = false;
  bool finished_ = false;
  int fd_;
};

}  // namespace outlive::ws
