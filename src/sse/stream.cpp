#include "sse/stream.hpp"

#include "sse/framing.hpp"

namespace outlive::sse {

namespace net = boost::asio;
using error_code = boost::system::error_code;
using Clock = std::chrono::steady_clock;

namespace {
// While corked, events wait for the end of the round unless this much waits already (as
// ws::SendQueue::kCorkedBytes).
constexpr size_t kCorkedBytes = 64 * 1024;

const char* reason_phrase(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 429: return "Too Many Requests";
    default: return "Service Unavailable";
  }
}
}  // namespace

Stream::Stream(tcp::socket&& socket, const StreamSettings& settings,
               std::vector<std::string> messages)
    : socket_(std::move(socket)),
      settings_(settings),
      messages_(std::make_move_iterator(messages.begin()), std::make_move_iterator(messages.end())),
      deadline_(socket_.get_executor()),
      tick_(socket_.get_executor()),
      rotation_(socket_.get_executor()) {}

Stream::~Stream() = default;

void Stream::start(Events& events, std::shared_ptr<void> owner, std::string) {
  events_ = &events;
  owner_ = std::move(owner);
  self_ = shared_from_this();
  last_taken_ = Clock::now();
  read();  // notices a client that goes away, before and after the 200
  rotation_.expires_after(settings_.max_duration);
  rotation_.async_wait([w = weak_from_this()](error_code ec) {
    auto s = w.lock();
    if (ec || !s || s->closing_) return;
    s->close_with(1012, "stream rotation: open a new one from your cursors");
  });
}

// --- the session's messages -------------------------------------------------------------------

void Stream::parse_early() {
  if (messages_open_ || closing_) return;
  messages_open_ = true;
  if (!messages_.empty() && events_) events_->on_messages();
}

std::optional<std::optional<std::string>> Stream::next_message() {
  if (!messages_open_ || closing_ || messages_.empty()) return std::nullopt;
  auto m = std::move(messages_.front());
  messages_.pop_front();
  return std::optional<std::string>(std::move(m));
}

// --- writing ----------------------------------------------------------------------------------

void Stream::admitted() {
  if (header_sent_ || closing_) return;
  header_sent_ = true;
  // No length and no chunking: the response ends when the connection does (Connection: close),
  // which is how every EventSource and fetch reads it.
  queued_.insert(0,
                 "HTTP/1.1 200 OK\r\nServer: outlive\r\nContent-Type: text/event-stream\r\n"
                 "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\nConnection: close\r\n\r\n");
  tick();
  write();
}

void Stream::send(ws::Frame frame) {
  if (closing_) return;
  const std::string_view own = frame.own;
  const std::string_view head = frame.head ? std::string_view(*frame.head) : std::string_view();
  const std::string_view shared =
      frame.shared ? std::string_view(*frame.shared) : std::string_view();
  if (!header_sent_) {
    // Before the viewer is admitted only a refusal's error frame is sent: it becomes the body of
    // the HTTP status.
    refusal_body_ = std::string(own) + std::string(head) + std::string(shared);
    return;
  }
  append_event(queued_, {own, head, shared});
  write();
}

void Stream::write() {
  if (write_running_ || finished_ || (!header_sent_ && !close_queued_)) return;
  if (queued_.empty()) {
    // Everything before the close went out: the response ends.
    if (close_queued_) {
      error_code ignored;
      socket_.shutdown(tcp::socket::shutdown_send, ignored);
      finish();
    }
    return;
  }
  if (corked_ && queued_.size() < kCorkedBytes && !close_queued_) return;
  // The kernel took everything written before: a stall counts from now.
  last_taken_ = Clock::now();
  writing_.swap(queued_);
  queued_.clear();
  written_ = 0;
  write_running_ = true;
  socket_.async_write_some(
      net::buffer(writing_),
      [self = shared_from_this()](error_code ec, size_t n) { self->on_written(ec, n); });
}

