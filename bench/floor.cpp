#include "bench/floor.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#if OUTLIVE_HAVE_LIBURING
#include <liburing.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace outlive::bench {

namespace {

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) / 1e9;
}

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error("floor: " + what + ": " + std::strerror(errno));
}

}  // namespace

std::string source_address(int group, int i) {
  const int a = i / 4;
  return "127." + std::to_string(group + 1) + "." + std::to_string(a / 250) + "." +
         std::to_string(1 + a % 250);
}

FloorSockets::FloorSockets(int sockets, int source_group) {
  listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int one = 1;
  setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(listener_, 4096) != 0)
    fail("listen");
  socklen_t len = sizeof addr;
  getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
  for (int i = 0; i < sockets; ++i) {
    const int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c < 0) fail("socket");
    sockaddr_in source{};
    source.sin_family = AF_INET;
    inet_pton(AF_INET, source_address(source_group, i).c_str(), &source.sin_addr);
    if (bind(c, reinterpret_cast<sockaddr*>(&source), sizeof source) != 0)
      fail("bind " + source_address(source_group, i));
    if (connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) fail("connect");
    const int s = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (s < 0) fail("accept");
    const int send_buffer = 64 * 1024;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(s, SOL_SOCKET, SO_SNDBUF, &send_buffer, sizeof send_buffer);
    fcntl(s, F_SETFL, O_NONBLOCK);
    fcntl(c, F_SETFL, O_NONBLOCK);
    senders_.push_back(s);
    receivers_.push_back(c);
  }
}

FloorSockets::~FloorSockets() {
  for (int fd : senders_) close(fd);
  for (int fd : receivers_) close(fd);
  if (listener_ >= 0) close(listener_);
}

