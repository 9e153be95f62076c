#pragma once
// The tabs of reconnect_storm: N websocket sockets on one epoll thread that behave, for a 1012, as
// clients/js/outlive.js does: remember the last cursor seen (subscribed, update, resync, progress),
// wait a jittered delay, reconnect (here: to the other replica) and subscribe again from that
// cursor. Each socket records which updates (the `n` in their data) it received, and how often, so
// gaps and duplicates are counted per socket rather than in total.
#include <fcntl.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/epoll_thread.hpp"
#include "bench/floor.hpp"
#include "bench/wire.hpp"

namespace outlive::bench {

class StormClient : public EpollThread<StormClient> {
 public:
  struct Summary {
    int caught_up = 0, subscribed_b = 0;
    int64_t last_sub_us = 0, last_caught_up_us = 0;
    // Reached: live on B and holding an update at or past the one committed before its sub (the
    // replay got to the head, holes or not).
    int reached = 0;
    int64_t last_reached_us = 0;
    double p50_ms = 0, p99_ms = 0, max_ms = 0;
    // From the socket's reconnect attempt (its jittered time) to its sub on B: connect, upgrade
    // and credential check under the storm.
    double open_p50_ms = 0, open_p99_ms = 0, open_max_ms = 0;
    uint64_t resyncs = 0, errors = 0, retries = 0;
    std::string close_codes, first_error;
  };
  struct Final {
    int complete = 0;  // sockets holding every update 1..last
    // holes: updates missing below the newest one the socket received (a real gap); pending:
    // updates after it that had not arrived when the run ended (delivery behind, not lost).
    int64_t holes = 0, pending = 0, duplicates = 0;
    int with_hole = 0, with_pending = 0;
    std::vector<std::string> examples;  // the first few holes, to look up in the replica's log
  };

  StormClient(int sockets, int port_a, int port_b, std::string target, std::string channel,
              int jitter_ms)
      : target_(std::move(target)), channel_(std::move(channel)), jitter_ms_(jitter_ms) {
    ports_[0] = port_a;
    ports_[1] = port_b;
    for (int i = 0; i < sockets; ++i) {
      auto s = std::make_unique<Sock>();
      s->index = i;
      s->address = source_address(0, i);
      socks_.push_back(std::move(s));
    }
    buffer_.resize(256 * 1024);
    start_thread();
  }
  ~StormClient() {
    stop_thread();
    for (auto& s : socks_)
      if (s->fd >= 0) ::close(s->fd);
  }

  void set_committed(int64_t n) { committed_ = n; }

  // --- on the loop thread (through call) ---