void Stream::on_written(error_code ec, size_t bytes) {
  write_running_ = false;
  if (ec || finished_) return finish();  // the client went away
  if (bytes > 0) last_taken_ = Clock::now();
  written_ += bytes;
  if (written_ < writing_.size()) {
    write_running_ = true;
    socket_.async_write_some(
        net::buffer(writing_.data() + written_, writing_.size() - written_),
        [self = shared_from_this()](error_code e, size_t n) { self->on_written(e, n); });
    return;
  }
  writing_.clear();
  written_ = 0;
  if (!closing_ && events_) events_->on_room();
  write();
}

// Keep-alive comments, so gateways with an idle timeout keep the stream; and the stall deadline.
void Stream::tick() {
  tick_.expires_after(std::min(settings_.keep_alive, settings_.stall_timeout));
  tick_.async_wait([w = weak_from_this()](error_code ec) {
    auto s = w.lock();
    if (ec || !s || s->finished_) return;
    if (s->write_running_ && Clock::now() - s->last_taken_ >= s->settings_.stall_timeout) {
      if (s->events_) s->events_->on_close_code(1013);
      return s->finish();  // it reads nothing: a close event could not reach it either
    }
    if (!s->closing_) {
      s->queued_ += kKeepAlive;
      s->write();
    }
    s->tick();
  });
}

// --- reading: only to notice the end ----------------------------------------------------------

void Stream::read() {
  socket_.async_read_some(net::buffer(discard_),
                          [self = shared_from_this()](error_code ec, size_t) {
                            if (self->finished_) return;
                            if (ec) return self->finish();  // the client went away
                            self->read();
                          });
}

// --- deadlines --------------------------------------------------------------------------------

void Stream::set_deadline(Clock::time_point at) {
  deadline_.expires_at(at);
  deadline_.async_wait([w = weak_from_this(), g = ++deadline_generation_](error_code ec) {
    auto s = w.lock();
    if (ec || !s || s->finished_ || g != s->deadline_generation_) return;
    if (s->events_) s->events_->on_deadline();
  });
}

void Stream::clear_deadline() {
  ++deadline_generation_;
  deadline_.cancel();
}

// --- closing ----------------------------------------------------------------------------------

void Stream::begin_closing() {
  if (closing_) return;
  closing_ = true;
  if (events_) events_->on_closing();
}

void Stream::close_with(uint16_t code, const std::string& reason) {
  if (closing_ || finished_) return;
  if (events_) events_->on_close_code(code);
  begin_closing();
  if (!header_sent_) return respond_refusal(code, reason);
  queued_ += close_event(code, reason);
  close_queued_ = true;
  corked_ = false;
  // A client that reads nothing does not keep the stream past the close timeout.
  rotation_.expires_after(settings_.close_timeout);
  rotation_.async_wait([w = weak_from_this()](error_code ec) {
    if (auto s = w.lock(); s && !ec) s->finish();
  });
  write();
}

void Stream::respond_refusal(uint16_t code, const std::string& reason) {
  const int status = refusal_status(code, reason);
  std::string body = refusal_body_.empty()
                         ? nlohmann::json{{"code", code}, {"reason", reason}}.dump()
                         : std::move(refusal_body_);
  queued_ = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) +
            "\r\nServer: outlive\r\nContent-Type: application/json\r\nCache-Control: no-store\r\n";
  if (status == 429 || status == 503) queued_ += "Retry-After: 1\r\n";
  queued_ += "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  queued_ += body;
  close_queued_ = true;
  rotation_.expires_after(settings_.close_timeout);
  rotation_.async_wait([w = weak_from_this()](error_code ec) {
    if (auto s = w.lock(); s && !ec) s->finish();
  });
  write();
}

void Stream::finish() {
  if (finished_) return;
  finished_ = true;
  begin_closing();
  error_code ignored;
  deadline_.cancel();
  tick_.cancel();
  rotation_.cancel();
  socket_.close(ignored);  // pending waits end
  if (events_) events_->on_finished();
  // Let go after the caller's handler has returned, not inside it.
  net::post(socket_.get_executor(), [owner = std::move(owner_), self = std::move(self_)] {});
}

}  // namespace outlive::sse
