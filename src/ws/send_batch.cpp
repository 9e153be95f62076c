#include "ws/send_batch.hpp"

#include <sys/socket.h>
#include <sys/uio.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/log.hpp"
#include "ws/write_side.hpp"

#if OUTLIVE_HAVE_LIBURING
#include <liburing.h>
#endif

namespace outlive::ws {

namespace {

std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> on{[] {
    const char* env = std::getenv("OUTLIVE_IO_URING");
    return !(env && std::strcmp(env, "0") == 0);
  }()};
  return on;
}
std::atomic<bool> g_in_use{false};

// Per submission: 128 sockets, each with up to 6 frames (a round is one frame per socket as a
// rule; a socket with more writes the rest itself after its batched write).
constexpr unsigned kEntries = 128;
constexpr size_t kFramesPerEntry = 6;
constexpr uint64_t kCancelTag = ~uint64_t(0);

// This thread's batch; `unavailable` once io_uring failed here (not retried).
thread_local std::unique_ptr<SendBatch> t_batch;
thread_local bool t_unavailable = false;

}  // namespace

void SendBatch::enable(bool on) { enabled_flag().store(on); }
bool SendBatch::enabled() { return enabled_flag().load(); }
bool SendBatch::in_use() { return g_in_use.load(); }
#if OUTLIVE_HAVE_LIBURING
bool SendBatch::built_with_io_uring() { return true; }
#else
bool SendBatch::built_with_io_uring() { return false; }
#endif

#if OUTLIVE_HAVE_LIBURING

struct SendBatch::Ring {
  io_uring ring{};
  struct Slot {
    msghdr msg{};
    std::array<iovec, kFramesPerEntry * 4> iov{};
    size_t offered = 0;
    int result = 0;
    bool done = false;
  };
  std::array<Slot, kEntries> slots{};
  ~Ring() { io_uring_queue_exit(&ring); }
};

SendBatch::~SendBatch() = default;

SendBatch* SendBatch::of_this_thread() {
  if (t_unavailable || !enabled()) return nullptr;
  if (t_batch) return t_batch.get();
  auto ring = std::make_unique<Ring>();
  // One thread submits and reaps: the kernel may skip its locking and run completions' task work
  // when we ask for completions (6.1+); older kernels take the plain ring.
  int rc = io_uring_queue_init(kEntries, &ring->ring,
                               IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN);
  if (rc < 0) rc = io_uring_queue_init(kEntries, &ring->ring, 0);
  if (rc < 0) {
    t_unavailable = true;
    log::info("io_uring unavailable on an io thread: sockets write for themselves",
              {{"error", std::strerror(-rc)}});
    return nullptr;
  }
  t_batch.reset(new SendBatch());
  t_batch->ring_ = std::move(ring);
  g_in_use = true;
  return t_batch.get();
}

void SendBatch::flush() {
  flushing_ = true;
  auto& slots = ring_->slots;
  size_t next = 0;
  std::array<WriteSide*, kEntries> owners{};
  while (next < waiting_.size()) {
    unsigned n = 0;
    for (; next < waiting_.size() && n < kEntries; ++next) {
      WriteSide& c = *waiting_[next];
      auto& slot = slots[n];
      if (!c.prepare_batched(slot.msg, slot.iov.data(), kFramesPerEntry, slot.offered)) continue;
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
      io_uring_prep_sendmsg(sqe, c.fd(), &slot.msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      io_uring_sqe_set_data64(sqe, n);
      slot.done = false;
      owners[n++] = &c;
    }
    if (n == 0) break;
    const bool complete = reap(n);
    for (unsigned i = 0; i < n; ++i) {
      // A write the kernel did not finish (reap() cancelled it) waits for room like EAGAIN.
      const int result = slots[i].done ? slots[i].result : -EAGAIN;
      owners[i]->on_batched_write(result, slots[i].offered);
    }
    if (!complete) {
      // This kernel parks a non-blocking send instead of answering EAGAIN at once: the rest of
      // this batch and every later write on this thread go out directly.
      t_unavailable = true;
      log::warn(
          "io_uring did not complete a non-blocking send at once: batching is off on this "
          "io thread");
      for (; next < waiting_.size(); ++next) waiting_[next]->on_batched_write(-EAGAIN, 0);
      break;
    }
  }
  waiting_.clear();
  flushing_ = false;
}

bool SendBatch::reap(unsigned count) {
  auto& ring = ring_->ring;
  auto& slots = ring_->slots;
  unsigned got = 0;
  auto take = [&] {
    io_uring_cqe* cqe = nullptr;
    unsigned head = 0, seen = 0;
    io_uring_for_each_cqe(&ring, head, cqe) {
      ++seen;
      const uint64_t tag = io_uring_cqe_get_data64(cqe);
      if (tag == kCancelTag || tag >= count || slots[tag].done) continue;
      slots[tag].result = cqe->res;
      slots[tag].done = true;
      ++got;
    }
    io_uring_cq_advance(&ring, seen);
  };
  // Sends on non-blocking sockets complete inside the submission: the wait returns at once.
  __kernel_timespec limit{1, 0};
  io_uring_cqe* first = nullptr;
  int rc = 0;
  do {
    rc = io_uring_submit_and_wait_timeout(&ring, &first, count - got, &limit, nullptr);
    take();
  } while (got < count && rc == -EINTR);
  if (got == count) return true;
  if (rc < 0 && rc != -ETIME && rc != -EINTR)
    log::warn("io_uring submit failed", {{"error", std::strerror(-rc)}});
  // Cancel what is still parked and wait until each has answered (cancelled or done).
  for (unsigned i = 0; i < count; ++i) {
    if (slots[i].done) continue;
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    if (!sqe) {
      io_uring_submit(&ring);
      sqe = io_uring_get_sqe(&ring);
    }
    io_uring_prep_cancel64(sqe, i, 0);
    io_uring_sqe_set_data64(sqe, kCancelTag);
  }
  while (got < count) {
    io_uring_submit_and_wait_timeout(&ring, &first, 1, &limit, nullptr);
    take();
  }
  return false;
}

#else  // no liburing at build time: batches never open

struct SendBatch::Ring {};
SendBatch::~SendBatch() = default;
SendBatch* SendBatch::of_this_thread() { return nullptr; }
void SendBatch::flush() {}
bool SendBatch::reap(unsigned) { return true; }

#endif

SendBatch* SendBatch::open_here() {
  SendBatch* b = t_batch.get();
  return b && b->depth_ > 0 && !b->flushing_ && !t_unavailable && enabled() ? b : nullptr;
}

SendBatch::Scope::Scope() : batch_(of_this_thread()) {
  if (batch_) ++batch_->depth_;
}

void SendBatch::Scope::flush_if_full() {
  if (batch_ && batch_->depth_ == 1 && batch_->waiting_.size() >= kEntries) batch_->flush();
}

SendBatch::Scope::~Scope() {
  if (!batch_ || --batch_->depth_ > 0) return;
  if (!batch_->waiting_.empty()) batch_->flush();
}

}  // namespace outlive::ws