  void open_all() {
    for (auto& s : socks_) pending_.push_back(s.get());
    pump();
  }
  int subscribed_on(int server) const {
    int n = 0;
    for (const auto& s : socks_) n += s->server == server && s->subscribed;
    return n;
  }
  Summary summary() const {
    Summary out;
    std::vector<int64_t> took, opening;
    for (const auto& s : socks_) {
      if (s->sub_sent_us && s->attempt_us) opening.push_back(s->sub_sent_us - s->attempt_us);
      if (s->server == 1 && s->subscribed) ++out.subscribed_b;
      out.last_sub_us = std::max(out.last_sub_us, s->sub_sent_us);
      if (s->reached_us) {
        ++out.reached;
        out.last_reached_us = std::max(out.last_reached_us, s->reached_us);
      }
      if (s->caught_up_us) {
        ++out.caught_up;
        out.last_caught_up_us = std::max(out.last_caught_up_us, s->caught_up_us);
        took.push_back(s->caught_up_us - s->sub_sent_us);
      }
    }
    std::sort(took.begin(), took.end());
    auto at = [&](double p) {
      return took.empty() ? 0.0 : took[std::min(took.size() - 1, size_t(p * took.size()))] / 1e3;
    };
    out.p50_ms = at(0.5);
    out.p99_ms = at(0.99);
    out.max_ms = took.empty() ? 0 : took.back() / 1e3;
    std::sort(opening.begin(), opening.end());
    auto at2 = [&](double p) {
      return opening.empty() ? 0.0
                             : opening[std::min(opening.size() - 1, size_t(p * opening.size()))] / 1e3;
    };
    out.open_p50_ms = at2(0.5);
    out.open_p99_ms = at2(0.99);
    out.open_max_ms = opening.empty() ? 0 : opening.back() / 1e3;
    out.resyncs = resyncs_;
    out.errors = errors_;
    out.retries = retries_;
    for (const auto& [code, n] : close_codes_)
      out.close_codes += (out.close_codes.empty() ? "" : ", ") + std::to_string(n) + "×" +
                         std::to_string(code);
    out.first_error = first_error_;
    return out;
  }
  Final final_count(int64_t last) const {
    Final f;
    for (const auto& s : socks_) {
      int64_t newest = 0, holes = 0;
      for (int64_t n = 1; n < int64_t(s->seen.size()); ++n)
        if (s->seen[size_t(n)]) newest = n;
      for (int64_t n = 1; n <= last; ++n) {
        const uint16_t c = n < int64_t(s->seen.size()) ? s->seen[size_t(n)] : 0;
        if (c == 0 && n < newest) {
          ++holes;
          if (f.examples.size() < 8)
            f.examples.push_back("socket " + std::to_string(s->index) + " lacks n=" +
                                 std::to_string(n) + " (its sub on B resumed from cursor " +
                                 s->resumed_from + " with " + std::to_string(s->need) +
                                 " committed)");
        }
        if (c > 1) f.duplicates += c - 1;
      }
      const int64_t pending = std::max<int64_t>(0, last - newest);
      f.holes += holes;
      f.pending += pending;
      f.with_hole += holes > 0;
      f.with_pending += pending > 0;
      f.complete += holes == 0 && pending == 0;
    }
    return f;
  }

 private:
  struct Sock {
    enum State { idle, connecting, handshake, open, closed };
    State state = idle;
    int index = 0, fd = -1;
    int server = 0;  // 0: A, 1: B (after the first close)
    bool subscribed = false, opening = false;
    std::string address, cursor, out, in;
    std::string resumed_from;  // the cursor of the sub on B
    std::vector<uint16_t> seen;  // by update n: how often received
    int64_t contiguous = 0;      // every n in 1..contiguous received
    int64_t need = -1;           // on B: every n up to this was committed before the sub
    int64_t attempt_us = 0, sub_sent_us = 0, caught_up_us = 0, reached_us = 0;
    int64_t newest = 0;
  };

  // (EpollThread's)
  friend class EpollThread<StormClient>;
  void on_event(void* ptr, uint32_t events) { handle(*static_cast<Sock*>(ptr), events); }
  int timeout_ms() const {
    if (timers_.empty()) return 100;
    return int(std::clamp<int64_t>((timers_.top().first - wall_us()) / 1000, 0, 100));
  }
  void after_events() {
    const int64_t now = wall_us();
    while (!timers_.empty() && timers_.top().first <= now) {
      Sock* s = socks_[size_t(timers_.top().second)].get();
      timers_.pop();
      start(*s);
    }
  }

  // The first opens go 64 at a time (a connect burst of thousands only measures the SYN queue);
  // the reconnects go at their jittered times, which is the storm under test.
  void pump() {
    while (opening_ < 64 && !pending_.empty()) {
      Sock* s = pending_.front();
      pending_.pop_front();
      s->opening = true;
      ++opening_;
      start(*s);
    }
  }
  void done_opening(Sock& s) {
    if (!s.opening) return;
    s.opening = false;
    --opening_;
    pump();
  }

