#include "ws/write_side.hpp"

#include <sys/socket.h>
#include <sys/uio.h>

#include <array>
#include <cerrno>

#include "ws/send_batch.hpp"

namespace outlive::ws {

namespace {
constexpr size_t kMaxFramesPerWrite = 64;
}  // namespace

void WriteSide::send_control(Opcode opcode, std::string payload) {
  if (queue_.close_queued() || finished_) return;
  if (opcode == Opcode::pong) {
    if (queue_.push_pong(std::move(payload))) return;  // the waiting one answers the latest ping
  } else {
    queue_.push(Frame::control(opcode, std::move(payload)));
  }
  do_write();
}

// Writes the queue with one writev per batch of frames, without waiting: what the kernel takes
// now is written now; when its buffer is full we wait until it has room. During a round handed
// out on this thread the write joins the round's batch instead (ws::SendBatch).
void WriteSide::do_write() {
  if (queue_.held()) return;
  if (writing_ || batched_ || in_write_ || finished_) return;
  if (queue_.empty()) return maybe_close();
  if (SendBatch* batch = SendBatch::open_here()) {
    batched_ = true;
    batch->add(owner_.batch_hold());
    return;
  }
  write_now();
}

void WriteSide::write_now() {
  in_write_ = true;
  while (!queue_.empty() && !finished_) {
    std::array<iovec, kMaxFramesPerWrite * 4> iov;
    size_t parts = 0;
    const size_t offered = queue_.gather(iov.data(), kMaxFramesPerWrite, parts);
    msghdr msg{};
    msg.msg_iov = iov.data();
    msg.msg_iovlen = parts;
    const ssize_t written = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (!on_written(written, written < 0 ? errno : 0, offered)) break;
  }
  in_write_ = false;
  if (!writing_ && queue_.empty()) maybe_close();
}

bool WriteSide::on_written(long written, int error, size_t offered) {
  if (written < 0) {
    if (error == EINTR) return true;
    if (error == EAGAIN || error == EWOULDBLOCK) {
      wait_writable();
    } else {
      owner_.write_failed();  // the peer is gone
    }
    return false;
  }
  if (consume(static_cast<size_t>(written))) return false;  // the close frame went out
  if (static_cast<size_t>(written) < offered) {
    wait_writable();
    return false;
  }
  return true;
}

bool WriteSide::prepare_batched(msghdr& msg, iovec* iov, size_t max_frames, size_t& offered) {
  if (finished_ || queue_.empty()) {
    batched_ = false;
    if (!finished_) maybe_close();
    return false;
  }
  size_t parts = 0;
  offered = queue_.gather(iov, max_frames, parts);
  msg = msghdr{};
  msg.msg_iov = iov;
  msg.msg_iovlen = parts;
  return true;
}

void WriteSide::on_batched_write(int result, size_t offered) {
  batched_ = false;
  if (finished_) return;
  in_write_ = true;
  const bool more = on_written(result, result < 0 ? -result : 0, offered);
  in_write_ = false;
  // The rest (frames past the batch's share, or queued meanwhile) goes out directly.
  if (more || (!writing_ && queue_.empty())) do_write();
}

// Takes `written` bytes off the front of the queue. True once the close frame is out.
bool WriteSide::consume(size_t written) {
  const auto taken = queue_.consume(written);
  owner_.taken(written, taken);
  return taken.close_sent;
}

void WriteSide::wait_writable() {
  writing_ = true;
  owner_.wait_writable();
}

void WriteSide::on_writable(bool ok) {
  writing_ = false;
  if (!ok || finished_) return owner_.write_failed();
  do_write();
}

void WriteSide::flush_batched() {
  if (batched_ && !finished_) {
    // A frame waiting in this thread's batch (the close of a deadline that fired inside one) goes
    // out before the socket shuts; the batch then finds the connection finished and skips it.
    batched_ = false;
    write_now();
  }
}

void WriteSide::maybe_close() {
  if (!closing_ || writing_ || batched_ || queue_.close_queued() || !queue_.empty() || finished_)
    return;
  owner_.drained();
}

}  // namespace outlive::ws
