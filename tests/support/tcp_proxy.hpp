#pragma once
// A TCP forwarder between a process under test and a service (Postgres, NATS) that can blackhole
// the traffic without closing a socket: a network partition that TCP does not notice, where both
// ends keep their connections and simply hear nothing. Bytes sent meanwhile are held, not lost,
// and flow once the blackhole ends (as TCP's retransmissions would deliver them).
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace outlive::testing {

class TcpProxy {
 public:
  // Listens on 127.0.0.1 on a free port; every connection is forwarded to target_host:target_port.
  TcpProxy(std::string target_host, int target_port);
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  int port() const { return port_; }
  void blackhole(bool on) { blackholed_ = on; }

 private:
  void accept_loop();
  void pump(int from, int to);

  std::string host_;
  int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> blackholed_{false};
  std::atomic<bool> stopping_{false};
  std::mutex mutex_;
  std::vector<int> fds_;
  std::vector<std::thread> pumps_;
  std::thread acceptor_;
};

// `url` with its host:port replaced by 127.0.0.1:`port` (postgresql://u@h:p/db, nats://h:p).
std::string via_port(const std::string& url, int port);
// The port of `url` (the number after the host's ':').
int port_of(const std::string& url);

}  // namespace outlive::testing
