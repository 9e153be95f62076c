#include "support/tcp_proxy.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>

namespace outlive::testing {

namespace {

int connect_to(const std::string& host, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

TcpProxy::TcpProxy(std::string target_host, int target_port)
    : host_(std::move(target_host)), target_port_(target_port) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(listen_fd_, 64) != 0 ||
      ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    throw std::runtime_error("tcp proxy: cannot listen");
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { accept_loop(); });
}

TcpProxy::~TcpProxy() {
  stopping_ = true;
  if (acceptor_.joinable()) acceptor_.join();
  {
    std::lock_guard lock(mutex_);
    for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
  }
  for (auto& t : pumps_) t.join();
  for (int fd : fds_) ::close(fd);
  ::close(listen_fd_);
}

void TcpProxy::accept_loop() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    const int server = connect_to(host_, target_port_);
    if (server < 0) {
      ::close(client);
      continue;
    }
    std::lock_guard lock(mutex_);
    fds_.push_back(client);
    fds_.push_back(server);
    pumps_.emplace_back([this, client, server] { pump(client, server); });
    pumps_.emplace_back([this, client, server] { pump(server, client); });
  }
}

// While blackholed nothing is read: the bytes wait in the kernel's buffers, both ends stay open.
void TcpProxy::pump(int from, int to) {
  char buf[16384];
  while (!stopping_) {
    pollfd p{from, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0 || blackholed_) continue;
    const ssize_t n = ::read(from, buf, sizeof buf);
    if (n <= 0) break;
    for (ssize_t off = 0; off < n;) {
      const ssize_t w = ::send(to, buf + off, static_cast<size_t>(n - off), MSG_NOSIGNAL);
      if (w <= 0) {
        off = n;
        break;
      }
      off += w;
    }
  }
  // One side closed: so does the other, as a direct connection would.
  ::shutdown(to, SHUT_RDWR);
  ::shutdown(from, SHUT_RDWR);
}

int port_of(const std::string& url) {
  const auto at = url.find('@');
  const auto host_start = at == std::string::npos ? url.find("://") + 3 : at + 1;
  const auto colon = url.find(':', host_start);
  return std::stoi(url.substr(colon + 1));
}

std::string via_port(const std::string& url, int port) {
  const auto at = url.find('@');
  const auto host_start = at == std::string::npos ? url.find("://") + 3 : at + 1;
  const auto colon = url.find(':', host_start);
  auto end = url.find_first_not_of("0123456789", colon + 1);
  if (end == std::string::npos) end = url.size();
  return url.substr(0, host_start) + "127.0.0.1:" + std::to_string(port) + url.substr(end);
}

}  // namespace outlive::testing
