// loopback_floor: what the kernel alone costs a server per frame on this machine (issue 5).
//
// N loopback TCP connections, set up as outlive sets up its sockets (TCP_NODELAY, a 64 KiB send
// buffer, non-blocking); one thread sends the same pre-framed bytes to every socket, one `sendmsg`
// per socket per round (or `--batch B` frames in one `sendmsg`); a reader thread drains the other
// ends with epoll. The sender's own CPU time (CLOCK_THREAD_CPUTIME_ID: user + system) per frame is
// the least any server can spend per frame here: no websocket, no JSON, no queues, nothing but
// the system call and the loopback TCP path (on loopback the receiver's TCP work runs inside the
// sender's `sendmsg`). The fan-out benchmark's servers are measured against this.
//
//   build/bench/loopback_floor [--sockets 5000] [--rounds 20] [--size 200] [--batches 1,2,5,10]
//                              [--repeat 3]
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) / 1e9;
}

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoi(item));
  return out;
}

struct Result {
  double cpu_seconds;
  double frames;
  double calls;
};

Result run(const std::vector<int>& senders, const std::vector<int>& receivers, int rounds,
           int batch, int size) {
  const long expected = long(senders.size()) * rounds * batch * size;
  std::atomic<long> received{0};
  std::thread reader([&] {
    const int ep = epoll_create1(0);
    for (int fd : receivers) {
      epoll_event e{};
      e.events = EPOLLIN;
      e.data.fd = fd;
      epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
    }
    std::vector<char> buf(256 * 1024);
    epoll_event events[512];
    while (received < expected) {
      const int n = epoll_wait(ep, events, 512, 100);
      for (int i = 0; i < n; ++i) {
        ssize_t r;
        while ((r = read(events[i].data.fd, buf.data(), buf.size())) > 0) received += r;
      }
    }
    close(ep);
  });
  // A frame as outlive sends one: header, the socket's own head, the shared rest.
  const std::string frame(size, 'x');
  std::vector<iovec> iov(size_t(batch) * 2);
  for (int b = 0; b < batch; ++b) {
    iov[2 * b] = iovec{const_cast<char*>(frame.data()), 32};
    iov[2 * b + 1] = iovec{const_cast<char*>(frame.data()) + 32, size_t(size - 32)};
  }
  const double start = thread_cpu_seconds();
  long calls = 0;
  for (int r = 0; r < rounds; ++r) {
    for (int fd : senders) {
      msghdr msg{};
      msg.msg_iov = iov.data();
      msg.msg_iovlen = iov.size();
      const ssize_t w = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w != ssize_t(size) * batch) {
        std::fprintf(stderr, "short write %zd (kernel buffer full?)\n", w);
        std::exit(1);
      }
      ++calls;
    }
    // Let the reader drain each round (as clients do between updates); sleeping costs no CPU.
    while (received < long(r + 1) * long(senders.size()) * batch * size) usleep(200);
  }
  const double cpu = thread_cpu_seconds() - start;
  reader.join();
  return {cpu, double(senders.size()) * rounds * batch, double(calls)};
}

}  // namespace

int main(int argc, char** argv) {
  int sockets = 5000, rounds = 20, size = 200, repeat = 3;
  std::vector<int> batches{1, 2, 5, 10};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--sockets")
      sockets = std::stoi(value);
    else if (flag == "--rounds")
      rounds = std::stoi(value);
    else if (flag == "--size")
      size = std::max(64, std::stoi(value));
    else if (flag == "--batches")
      batches = parse_list(value);
    else if (flag == "--repeat")
      repeat = std::stoi(value);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int one = 1;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(listener, 4096) != 0) {
    std::perror("listen");
    return 1;
  }
  socklen_t len = sizeof addr;
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  std::vector<int> senders, receivers;
  for (int i = 0; i < sockets; ++i) {
    const int c = socket(AF_INET, SOCK_STREAM, 0);
    // 4 connections per source address, as the fan-out benchmark's client.
    sockaddr_in source{};
    source.sin_family = AF_INET;
    source.sin_addr.s_addr = htonl(0x7f040000 + 1 + i / 4);
    if (bind(c, reinterpret_cast<sockaddr*>(&source), sizeof source) != 0 ||
        connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      std::perror("connect");
      return 1;
    }
    const int s = accept(listener, nullptr, nullptr);
    const int send_buffer = 64 * 1024;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(s, SOL_SOCKET, SO_SNDBUF, &send_buffer, sizeof send_buffer);
    fcntl(s, F_SETFL, O_NONBLOCK);
    fcntl(c, F_SETFL, O_NONBLOCK);
    senders.push_back(s);
    receivers.push_back(c);
  }
  double load[1] = {0};
  getloadavg(load, 1);
  std::printf(
      "loopback_floor: %d sockets, %d rounds, frames of %d bytes, best of %d; load %.2f\n\n",
      sockets, rounds, size, repeat, load[0]);
  std::printf(
      "| frames per sendmsg | sender CPU s | µs per sendmsg | µs per frame | frames per CPU-s |\n");
  std::printf("|---:|---:|---:|---:|---:|\n");
  for (int batch : batches) {
    Result best{1e9, 0, 0};
    for (int k = 0; k < repeat; ++k) {
      const auto r = run(senders, receivers, rounds, batch, size);
      if (r.cpu_seconds / r.frames < best.cpu_seconds / std::max(best.frames, 1.0)) best = r;
    }
    std::printf("| %d | %.3f | %.2f | %.2f | **%.0f** |\n", batch, best.cpu_seconds,
                best.cpu_seconds / best.calls * 1e6, best.cpu_seconds / best.frames * 1e6,
                best.frames / best.cpu_seconds);
  }
  std::printf(
      "\nCommand: build/bench/loopback_floor --sockets %d --rounds %d --size %d --repeat %d\n",
      sockets, rounds, size, repeat);
  return 0;
}
