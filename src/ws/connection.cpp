#include "ws/connection.hpp"

#include <array>

#include "common/log.hpp"
#include "ws/exact_handler.hpp"

namespace outlive::ws {

namespace net = boost::asio;
using error_code = boost::system::error_code;

Connection::Connection(tcp::socket&& socket, const ConnectionSettings& settings)
    : socket_(std::move(socket)),
      read_(settings),
      deadlines_(DeadlineWheel<Connection>::of(socket_.get_executor())),
      liveness_(settings),
      write_(*this, socket_.native_handle()) {}

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
  if (finished()) return;
  const auto next = liveness_.next(write_.writing());
  // A wait that ends no later already covers the new deadline: it arms again when it ends.
  if (timer_armed_ && timer_expiry_ <= next) return;
  if (timer_armed_) deadlines_.disarm();  // the entry armed now is replaced
  timer_armed_ = true;
  timer_expiry_ = next;
  deadlines_.add(next, shared_from_this(), ++timer_generation_);
}

void Connection::on_deadline_entry(uint32_t generation) {
  if (generation != timer_generation_ || !timer_armed_ || finished()) return;
  timer_armed_ = false;
  deadlines_.disarm();
  on_timer();
}

void Connection::on_timer() {
  const auto now = std::chrono::steady_clock::now();
  if (liveness_.close_unanswered(now)) return terminate();
  if (liveness_.stalled(now, write_.writing())) return on_stall();
  if (liveness_.take_deadline(now)) {
    on_deadline();  // may set the next one
    if (finished()) return;
  }
  if (liveness_.silent(now)) {
    // A peer that vanished (a phone that lost its network) answers nothing: say 1001 if the
    // kernel takes it, and drop the connection without waiting.
    log::limited(log::Level::info, "websocket silent past idle_timeout", about());
    on_close_code(kGoingAway);
    if (!write_.close_queued()) {
      write_.drop_unstarted();
      close_code_ = kGoingAway;
      begin_closing();
      write_.send_control(Opcode::close, close_payload(kGoingAway, "idle"));
    }
    return terminate();
  }
  if (liveness_.take_ping(now) && !closing()) write_.send_control(Opcode::ping, std::string());
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
  if (reading_ || finished() || !read_.readable()) return;
  reading_ = true;
  socket_.async_wait(
      tcp::socket::wait_read,
      exactly_sized([self = shared_from_this()](error_code ec) { self->on_readable(ec); }));
}

void Connection::on_readable(error_code ec) {
  reading_ = false;
  if (ec || finished()) return finish();
  // A buffer shared by the connections of this thread: an idle socket holds no read buffer.
  thread_local std::array<char, 64 * 1024> chunk;
  const size_t n = socket_.read_some(net::buffer(chunk), ec);
  if (ec == net::error::would_block || ec == net::error::try_again) return do_read();
  if (ec) return finish();  // the peer went away without a close frame
  liveness_.received(std::chrono::steady_clock::now());
  read_.feed(chunk.data(), n);
  take_incoming();
  if (read_.waiting() && !closing()) on_messages();
}

void Connection::parse_early() {
  if (finished() || closing()) return read_.close();  // its early bytes go unparsed
  if (!read_.feed_early()) return;
  take_incoming();  // then reads the socket, when there is room
  if (read_.waiting() && !closing()) on_messages();
}

// Acts on what the read side takes; reads the socket again while it has room.
void Connection::take_incoming() {
  while (!finished()) {
    auto in = read_.take(write_.queued_bytes());
    if (!in) break;
    if (in->kind == Incoming::Kind::ping) {
      write_.send_control(Opcode::pong, std::move(in->payload));
      continue;
    }
    if (in->kind == Incoming::Kind::close) return on_peer_close(in->code);
    // A failure. The bytes that follow cannot be trusted: close without waiting for an answer.
    log::limited(log::Level::info, "websocket protocol error", about({{"error", in->payload}}));
    write_.drop_unstarted();  // the close goes out next (a frame partly written is finished first)
    return close_with(in->code, in->payload);
  }
  if (read_.room(write_.queued_bytes())) do_read();
}

// Frames left the queue after reading paused on it: read again, after the handler that
// consumed them returned (it may be the protocol's own send, inside its message loop).
void Connection::resume_reading() {
  read_.unpause();
  if (finished() || read_.failed()) return;
  if (!reading_) take_incoming();
  if (read_.waiting() && !closing()) on_messages();
}

std::optional<std::optional<std::string>> Connection::next_message() {
  if (closing()) return std::nullopt;
  auto m = read_.next_message();
  if (m && !reading_) take_incoming();
  return m;
}

// --- writing (ws::WriteSide) ------------------------------------------------------------------

void Connection::wait_writable() {
  arm_timer();  // the stall deadline counts while the kernel takes nothing
  socket_.async_wait(
      tcp::socket::wait_write,
      exactly_sized([self = shared_from_this()](error_code ec) { self->write_.on_writable(!ec); }));
}

void Connection::taken(size_t bytes, SendQueue::Taken what) {
  if (bytes > 0) liveness_.taken(std::chrono::steady_clock::now());
  if (what.close_sent) return on_close_sent();
  if (what.popped && !closing()) on_room();
  if (!finished() && read_.resume_due(write_.queued_bytes())) {
    net::post(socket_.get_executor(), [self = shared_from_this()] { self->resume_reading(); });
  }
}

// The connection stays alive while its write waits in the round's batch.
std::shared_ptr<WriteSide> Connection::batch_hold() {
  return std::shared_ptr<WriteSide>(shared_from_this(), &write_);
}

// --- closing ----------------------------------------------------------------------------------

void Connection::close_with(uint16_t code, const std::string& reason) {
  if (close_code_ || peer_close_) return;
  close_code_ = code;
  close_reason_ = std::make_unique<const std::string>(reason);
  on_close_code(code);
  begin_closing();
  liveness_.closing(std::chrono::steady_clock::now());
  arm_timer();
  write_.uncork();  // frames queued before the close (an error frame) go out first
  if (!read_.failed()) take_incoming();  // the tab's answer may be read already
}

// The tab closes: answer with its code after the frame being written (nothing else is sent).
void Connection::on_peer_close(uint16_t code) {
  if (close_sent_) return terminate();  // the answer to our close
  if (peer_close_) return;
  peer_close_ = code;
  if (write_.close_queued()) return;  // our close, on its way, answers it
  begin_closing();
  write_.drop_unstarted();
  liveness_.closing(std::chrono::steady_clock::now());
  arm_timer();
  write_.uncork();
}

void Connection::begin_closing() {
  if (!write_.begin_closing()) return;
  // Refused or closed before being served: what the tab wrote with its request is not acted on
  // (the socket is read again for the close handshake; close_with() reads).
  read_.close();
  on_closing();
}

// Every frame before the close went out: the close follows (the tab's code when answering it).
void Connection::drained() {
  if (peer_close_) {
    write_.send_control(Opcode::close,
                        *peer_close_ == 1005 ? std::string() : close_payload(*peer_close_, ""));
  } else if (close_code_) {
    write_.send_control(
        Opcode::close, close_payload(*close_code_, close_reason_ ? *close_reason_ : std::string()));
  }
}

void Connection::on_close_sent() {
  close_sent_ = true;
  // After answering the tab's close the connection is done; after our own close we wait for the
  // tab's answer (or the close timer).
  if (peer_close_ || read_.failed()) terminate();
}

void Connection::terminate() {
  write_.flush_batched();
  error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  finish();
}

void Connection::finish() {
  if (!write_.finish()) return;
  if (write_.begin_closing()) on_closing();
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
