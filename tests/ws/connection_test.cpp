// ws::Connection on a real loopback socket, in-process (no services): what keeps a connection
// alive. Hermetic apart from the loopback socket.
#include <catch2/catch.hpp>

#include "ws/connection.hpp"

using namespace outlive::ws;
using namespace std::chrono_literals;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

// A protocol that takes no message: its inbox fills and the connection stops reading.
struct Idle : Connection {
  using Connection::Connection;
  void on_messages() override {}
  void on_finished() override { finished = true; }
  bool finished = false;
};

std::string masked_text(const std::string& payload) {
  std::string f;
  f += char(0x81);
  f += char(0x80 | payload.size());  // < 126
  const char mask[4] = {1, 2, 3, 4};
  f.append(mask, 4);
  for (size_t i = 0; i < payload.size(); ++i) f += char(payload[i] ^ mask[i % 4]);
  return f;
}

}  // namespace

TEST_CASE("a connection that waits for nothing but its deadlines lives until it finishes") {
  // Its inbox full (24 messages the protocol does not take), it reads nothing more: no read
  // wait holds it, only its deadlines do (here the idle drop after 400 ms of silence).
  net::io_context io(1);
  tcp::acceptor acceptor(io, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
  tcp::socket client(io);
  client.connect(acceptor.local_endpoint());
  tcp::socket accepted = acceptor.accept();

  ConnectionSettings settings;
  settings.ping_interval = 200ms;
  settings.idle_timeout = 400ms;
  auto c = std::make_shared<Idle>(std::move(accepted), settings);
  c->start_transport();
  std::weak_ptr<Idle> weak = c;
  c.reset();  // nobody else holds it

  std::string frames;
  for (int i = 0; i < 30; ++i) frames += masked_text("{\"n\":" + std::to_string(i) + "}");
  net::write(client, net::buffer(frames));
  const auto start = std::chrono::steady_clock::now();
  io.run_for(150ms);
  INFO("after 150 ms: the inbox is full and nothing is read");
  REQUIRE_FALSE(weak.expired());
  CHECK_FALSE(weak.lock()->finished);

  // Silent past idle_timeout: dropped (1001), finished, and then let go.
  while (!weak.expired() && std::chrono::steady_clock::now() - start < 10s) io.run_for(50ms);
  CHECK(weak.expired());
  CHECK(std::chrono::steady_clock::now() - start >= 400ms);
}
