#pragma once
// A session served over Server-Sent Events (SPEC 5.9): the session::Transport of a plain HTTP
// response that stays open. Each text frame a websocket would receive is one event; a close is
// `event: close` with the websocket close code, then the end of the response; a refusal before
// the viewer is admitted is an HTTP status instead (401/403/429/503), since the 200 is written
// only once the session admits the viewer. The tab's messages are the sub messages of its
// request, handed to the session as if the tab had sent them. Keep-alive comments, the stream's
// rotation after max_duration (1012) and the stall deadline are its own timers.
#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include <array>
#include <boost/asio.hpp>
#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "session/transport.hpp"

namespace outlive::sse {

struct StreamSettings {
  std::chrono::milliseconds keep_alive{15000};     // a `: ping` comment this often
  std::chrono::milliseconds max_duration{600000};  // server.sse_max_seconds, then 1012
  // A stream whose kernel takes no byte this long while events wait is dropped (as a socket's).
  std::chrono::milliseconds stall_timeout{30000};
  // Our close waits this long to be written, then TCP is closed.
  std::chrono::milliseconds close_timeout{5000};
};

class Stream final : public session::Transport, public std::enable_shared_from_this<Stream> {
 public:
  using tcp = boost::asio::ip::tcp;
  // `messages`: the sub messages of the request (and an auth message first for a POST's token).
  Stream(tcp::socket&& socket, const StreamSettings& settings, std::vector<std::string> messages);
  ~Stream() override;

  void start(Events& events, std::shared_ptr<void> owner, std::string early) override;
  void detach() override { events_ = nullptr; }
  boost::asio::any_io_executor executor() override { return socket_.get_executor(); }

  void send(ws::Frame frame) override;
  size_t queued_bytes() const override { return queued_.size() + writing_.size() - written_; }
  void cork() override { corked_ = true; }
  void uncork() override {
    corked_ = false;
    write();
  }
  void close_with(uint16_t code, const std::string& reason) override;
  void terminate() override { finish(); }
  bool closing() const override { return closing_; }
  bool finished() const override { return finished_; }
  void set_deadline(std::chrono::steady_clock::time_point at) override;
  void clear_deadline() override;
  void admitted() override;
  void parse_early() override;
  std::optional<std::optional<std::string>> next_message() override;

 private:
  void begin_closing();
  void write();
  void on_written(boost::system::error_code ec, size_t bytes);
  void read();
  void tick();
  void finish();
  // A refusal before the 200: the HTTP status, then the end of the connection.
  void respond_refusal(uint16_t code, const std::string& reason);

  tcp::socket socket_;
  const StreamSettings settings_;
  std::deque<std::string> messages_;
  Events* events_ = nullptr;
  std::shared_ptr<void> owner_;        // the session, until finished
  std::shared_ptr<Stream> self_;       // until finished, as a pending read used to hold a socket
  boost::asio::steady_timer deadline_;  // the session's
  boost::asio::steady_timer tick_;      // keep-alive and stall
  boost::asio::steady_timer rotation_;  // max_duration, then the close timeout
  uint32_t deadline_generation_ = 0;
  std::string queued_;   // events not yet handed to the kernel
  std::string writing_;  // the write in flight, from written_
  size_t written_ = 0;
  std::string refusal_body_;  // the last frame before the 200 (the refusal's error frame)
  std::chrono::steady_clock::time_point last_taken_{};
  std::array<char, 512> discard_{};  // what the client writes after its request is not read
  bool header_sent_ = false;
  bool messages_open_ = false;
  bool corked_ = false;
  bool write_running_ = false;
  bool closing_ = false;
  bool close_queued_ = false;  // the close event (or the refusal) is the last thing queued
  bool finished_ = false;
};

}  // namespace outlive::sse
