// ws::SendBatch with real loopback sockets, in-process: a round's writes leave together at its
// end, arrive whole and in order, and a socket the kernel cannot take everything from waits for
// room as it does when it writes for itself. Hermetic apart from the loopback sockets.
#include <catch2/catch.hpp>

#include <linux/io_uring.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "ws/connection.hpp"
#include "ws/send_batch.hpp"

using namespace outlive::ws;
using namespace std::chrono_literals;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

// io_uring is expected when this build has it, it is switched on, and this kernel lets the test's
// own process set one up (the raw system call: no liburing here). Then a round that does not batch
// is a failure, not a warning.
bool io_uring_expected() {
  if (!SendBatch::built_with_io_uring() || !SendBatch::enabled()) return false;
  io_uring_params params{};
  const long fd = ::syscall(__NR_io_uring_setup, 4, &params);
  if (fd < 0) return false;
  ::close(static_cast<int>(fd));
  return true;
}

struct Sender : Connection {
  using Connection::Connection;
  using Connection::send_text;
  using Connection::terminate;
  void on_messages() override {}
};

// The text payloads of the unmasked frames in `bytes`; what is left of an unfinished one stays.
std::vector<std::string> take_frames(std::string& bytes) {
  std::vector<std::string> out;
  for (;;) {
    if (bytes.size() < 2) break;
    size_t length = uint8_t(bytes[1]) & 0x7F, at = 2;
    if (length == 126) {
      if (bytes.size() < 4) break;
      length = (size_t(uint8_t(bytes[2])) << 8) | uint8_t(bytes[3]);
      at = 4;
    } else if (length == 127) {
      if (bytes.size() < 10) break;
      length = 0;
      for (int i = 0; i < 8; ++i) length = (length << 8) | uint8_t(bytes[size_t(2 + i)]);
      at = 10;
    }
    if (bytes.size() < at + length) break;
    out.push_back(bytes.substr(at, length));
    bytes.erase(0, at + length);
  }
  return out;
}

struct Pair {
  tcp::socket client;
  std::shared_ptr<Sender> server;
  std::string bytes;
  std::vector<std::string> frames;
};

std::vector<Pair> open_pairs(net::io_context& io, int count, const ConnectionSettings& settings,
                             int send_buffer = 0) {
  tcp::acceptor acceptor(io, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
  std::vector<Pair> pairs;
  for (int i = 0; i < count; ++i) {
    tcp::socket client(io);
    client.open(tcp::v4());
    if (send_buffer > 0) client.set_option(net::socket_base::receive_buffer_size(send_buffer));
    client.connect(acceptor.local_endpoint());
    tcp::socket accepted = acceptor.accept();
    if (send_buffer > 0) accepted.set_option(net::socket_base::send_buffer_size(send_buffer));
    auto server = std::make_shared<Sender>(std::move(accepted), settings);
    server->start_transport();
    pairs.push_back(Pair{std::move(client), server, {}, {}});
  }
  return pairs;
}

// Runs `io` and reads every client until each holds `expected` frames or 10 s passed.
void read_until(net::io_context& io, std::vector<Pair>& pairs, size_t expected) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  char buf[65536];
  for (;;) {
    io.run_for(5ms);
    bool all = true;
    for (auto& p : pairs) {
      boost::system::error_code ec;
      while (p.client.available(ec) > 0) {
        const size_t n = p.client.read_some(net::buffer(buf), ec);
        if (ec) break;
        p.bytes.append(buf, n);
      }
      for (auto& f : take_frames(p.bytes)) p.frames.push_back(std::move(f));
      all = all && p.frames.size() >= expected;
    }
    if (all || std::chrono::steady_clock::now() > deadline) return;
  }
}

// Each connection holds itself until it finishes: terminate them and run until all are gone.
void close_all(net::io_context& io, std::vector<Pair>& pairs) {
  std::vector<std::weak_ptr<Sender>> gone;
  for (auto& p : pairs) {
    gone.push_back(p.server);
    net::post(io, [s = p.server] { s->terminate(); });
    p.server.reset();
  }
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  auto all_gone = [&] {
    return std::all_of(gone.begin(), gone.end(), [](auto& w) { return w.expired(); });
  };
  while (!all_gone() && std::chrono::steady_clock::now() < deadline) io.run_for(5ms);
  CHECK(all_gone());
}

size_t available(Pair& p) {
  boost::system::error_code ec;
  return p.client.available(ec);
}

}  // namespace

