#include "ws/connection.hpp"

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>

#include "common/log.hpp"
#include "ws/exact_handler.hpp"
#include "ws/send_batch.hpp"

namespace outlive::ws {

namespace net = boost::asio;
using error_code = boost::system::error_code;

namespace {
constexpr size_t kMaxFramesPerWrite = 64;
}  // namespace

Connection::Connection(tcp::socket&& socket, const ConnectionSettings& settings)
    : socket_(std::move(socket)),
      read_(settings),
      deadlines_(DeadlineWheel<Connection>::of(socket_.get_executor())),
      liveness_(settings) {}

Connection::~Connection() {
  if (timer_armed_) deadlines_.disarm();
}

void Connection::start_transport(std::string early) {
  self_ = shared_from_this();
  read_.hold_early(std::move(early));
  error_code ec;
  socket_.non_blocking(true, ec);
  liveness_.start(std::chrono::steady_clock::now());
  do_read();
  arm_timer();
}

// --- liveness ---------------------------------------------------------------------------------

void Connection::arm_timer() {
  if (finished_) return;
  const auto next = liveness_.next(writing_);
  // A wait that ends no later already covers the new deadline: it arms again when it ends.
  if (timer_armed_ && timer_expiry_ <= next) return;
  if (timer_armed_) deadlines_.disarm();  // the entry armed now is replaced
  timer_armed_ = true;
  timer_expiry_ = next;
  deadlines_.add(next, shared_from_this(), ++timer_generation_);
}

void Connection::on_deadline_entry(uint32_t generation) {
  if (generation != timer_generation_ || !timer_armed_ || finished_) return;
  timer_armed_ = false;
  deadlines_.disarm();
  on_timer();
}

void Connection::on_timer() {
  const auto now = std::chrono::steady_clock::now();
  if (liveness_.close_unanswered(now)) return terminate();
  if (liveness_.stalled(now, writing_)) return on_stall();
  if (liveness_.take_deadline(now)) {
    on_deadline();  // may set the next one
    if (finished_) return;
  }
  if (liveness_.silent(now)) {
    // A peer that vanished (a phone that lost its network) answers nothing: say 1001 if the
    // kernel takes it, and drop the connection without waiting.
    log::limited(log::Level::info, "websocket silent past idle_timeout", about());
    on_close_code(kGoingAway);
    if (!queue_.close_queued()) {
      drop_queue();
      close_code_ = kGoingAway;
      begin_closing();
      send_control(Opcode::close, close_payload(kGoingAway, "idle"));
    }
    return terminate();
  }
  if (liveness_.take_ping(now) && !closing_) send_control(Opcode::ping, std::string());
  arm_timer();
}

// The tab reads nothing: its kernel buffer is full, so a close frame cannot reach it either.
void Connection::on_stall() {
  log::limited(log::Level::info, "websocket accepted no bytes with frames waiting", about());
  on_close_code(kTryAgain);
  close_code_ = kTryAgain;
  begin_closing();
  terminate();
}

// --- reading ----------------------------------------------------------------------------------

void Connection::do_read() {
  if (reading_ || finished_ || !read_.readable()) return;
  reading_ = true;
  socket_.async_wait(
      tcp::socket::wait_read,
      exactly_sized([self = shared_from_this()](error_code ec) { self->on_readable(ec); }));
}

void Connection::on_readable(error_code ec) {
  reading_ = false;
  if (ec || finished_) return finish();
  // A buffer shared by the connections of this thread: an idle socket holds no read buffer.
  thread_local std::array<char, 64 * 1024> chunk;
  const size_t n = socket_.read_some(net::buffer(chunk), ec);
  if (ec == net::error::would_block || ec == net::error::try_again) return do_read();
  if (ec) return finish();  // the peer went away without a close frame
  liveness_.received(std::chrono::steady_clock::now());
  read_.feed(chunk.data(), n);
  take_incoming();
  if (read_.waiting() && !closing_) on_messages();
}

void Connection::parse_early() {
  if (finished_ || closing_) return read_.close();  // its early bytes go unparsed
  if (!read_.feed_early()) return;
  take_incoming();  // then reads the socket, when there is room
  if (read_.waiting() && !closing_) on_messages();
}

// Acts on what the read side takes; reads the socket again while it has room.
void Connection::take_incoming() {
  while (!finished_) {
    auto in = read_.take(queue_.bytes());
    if (!in) break;
    if (in->kind == Incoming::Kind::ping) {
      send_control(Opcode::pong, std::move(in->payload));
      continue;
    }
    if (in->kind == Incoming::Kind::close) return on_peer_close(in->code);
    // A failure. The bytes that follow cannot be trusted: close without waiting for an answer.
    log::limited(log::Level::info, "websocket protocol error", about({{"error", in->payload}}));
    drop_queue();  // the close goes out next (a frame partly written is finished first)
    return close_with(in->code, in->payload);
  }
  if (read_.room(queue_.bytes())) do_read();
}

// Frames left the queue after reading paused on it: read again, after the handler that
// consumed them returned (it may be the protocol's own send, inside its message loop).
void Connection::resume_reading() {
  read_.unpause();
  if (finished_ || read_.failed()) return;
  if (!reading_) take_incoming();
  if (read_.waiting() && !closing_) on_messages();
}

std::optional<std::optional<std::string>> Connection::next_message() {
  if (closing_) return std::nullopt;
  auto m = read_.next_message();
  if (m && !reading_) take_incoming();
  return m;
}

// --- writing ----------------------------------------------------------------------------------

void Connection::send(Frame frame) {
  if (closing_) return;
  queue_.push(std::move(frame));
  do_write();
}

void Connection::uncork() {
  queue_.uncork();
  do_write();
}

// A pong, a ping or our answer to the peer's close: not the protocol's to bound.
void Connection::send_control(Opcode opcode, std::string payload) {
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
void Connection::do_write() {
  if (queue_.held()) return;
  if (writing_ || batched_ || in_write_ || finished_) return;
  if (queue_.empty()) return maybe_close();
  if (SendBatch* batch = SendBatch::open_here()) {
    batched_ = true;
    batch->add(shared_from_this());
    return;
  }
  write_now();
}

void Connection::write_now() {
  in_write_ = true;
  while (!queue_.empty() && !finished_) {
    std::array<iovec, kMaxFramesPerWrite * 4> iov;
    size_t parts = 0;
    const size_t offered = queue_.gather(iov.data(), kMaxFramesPerWrite, parts);
    msghdr msg{};
    msg.msg_iov = iov.data();
    msg.msg_iovlen = parts;
    const ssize_t written = ::sendmsg(socket_.native_handle(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (!on_written(written, written < 0 ? errno : 0, offered)) break;
  }
  in_write_ = false;
  if (!writing_ && queue_.empty()) maybe_close();
}

bool Connection::on_written(long written, int error, size_t offered) {
  if (written < 0) {
    if (error == EINTR) return true;
    if (error == EAGAIN || error == EWOULDBLOCK) {
      wait_writable();
    } else {
      finish();  // the peer is gone
    }
    return false;
  }
  if (written > 0) liveness_.taken(std::chrono::steady_clock::now());
  if (consume(static_cast<size_t>(written))) return false;  // the close frame went out
  if (static_cast<size_t>(written) < offered) {
    wait_writable();
    return false;
  }
  return true;
}

bool Connection::prepare_batched(msghdr& msg, iovec* iov, size_t max_frames, size_t& offered) {
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

void Connection::on_batched_write(int result, size_t offered) {
  batched_ = false;
  if (finished_) return;
  in_write_ = true;
  const bool more = on_written(result, result < 0 ? -result : 0, offered);
  in_write_ = false;
  // The rest (frames past the batch's share, or queued meanwhile) goes out directly.
  if (more || (!writing_ && queue_.empty())) do_write();
}

// Takes `written` bytes off the front of the queue. True once the close frame is out.
bool Connection::consume(size_t written) {
  const auto taken = queue_.consume(written);
  if (taken.close_sent) {
    on_close_sent();
    return true;
  }
  if (taken.popped && !closing_) on_room();
  if (!finished_ && read_.resume_due(queue_.bytes())) {
    net::post(socket_.get_executor(), [self = shared_from_this()] { self->resume_reading(); });
  }
  return false;
}

void Connection::wait_writable() {
  writing_ = true;
  arm_timer();  // the stall deadline counts while the kernel takes nothing
  socket_.async_wait(tcp::socket::wait_write,
                     exactly_sized([self = shared_from_this()](error_code ec) {
                       self->writing_ = false;
                       if (ec || self->finished_) return self->finish();
                       self->do_write();
                     }));
}

// Drops every queued frame except one partly written.
void Connection::drop_queue() { queue_.drop_unstarted(); }

// --- closing ----------------------------------------------------------------------------------

void Connection::close_with(uint16_t code, const std::string& reason) {
  if (close_code_ || peer_close_) return;
  close_code_ = code;
  close_reason_ = std::make_unique<const std::string>(reason);
  on_close_code(code);
  begin_closing();
  liveness_.closing(std::chrono::steady_clock::now());
  arm_timer();
  queue_.uncork();
  do_write();  // frames queued before the close (an error frame) go out first
  if (!read_.failed()) take_incoming();  // the tab's answer may be read already
}

// The tab closes: answer with its code after the frame being written (nothing else is sent).
void Connection::on_peer_close(uint16_t code) {
  if (close_sent_) return terminate();  // the answer to our close
  if (peer_close_) return;
  peer_close_ = code;
  if (queue_.close_queued()) return;  // our close, on its way, answers it
  begin_closing();
  drop_queue();
  liveness_.closing(std::chrono::steady_clock::now());
  arm_timer();
  queue_.uncork();
  do_write();
}

void Connection::begin_closing() {
  if (closing_) return;
  closing_ = true;
  // Refused or closed before being served: what the tab wrote with its request is not acted on
  // (the socket is read again for the close handshake; close_with() reads).
  read_.close();
  on_closing();
}

void Connection::maybe_close() {
  if (!closing_ || writing_ || batched_ || queue_.close_queued() || !queue_.empty() || finished_)
    return;
  if (peer_close_) {
    send_control(Opcode::close,
                 *peer_close_ == 1005 ? std::string() : close_payload(*peer_close_, ""));
  } else if (close_code_) {
    send_control(Opcode::close,
                 close_payload(*close_code_, close_reason_ ? *close_reason_ : std::string()));
  }
}

void Connection::on_close_sent() {
  close_sent_ = true;
  // After answering the tab's close the connection is done; after our own close we wait for the
  // tab's answer (or the close timer).
  if (peer_close_ || read_.failed()) terminate();
}

void Connection::terminate() {
  if (batched_ && !finished_) {
    // A frame waiting in this thread's batch (the close of a deadline that fired inside one) goes
    // out before the socket shuts; the batch then finds the connection finished and skips it.
    batched_ = false;
    write_now();
  }
  error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  finish();
}

void Connection::finish() {
  if (finished_) return;
  finished_ = true;
  if (!closing_) {
    closing_ = true;
    on_closing();
  }
  if (timer_armed_) {
    timer_armed_ = false;
    ++timer_generation_;
    deadlines_.disarm();
  }
  error_code ignored;
  socket_.close(ignored);  // pending waits end
  on_finished();
  // Let go after the caller's handler has returned, not inside it.
  if (self_) net::post(socket_.get_executor(), [keep = std::move(self_)] {});
}

}  // namespace outlive::ws
