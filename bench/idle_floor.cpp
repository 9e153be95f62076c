// The floor for bench/idle_memory: the least a user-space websocket server on Asio keeps per idle
// socket — the accepted socket, its registration with the reactor and one pending read wait, and
// nothing else (no protocol, no subscription, no timer). idle_memory runs it as a child process
// beside the replica, connects the same number of plain TCP sockets, and reads its RSS.
//
//   build/bench/idle_floor PORT
#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include <boost/asio.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {
struct Server {
  net::io_context io{1};
  tcp::acceptor acceptor{io};
  std::vector<std::unique_ptr<tcp::socket>> sockets;

  void accept() {
    acceptor.async_accept([this](boost::system::error_code ec, tcp::socket s) {
      if (ec) return;
      sockets.push_back(std::make_unique<tcp::socket>(std::move(s)));
      auto* socket = sockets.back().get();
      socket->async_wait(tcp::socket::wait_read, [](boost::system::error_code) {});
      accept();
    });
  }
};
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: idle_floor PORT\n");
    return 2;
  }
  Server server;
  const tcp::endpoint at(net::ip::make_address("127.0.0.1"),
                         static_cast<unsigned short>(std::stoi(argv[1])));
  server.acceptor.open(at.protocol());
  server.acceptor.set_option(net::socket_base::reuse_address(true));
  server.acceptor.bind(at);
  server.acceptor.listen(net::socket_base::max_listen_connections);
  server.accept();
  std::printf("listening\n");
  std::fflush(stdout);
  server.io.run();
}