  void start(Sock& s) {
    if (s.server == 1) s.attempt_us = wall_us();
    s.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    const int one = 1;
    setsockopt(s.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_in local{};
    local.sin_family = AF_INET;
    inet_pton(AF_INET, s.address.c_str(), &local.sin_addr);
    sockaddr_in remote{};
    remote.sin_family = AF_INET;
    remote.sin_port = htons(uint16_t(ports_[s.server]));
    remote.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(s.fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0 ||
        (connect(s.fd, reinterpret_cast<sockaddr*>(&remote), sizeof remote) != 0 &&
         errno != EINPROGRESS))
      return lost(s, std::string("connect: ") + std::strerror(errno));
    s.state = Sock::connecting;
    s.out = upgrade_request(ports_[s.server], target_,
                            "Authorization: Bearer key" + std::to_string(s.index + 1) + "\r\n");
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT;
    ev.data.ptr = &s;
    epoll_ctl(ep_, EPOLL_CTL_ADD, s.fd, &ev);
  }

  // The socket is gone: after A's 1012 (or any loss) it goes to B after the jittered delay, as the
  // browser client's first retry; a failure on B retries after 1 s plus jitter (1013's floor).
  void lost(Sock& s, const std::string& why) {
    if (s.fd >= 0) {
      epoll_ctl(ep_, EPOLL_CTL_DEL, s.fd, nullptr);
      ::close(s.fd);
      s.fd = -1;
    }
    const bool was_b = s.server == 1;
    s.state = Sock::closed;
    s.subscribed = false;
    s.out.clear();
    s.in.clear();
    done_opening(s);
    if (was_b) {
      ++retries_;
      if (first_error_.empty()) first_error_ = "on B: " + why;
    }
    s.server = 1;
    std::uniform_int_distribution<int> jitter(0, std::max(0, jitter_ms_ - 1));
    timers_.emplace(wall_us() + (was_b ? 1000'000 : 0) + int64_t(jitter(random_)) * 1000,
                    s.index);
  }

  void flush(Sock& s) {
    while (!s.out.empty()) {
      const ssize_t n = ::write(s.fd, s.out.data(), s.out.size());
      if (n > 0) {
        s.out.erase(0, size_t(n));
      } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        break;
      } else {
        return lost(s, std::string("write: ") + std::strerror(errno));
      }
    }
    epoll_event ev{};
    ev.events = EPOLLIN | (s.out.empty() ? 0u : EPOLLOUT);
    ev.data.ptr = &s;
    epoll_ctl(ep_, EPOLL_CTL_MOD, s.fd, &ev);
  }

  void send_text(Sock& s, const std::string& text) {
    append_frame(s.out, 0x1, text.data(), text.size());
    flush(s);
  }

  void handle(Sock& s, uint32_t events) {
    if (s.state == Sock::connecting) {
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) return lost(s, std::string("connect: ") + std::strerror(err));
      s.state = Sock::handshake;
    }
    if (events & EPOLLOUT) {
      flush(s);
      if (s.fd < 0) return;
    }
    if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR))) return;
    const ssize_t n = ::read(s.fd, buffer_.data(), buffer_.size());
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) return lost(s, n == 0 ? "closed by the server" : std::strerror(errno));
    s.in.append(buffer_.data(), size_t(n));
    if (s.state == Sock::handshake) {
      const auto end = s.in.find("\r\n\r\n");
      if (end == std::string::npos) return;
      if (s.in.rfind("HTTP/1.1 101", 0) != 0)
        return lost(s, "upgrade refused: " + s.in.substr(0, s.in.find("\r\n")));
      s.state = Sock::open;
      s.in.erase(0, end + 4);
      json_sub(s);
      if (s.fd < 0) return;
    }
    size_t at = 0;
    while (s.fd >= 0 && s.in.size() - at >= 2) {
      const auto* h = reinterpret_cast<const uint8_t*>(s.in.data() + at);
      uint64_t len = h[1] & 0x7f;
      size_t header = 2;
      if (len == 126) {
        if (s.in.size() - at < 4) break;
        len = (uint64_t(h[2]) << 8) | h[3];
        header = 4;
      } else if (len == 127) {
        if (s.in.size() - at < 10) break;
        len = 0;
        for (int i = 0; i < 8; ++i) len = (len << 8) | h[2 + i];
        header = 10;
      }
      if (s.in.size() - at < header + len) break;
      on_frame(s, h[0] & 0x0f, s.in.data() + at + header, size_t(len));
      at += header + size_t(len);
    }
    if (s.fd >= 0) s.in.erase(0, at);
  }

  void json_sub(Sock& s) {
    std::string sub = R"({"type":"sub","id":"s1","channel":")" + channel_ + R"(","scope":{})";
    if (!s.cursor.empty()) sub += R"(,"cursor":")" + s.cursor + "\"";
    sub += "}";
    if (s.server == 1) {
      s.resumed_from = s.cursor;
      s.need = committed_.load();
      s.sub_sent_us = wall_us();
    }
    send_text(s, sub);
  }

  static std::string cursor_of(const char* p, size_t n) {
    static constexpr char kCursor[] = R"("cursor":")";
    const char* at = static_cast<const char*>(memmem(p, n, kCursor, sizeof kCursor - 1));
    if (at == nullptr) return "";
    at += sizeof kCursor - 1;
    const char* end = static_cast<const char*>(memchr(at, '"', size_t(p + n - at)));
    return end ? std::string(at, end) : "";
  }

  void check_caught_up(Sock& s, int64_t now) {
    if (s.need < 0 || !s.subscribed) return;
    if (!s.reached_us && s.newest >= s.need) s.reached_us = now;
    if (!s.caught_up_us && s.contiguous >= s.need) s.caught_up_us = now;
  }

  void on_frame(Sock& s, uint8_t opcode, const char* p, size_t n) {
    const int64_t now = wall_us();
    if (opcode == 0x9) {
      append_frame(s.out, 0xA, p, n);
      return flush(s);
    }
    if (opcode == 0x8) {
      const int code = n >= 2 ? (uint8_t(p[0]) << 8 | uint8_t(p[1])) : 1005;
      ++close_codes_[code];
      return lost(s, "close " + std::to_string(code));
    }
    if (opcode != 0x1) return;
    const std::string cursor = cursor_of(p, n);
    if (!cursor.empty()) s.cursor = cursor;
    static constexpr char kUpdate[] = R"({"type":"update")";
    auto has = [&](const char* what) { return memmem(p, n, what, std::strlen(what)) != nullptr; };
    if (n >= sizeof kUpdate - 1 && std::memcmp(p, kUpdate, sizeof kUpdate - 1) == 0) {
      const auto v = json_integer(p, n, "\"n\"");
      if (!v || *v <= 0) return;
      if (size_t(*v) >= s.seen.size()) s.seen.resize(size_t(*v) + 64, 0);
      ++s.seen[size_t(*v)];
      s.newest = std::max(s.newest, *v);
      while (size_t(s.contiguous + 1) < s.seen.size() && s.seen[size_t(s.contiguous + 1)])
        ++s.contiguous;
      check_caught_up(s, now);
    } else if (has(R"("type":"subscribed")")) {
      s.subscribed = true;
      done_opening(s);
      check_caught_up(s, now);
    } else if (has(R"("type":"resync")")) {
      ++resyncs_;
    } else if (has(R"("type":"error")")) {
      ++errors_;
      if (first_error_.empty()) first_error_.assign(p, std::min<size_t>(n, 300));
    }
  }

  std::string target_, channel_;
  int jitter_ms_;
  int ports_[2];
  std::vector<std::unique_ptr<Sock>> socks_;
  std::deque<Sock*> pending_;
  int opening_ = 0;
  std::priority_queue<std::pair<int64_t, int>, std::vector<std::pair<int64_t, int>>,
                      std::greater<>>
      timers_;
  std::mt19937 random_{12345};
  std::atomic<int64_t> committed_{0};
  std::map<int, uint64_t> close_codes_;
  uint64_t resyncs_ = 0, errors_ = 0, retries_ = 0;
  std::string first_error_;
  std::vector<char> buffer_;
};

}  // namespace outlive::bench