TEST_CASE("a round's writes leave together at its end and arrive whole and in order") {
  net::io_context io(1);
  ConnectionSettings settings;
  auto pairs = open_pairs(io, 300, settings);  // more than one submission (128 sockets each)
  size_t before_end = 0;
  bool batched = false;
  net::post(io, [&] {
    SendBatch::Scope round;
    batched = SendBatch::open_here() != nullptr;
    for (size_t i = 0; i < pairs.size(); ++i) {
      for (int k = 0; k < 3; ++k)
        pairs[i].server->send_text("{\"socket\":" + std::to_string(i) +
                                   ",\"k\":" + std::to_string(k) + "}");
    }
    for (auto& p : pairs) before_end += available(p);
  });
  read_until(io, pairs, 3);
  if (io_uring_expected()) REQUIRE(batched);
  if (!batched) WARN("io_uring is not available here: the sockets wrote for themselves");
  if (batched) {
    INFO("inside the round nothing was written yet");
    CHECK(before_end == 0);
    CHECK(SendBatch::in_use());
  }
  for (size_t i = 0; i < pairs.size(); ++i) {
    INFO("socket " << i);
    REQUIRE(pairs[i].frames.size() == 3);
    for (int k = 0; k < 3; ++k)
      CHECK(pairs[i].frames[size_t(k)] ==
            "{\"socket\":" + std::to_string(i) + ",\"k\":" + std::to_string(k) + "}");
  }
  close_all(io, pairs);
}

TEST_CASE("a batched socket the kernel cannot take everything from waits for room") {
  // Small buffers and a client that reads nothing during the round: the batched write is
  // partial; the rest leaves once the client reads, in order, with nothing lost.
  net::io_context io(1);
  ConnectionSettings settings;
  auto pairs = open_pairs(io, 4, settings, 8192);
  const std::string filler(16000, 'x');
  net::post(io, [&] {
    SendBatch::Scope round;
    for (size_t i = 0; i < pairs.size(); ++i) {
      for (int k = 0; k < 40; ++k)  // 640 KB per socket: far more than both buffers hold
        pairs[i].server->send_text(std::to_string(k) + ":" + filler);
    }
  });
  read_until(io, pairs, 40);
  for (size_t i = 0; i < pairs.size(); ++i) {
    INFO("socket " << i);
    REQUIRE(pairs[i].frames.size() == 40);
    for (int k = 0; k < 40; ++k)
      CHECK(pairs[i].frames[size_t(k)] == std::to_string(k) + ":" + filler);
  }
  close_all(io, pairs);
}

TEST_CASE("a round flushed between sockets sends its first sockets' frames before its end") {
  net::io_context io(1);
  ConnectionSettings settings;
  auto pairs = open_pairs(io, 300, settings);
  size_t first = 0, last = 0;
  bool batched = false;
  net::post(io, [&] {
    SendBatch::Scope round;
    batched = SendBatch::open_here() != nullptr;
    for (size_t i = 0; i < pairs.size(); ++i) {
      pairs[i].server->send_text("{\"socket\":" + std::to_string(i) + "}");
      round.flush_if_full();  // after 128 and 256 sockets
    }
    first = available(pairs.front());
    last = available(pairs.back());
  });
  read_until(io, pairs, 1);
  if (io_uring_expected()) REQUIRE(batched);
  if (batched) {
    CHECK(first > 0);  // left with the first 128
    CHECK(last == 0);  // waits for the round's end
  }
  for (size_t i = 0; i < pairs.size(); ++i) {
    REQUIRE(pairs[i].frames.size() == 1);
    CHECK(pairs[i].frames[0] == "{\"socket\":" + std::to_string(i) + "}");
  }
  close_all(io, pairs);
}

TEST_CASE("with batching off a round's sockets write at once") {
  net::io_context io(1);
  ConnectionSettings settings;
  auto pairs = open_pairs(io, 8, settings);
  SendBatch::enable(false);
  size_t before_end = 0;
  net::post(io, [&] {
    SendBatch::Scope round;
    CHECK(SendBatch::open_here() == nullptr);
    for (auto& p : pairs) p.server->send_text("now");
    for (auto& p : pairs) before_end += available(p);
  });
  read_until(io, pairs, 1);
  SendBatch::enable(true);
  CHECK(before_end > 0);  // written inside the round (loopback delivers within the sendmsg)
  for (auto& p : pairs) {
    REQUIRE(p.frames.size() == 1);
    CHECK(p.frames[0] == "now");
  }
  close_all(io, pairs);
}
