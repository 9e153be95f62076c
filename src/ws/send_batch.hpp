#pragma once
// The writes of a round, handed to the kernel together (issue 13). While an io thread hands out a
// round of the fan-out (or the progress tick), each connection that has frames to write joins the
// thread's batch instead of calling sendmsg; at the end of the round the batch gathers every
// connection's frames and submits one sendmsg per socket through io_uring in one system call
// (per 128 sockets). On loopback at 5,000 sockets this took the kernel's cost per frame from 6.2
// to 3.7 µs on this project's 2-core machines (the io_uring row of `build/bench/loopback_floor`),
// most of it the system call's own entry and exit, which the virtual machine makes dear.
//
// The results are the same as sendmsg's, handled by the connection as its own writes are (a
// partial write or EAGAIN waits for room, an error finishes it). Where io_uring is not there at
// run time (an older kernel, a seccomp profile that forbids it, OUTLIVE_IO_URING=0, or
// SendBatch::enable(false)), no batch opens and every connection writes for itself as before.
// liburing is used here and nowhere else.
#include <memory>
#include <vector>

namespace outlive::ws {

class WriteSide;

class SendBatch {
 public:
  // Process-wide switch (config server.io_uring); on by default unless OUTLIVE_IO_URING=0.
  static void enable(bool on);
  static bool enabled();
  // True when this machine's kernel accepted an io_uring on an io thread (after the first round).
  static bool in_use();
  // Whether this build has liburing (without it no batch ever opens).
  static bool built_with_io_uring();

  // The batch open on this thread, or nullptr (no Scope open, io_uring unavailable, or the batch
  // is being flushed: a connection's writes after its batched one go out directly).
  static SendBatch* open_here();

  // Opens this thread's batch for its lifetime (nesting is fine) and flushes it at the end.
  class Scope {
   public:
    Scope();
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    // Between two sockets' work (never inside one): flushes when a submission's worth waits, so
    // the round's first sockets need not wait for its last.
    void flush_if_full();

   private:
    SendBatch* batch_ = nullptr;
  };

  // A connection's write side with frames to write (holding the connection); it is asked for
  // them when the batch is flushed.
  void add(std::shared_ptr<WriteSide> writer) { waiting_.push_back(std::move(writer)); }

  ~SendBatch();

 private:
  struct Ring;
  SendBatch() = default;
  static SendBatch* of_this_thread();
  void flush();
  // Waits for `count` completions; false (after cancelling the rest) when they did not come.
  bool reap(unsigned count);

  std::unique_ptr<Ring> ring_;
  std::vector<std::shared_ptr<WriteSide>> waiting_;
  int depth_ = 0;
  bool flushing_ = false;
};

}  // namespace outlive::ws
