#pragma once
// What a session (the tab protocol: subscriptions, cursors, catch-up, access) needs of the
// connection it is served over, so the same session serves a websocket (session::WsTransport) and
// a Server-Sent Events stream (sse::Stream, SPEC 5.9); a third transport is one class beside them.
// Every member runs on the transport's io thread.
#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include <boost/asio/any_io_executor.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "ws/send_queue.hpp"

namespace outlive::session {

class Transport {
 public:
  // What the transport tells its session.
  class Events {
   public:
    virtual void on_messages() = 0;               // messages wait (next_message)
    virtual void on_room() = 0;                   // frames left the queue
    virtual void on_closing() = 0;                // closing began: nothing new starts
    virtual void on_finished() = 0;               // the connection is done
    virtual void on_close_code(uint16_t code) = 0;  // we close with `code` (metrics)
    virtual void on_deadline() = 0;               // the deadline set_deadline() set passed
    virtual void describe(nlohmann::json& fields) const = 0;  // fields of its log lines

   protected:
    ~Events() = default;
  };

  virtual ~Transport() = default;

  // Starts serving `events`; `owner` (the session) is kept until the connection finished, as the
  // connection is what keeps a session that waits for nothing else alive. `early`: bytes read
  // behind the request, parsed once parse_early() is called.
  virtual void start(Events& events, std::shared_ptr<void> owner, std::string early) = 0;
  // The session is going away: no event after this.
  virtual void detach() = 0;
  virtual boost::asio::any_io_executor executor() = 0;

  // A text message of the tab protocol (one frame; Frame carries a websocket header that other
  // transports ignore, so an update's shared bytes are serialised once for every transport).
  virtual void send(ws::Frame frame) = 0;
  virtual size_t queued_bytes() const = 0;  // the back-pressure delivery looks at
  // While corked, frames queue and leave together at uncork().
  virtual void cork() = 0;
  virtual void uncork() = 0;
  // Ends the connection with a websocket close code (or its equivalent) after what is queued.
  virtual void close_with(uint16_t code, const std::string& reason) = 0;
  virtual void terminate() = 0;  // drops the connection at once
  virtual bool closing() const = 0;
  virtual bool finished() const = 0;
  // The session's one deadline (on_deadline); a new one replaces it.
  virtual void set_deadline(std::chrono::steady_clock::time_point at) = 0;
  virtual void clear_deadline() = 0;
  // The viewer is admitted: a transport that answers refusals with a status of its own (SSE)
  // commits to serving the stream now.
  virtual void admitted() {}
  // The tab's messages may be read now (and those that came with the request parsed).
  virtual void parse_early() = 0;
  // The next message from the tab (nullopt inside: a binary message); nullopt when none waits.
  virtual std::optional<std::optional<std::string>> next_message() = 0;
};

}  // namespace outlive::session
