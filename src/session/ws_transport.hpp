#pragma once
// A session served over a websocket: ws::Connection (which knows nothing of tabs) as a
// session::Transport.
#include "session/transport.hpp"
#include "ws/connection.hpp"

namespace outlive::session {

class WsTransport final : public ws::Connection, public Transport {
 public:
  WsTransport(tcp::socket&& socket, const ws::ConnectionSettings& settings)
      : ws::Connection(std::move(socket), settings) {}

  void start(Events& events, std::shared_ptr<void> owner, std::string early) override {
    events_ = &events;
    owner_ = std::move(owner);
    start_transport(std::move(early));
  }
  void detach() override { events_ = nullptr; }
  boost::asio::any_io_executor executor() override { return ws::Connection::executor(); }

  void send(ws::Frame frame) override { ws::Connection::send(std::move(frame)); }
  size_t queued_bytes() const override { return ws::Connection::queued_bytes(); }
  void cork() override { ws::Connection::cork(); }
  void uncork() override { ws::Connection::uncork(); }
  void close_with(uint16_t code, const std::string& reason) override {
    ws::Connection::close_with(code, reason);
  }
  void terminate() override { ws::Connection::terminate(); }
  bool closing() const override { return ws::Connection::closing(); }
  bool finished() const override { return ws::Connection::finished(); }
  void set_deadline(std::chrono::steady_clock::time_point at) override {
    ws::Connection::set_deadline(at);
  }
  void clear_deadline() override { ws::Connection::clear_deadline(); }
  void parse_early() override { ws::Connection::parse_early(); }
  std::optional<std::optional<std::string>> next_message() override {
    return ws::Connection::next_message();
  }

 private:
  void on_messages() override {
    if (events_) events_->on_messages();
  }
  void on_room() override {
    if (events_) events_->on_room();
  }
  void on_closing() override {
    if (events_) events_->on_closing();
  }
  void on_finished() override {
    if (events_) events_->on_finished();
    // Let go of the session after the caller's handler has returned, not inside it.
    if (owner_) boost::asio::post(ws::Connection::executor(), [keep = std::move(owner_)] {});
  }
  void on_close_code(uint16_t code) override {
    if (events_) events_->on_close_code(code);
  }
  void on_deadline() override {
    if (events_) events_->on_deadline();
  }
  void describe(nlohmann::json& fields) const override {
    if (events_) events_->describe(fields);
  }

  Events* events_ = nullptr;
  std::shared_ptr<void> owner_;  // the session, until finished
};

}  // namespace outlive::session
