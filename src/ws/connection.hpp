#pragma once
// A websocket connection after the upgrade (the transport): it reads the socket into its ReadSide
// (the tab's frames assembled, at most max_waiting_messages waiting), writes through its WriteSide
// (frames already framed, one writev for all that wait, or its thread's SendBatch during a round),
// runs the close handshake, and drops a connection its Liveness finds silent (1001), stalled
// (1013) or not answering our close. It knows nothing of tabs: the
// protocol (session::Session) is served over it through session::WsTransport.
// Every member runs on the connection's io thread (ws::IoThreads): its handlers never overlap.
#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "ws/deadlines.hpp"
#include "ws/framing.hpp"
#include "ws/liveness.hpp"
#include "ws/read_side.hpp"
#include "ws/send_batch.hpp"
#include "ws/write_side.hpp"

namespace outlive::ws {

enum CloseCode : uint16_t {
  kGoingAway = 1001,
  kPolicy = 1008,
  kTooBig = 1009,
  kInternal = 1011,
  kRestart = 1012,
  kTryAgain = 1013,
  kTokenExpired = 4401,  // SPEC 5.7 rev 4: the socket's JWT expired without a refresh
};

// WriteSide::Owner first: as the primary base it shares the connection's vtable pointer.
class Connection : private WriteSide::Owner, public std::enable_shared_from_this<Connection> {
 public:
  using tcp = boost::asio::ip::tcp;
  // Open while the wheel fires a slot's deadlines: the pings due together leave in one batch.
  using DeadlineScope = SendBatch::Scope;
  // `settings` are shared by every connection and outlive them.
  Connection(tcp::socket&& socket, const ConnectionSettings& settings);
  virtual ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Starts reading and the liveness timer. `early`: bytes the tab wrote behind its upgrade request
  // and that were read with it (a client that does not wait for the 101). They come before
  // anything read later, so until the protocol calls parse_early() the socket is not read; a
  // close before that drops them unparsed (the tab could not know whether it would be served).
  void start_transport(std::string early = {});
  boost::asio::any_io_executor executor() { return socket_.get_executor(); }

 protected:
  // --- for the protocol ---
  void send(Frame frame) { write_.send(std::move(frame)); }
  void send_text(std::string text) { send(Frame::text(std::move(text))); }
  size_t queued_bytes() const { return write_.queued_bytes(); }
  // While corked, frames queue and leave together at uncork() (unless 64 KiB wait already).
  void cork() { write_.cork(); }
  void uncork() { write_.uncork(); }
  // Sends a close with `code` after the frames queued before it; waits for the tab's answer.
  void close_with(uint16_t code, const std::string& reason);
  // Drops the connection at once (after the peer vanished, or on a stall).
  void terminate();
  bool closing() const { return write_.closing(); }
  bool finished() const { return write_.finished(); }
  // The protocol's one deadline, among the connection's (a timer of its own would cost a timer
  // and a pending wait per socket): on_deadline() runs once it passed. A new one replaces it.
  void set_deadline(std::chrono::steady_clock::time_point at) {
    liveness_.set_deadline(at);
    arm_timer();
  }
  void clear_deadline() { liveness_.clear_deadline(); }
  // The tab is served: the bytes it wrote with its upgrade request are parsed (with every limit
  // of later ones), then the socket is read.
  void parse_early();
  // The next message the tab sent (nullopt inside: a binary message); nullopt when none waits.
  std::optional<std::optional<std::string>> next_message();

  // --- what the protocol is told ---
  virtual void on_messages() = 0;               // messages wait (next_message)
  virtual void on_room() {}                     // frames left the queue
  virtual void on_closing() {}                  // closing began: nothing new starts
  virtual void on_finished() {}                 // the connection is done
  virtual void on_close_code(uint16_t code) {}  // we close with `code` (metrics)
  virtual void on_deadline() {}                 // the deadline set_deadline() set passed

  // The fields of this socket's log lines (log::limited), with `extra`: the protocol's describe()
  // adds app, peer and socket id, so an operator can tell one tab's trouble from many tabs'.
  nlohmann::json about(nlohmann::json extra = nlohmann::json::object()) const {
    describe(extra);
    return extra;
  }
  virtual void describe(nlohmann::json& fields) const {}

 private:
  void do_read();
  void on_readable(boost::system::error_code ec);
  void take_incoming();
  void resume_reading();
  void on_peer_close(uint16_t code);
  // --- what the write side is told (WriteSide::Owner) ---
  void wait_writable() override;
  void taken(size_t bytes, SendQueue::Taken what) override;
  void drained() override;
  void write_failed() override { finish(); }
  std::shared_ptr<WriteSide> batch_hold() override;
  void begin_closing();
  void on_close_sent();
  void finish();
  // One deadline per connection in its thread's wheel for every deadline (ping, idle, stall,
  // close, the protocol's): armed at the earliest.
  void arm_timer();
  friend class DeadlineWheel<Connection>;
  void on_deadline_entry(uint32_t generation);
  void on_timer();
  void on_stall();

  tcp::socket socket_;
  // Held from start_transport() to finish(), as a pending timer wait used to: the wheel keeps
  // only a weak reference, and a connection that waits for nothing but a deadline (a full inbox,
  // the credential lookup's retry) would otherwise have no owner.
  std::shared_ptr<Connection> self_;
  ReadSide read_;
  DeadlineWheel<Connection>& deadlines_;
  Liveness liveness_;
  std::chrono::steady_clock::time_point timer_expiry_;
  WriteSide write_;
  // Re-arming bumps it: a deadline armed before it was replaced is ignored.
  uint32_t timer_generation_ = 0;
  bool timer_armed_ = false;
  bool reading_ = false;
  bool close_sent_ = false;
  std::optional<uint16_t> peer_close_;
  std::optional<uint16_t> close_code_;
  std::unique_ptr<const std::string> close_reason_;  // (heap: only once closing)
};

}  // namespace outlive::ws