FloorResult FloorSockets::run_once(int rounds, int size, int batch, int pause_ms, bool uring) {
#if OUTLIVE_HAVE_LIBURING
  constexpr unsigned kEntries = 128;  // as ws::SendBatch submits
  io_uring ring{};
  if (uring &&
      io_uring_queue_init(kEntries, &ring,
                          IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN) < 0 &&
      io_uring_queue_init(kEntries, &ring, 0) < 0)
    return FloorResult{};
  std::vector<msghdr> msgs(uring ? kEntries : 0);
#else
  if (uring) return FloorResult{};
#endif
  const long per_round = long(senders_.size()) * batch * size;
  const long expected = per_round * rounds;
  std::atomic<long> received{0};
  std::thread reader([&] {
    const int ep = epoll_create1(EPOLL_CLOEXEC);
    for (int fd : receivers_) {
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
  // Two iovecs per frame, as outlive writes one: the socket's own head, then the shared rest.
  const std::string frame(size_t(size), 'x');
  std::vector<iovec> iov(size_t(batch) * 2);
  for (int b = 0; b < batch; ++b) {
    iov[2 * b] = iovec{const_cast<char*>(frame.data()), 32};
    iov[2 * b + 1] = iovec{const_cast<char*>(frame.data()) + 32, size_t(size - 32)};
  }
  const double start = thread_cpu_seconds();
  long calls = 0;
  for (int r = 0; r < rounds; ++r) {
#if OUTLIVE_HAVE_LIBURING
    for (size_t i = 0; uring && i < senders_.size(); i += kEntries) {
      const unsigned n = static_cast<unsigned>(std::min<size_t>(kEntries, senders_.size() - i));
      for (unsigned j = 0; j < n; ++j) {
        msgs[j] = msghdr{};
        msgs[j].msg_iov = iov.data();
        msgs[j].msg_iovlen = iov.size();
        io_uring_sqe* sqe = io_uring_get_sqe(&ring);
        io_uring_prep_sendmsg(sqe, senders_[i + j], &msgs[j], MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      io_uring_submit_and_wait(&ring, n);
      io_uring_cqe* cqe = nullptr;
      unsigned head = 0, seen = 0;
      bool short_write = false;
      io_uring_for_each_cqe(&ring, head, cqe) {
        ++seen;
        short_write |= cqe->res != size * batch;
      }
      io_uring_cq_advance(&ring, seen);
      if (short_write || seen != n) {
        reader.detach();
        throw std::runtime_error("floor: short io_uring write");
      }
      calls += n;
    }
#endif
    for (size_t k = 0; !uring && k < senders_.size(); ++k) {
      const int fd = senders_[k];
      msghdr msg{};
      msg.msg_iov = iov.data();
      msg.msg_iovlen = iov.size();
      const ssize_t w = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w != ssize_t(size) * batch) {
        reader.detach();  // the process is about to report and exit
        throw std::runtime_error("floor: short write " + std::to_string(w) +
                                 " (kernel buffer full?)");
      }
      ++calls;
    }
    // The reader drains each round, as clients do between updates (sleeping costs no CPU), so
    // every sendmsg finds an empty buffer as outlive's do at these rates.
    while (received < long(r + 1) * per_round) usleep(200);
    if (pause_ms > 0) usleep(static_cast<useconds_t>(pause_ms) * 1000);
  }
  const double cpu = thread_cpu_seconds() - start;
  reader.join();
#if OUTLIVE_HAVE_LIBURING
  if (uring) io_uring_queue_exit(&ring);
#endif
  FloorResult out;
  out.sockets = static_cast<int>(senders_.size());
  out.frame_bytes = size;
  out.batch = batch;
  out.cpu_seconds = cpu;
  out.frames = double(senders_.size()) * rounds * batch;
  out.calls = double(calls);
  return out;
}

FloorResult FloorSockets::best_of(int rounds, int frame_bytes, int batch, int repeat, int pause_ms,
                                  bool uring) {
  if (frame_bytes < 64) frame_bytes = 64;
  FloorResult best;
  for (int k = 0; k < repeat; ++k) {
    const auto r = run_once(rounds, frame_bytes, batch, pause_ms, uring);
    if (r.frames == 0) return r;  // io_uring missing
    if (best.frames == 0 || r.us_per_frame() < best.us_per_frame()) best = r;
  }
  return best;
}

LatencyFloor FloorSockets::measure_latency(int rounds, int frame_bytes, int pause_ms,
                                           int sender_threads, int sample_every) {
  using Clock = std::chrono::steady_clock;
  const int size = std::max(frame_bytes, 64);
  const int n = static_cast<int>(senders_.size());
  const long expected = long(n) * rounds * size;
  // Every socket's frames arrive whole and in order; offset[i] counts the bytes socket i received.
  std::vector<long> offset(receivers_.size(), 0);
  std::vector<double> latencies;
  latencies.reserve(size_t(n / std::max(1, sample_every) + 1) * size_t(rounds));
  double reader_cpu = 0;
  const auto start = Clock::now() + std::chrono::milliseconds(20);
  auto round_start = [&](int r) { return start + std::chrono::milliseconds(long(r) * pause_ms); };
  std::thread reader([&] {
    const double cpu0 = thread_cpu_seconds();
    const int ep = epoll_create1(EPOLL_CLOEXEC);
    for (size_t i = 0; i < receivers_.size(); ++i) {
      epoll_event e{};
      e.events = EPOLLIN;
      e.data.u64 = i;
      epoll_ctl(ep, EPOLL_CTL_ADD, receivers_[i], &e);
    }
    std::vector<char> buf(64 * 1024);
    epoll_event events[512];
    long got = 0;
    auto last_progress = Clock::now();
    // A frame that never arrives ends the measurement 5 s after the last one that did.
    while (got < expected && Clock::now() - last_progress <
                                 std::chrono::seconds(5) + std::chrono::milliseconds(pause_ms)) {
      const int ready = epoll_wait(ep, events, 512, 100);
      if (ready > 0) last_progress = Clock::now();
      for (int e = 0; e < ready; ++e) {
        const size_t i = events[e].data.u64;
        // One read per readiness, as fanout_bench's load client reads: a frame is far shorter
        // than the buffer, and what arrives later is reported again (level-triggered).
        const ssize_t r = read(receivers_[i], buf.data(), buf.size());
        if (r > 0) {
          const auto now = Clock::now();
          if (i % size_t(sample_every) == 0) {
            // Each whole frame that begins in this read carries its round number.
            for (long at = (size - offset[i] % size) % size; at + 4 <= r; at += size) {
              int32_t round = 0;
              std::memcpy(&round, buf.data() + at, sizeof round);
              latencies.push_back(
                  std::chrono::duration<double, std::milli>(now - round_start(round)).count());
            }
          }
          offset[i] += r;
          got += r;
        }
      }
    }
    close(ep);
    reader_cpu = thread_cpu_seconds() - cpu0;
  });
  std::atomic<double> sender_cpu{0};
  std::atomic<bool> failed{false};
  std::vector<std::thread> senders;
  for (int t = 0; t < sender_threads; ++t) {
    senders.emplace_back([&, t] {
      const double cpu0 = thread_cpu_seconds();
      std::string frame(size_t(size), 'x');
      for (int r = 0; r < rounds && !failed; ++r) {
        std::this_thread::sleep_until(round_start(r));
        std::memcpy(frame.data(), &r, sizeof r);
        iovec iov[2] = {{frame.data(), 32}, {frame.data() + 32, size_t(size - 32)}};
        for (int s = t; s < n; s += sender_threads) {
          msghdr msg{};
          msg.msg_iov = iov;
          msg.msg_iovlen = 2;
          if (sendmsg(senders_[size_t(s)], &msg, MSG_NOSIGNAL | MSG_DONTWAIT) != ssize_t(size))
            failed = true;
        }
      }
      double sum = sender_cpu.load();
      while (!sender_cpu.compare_exchange_weak(sum, sum + thread_cpu_seconds() - cpu0)) {
      }
    });
  }
  for (auto& s : senders) s.join();
  if (failed) {
    reader.detach();  // the process is about to report and exit
    throw std::runtime_error("floor: short write in the latency floor (kernel buffer full?)");
  }
  reader.join();
  std::sort(latencies.begin(), latencies.end());
  auto at = [&](double q) {
    return latencies.empty() ? 0.0 : latencies[size_t(q * double(latencies.size() - 1))];
  };
  LatencyFloor out;
  out.sockets = n;
  out.rounds = rounds;
  out.sender_threads = sender_threads;
  out.pause_ms = pause_ms;
  out.p50_ms = at(0.5);
  out.p99_ms = at(0.99);
  out.max_ms = latencies.empty() ? 0 : latencies.back();
  out.sender_cpu_s = sender_cpu.load() / rounds;
  out.reader_cpu_s = reader_cpu / rounds;
  return out;
}

}  // namespace outlive::bench
