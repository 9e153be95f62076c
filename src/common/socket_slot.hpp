#pragma once
// Cuts short a call that blocks on another thread's connection (docs/ARCHITECTURE.md "Stopping"):
// a Postgres that stops answering without closing the connection (frozen, or a peer gone without a
// reset) holds a query's read forever, and a thread blocked there cannot be joined. The owner puts
// the socket of the connection it blocks on here; interrupt(), from any thread, shuts it down, so
// the blocked read returns at once with an error the owner already handles as a lost connection.
// shutdown() leaves the descriptor open: the owner clears the slot (under the same lock) before it
// closes the connection, so a descriptor reused meanwhile is never touched.
#include <sys/socket.h>

#include <mutex>

namespace outlive {

class SocketSlot {
 public:
  // After connecting. Once interrupted, a socket set later is shut down at once.
  void set(int fd) {
    std::lock_guard lock(mutex_);
    fd_ = fd;
    if (interrupted_ && fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
  }
  // Before closing the connection.
  void clear() {
    std::lock_guard lock(mutex_);
    fd_ = -1;
  }
  void interrupt() {
    std::lock_guard lock(mutex_);
    interrupted_ = true;
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
  }
  // Before the owner starts again.
  void reset() {
    std::lock_guard lock(mutex_);
    interrupted_ = false;
  }

 private:
  std::mutex mutex_;
  int fd_ = -1;
  bool interrupted_ = false;
};

// Clears the slot when it goes: declared after the connection, it goes first.
struct ClearSlotOnExit {
  SocketSlot& slot;
  ~ClearSlotOnExit() { slot.clear(); }
};

}  // namespace outlive
