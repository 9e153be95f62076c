#pragma once
// fanout_bench's load client (bench/fanout_bench.cpp): websocket sockets on epoll loops, one thread
// each, in two groups (outlive's and the ws baseline's), counting every update frame per socket and
// the commit time of every sample socket's frames; and the blocking socket the driver publishes to
// the baseline through. Written here rather than with Beast: Beast translation units take minutes
// to build on these machines, and a client that reads large chunks and parses frame headers leaves
// more of the 2 cores to the servers. Included by fanout_bench.cpp and keyed_bench.cpp (which has
// each socket check the order of its key's updates: Client::open's check_sequence; and, for its
// W2 and storm workloads, several subscriptions per socket, each checking its own key's order
// and keeping its cursor for a reconnect: Client::open_multi, Client::reopen).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bench/common.hpp"
#include "bench/epoll_thread.hpp"
#include "bench/floor.hpp"
#include "bench/load.hpp"
#include "bench/wire.hpp"

namespace outlive::bench {

inline std::string progress_name = "fanout_bench";  // the program, in front of progress lines
inline void progress(const std::string& text) {
  std::cerr << "[" << progress_name << "] " << text << std::endl;
}

// --settle-load: a phase starts once the load average is at most `limit` (waits up to 180 s, and
// says how long). 0: at once.
inline void settle_before_phase(double limit) {
  if (limit <= 0) return;
  const double before = load_average();
  if (before <= limit) return;
  const double waited = settle_load(limit, 180);
  progress("waited " + fixed(waited, 0) + " s for the load average to fall from " +
           fixed(before, 2) + " to " + fixed(load_average(), 2));
}

enum Group { kOutlive = 0, kBaseline = 1 };
constexpr int kGroups = 2;

struct GroupStats {
  uint64_t updates = 0, subscribed = 0, revoked = 0, progress = 0, errors = 0, other = 0;
  uint64_t upgraded = 0, failed = 0, closed = 0;
  uint64_t resyncs = 0;
  uint64_t retries = 0;  // reconnects scheduled after a close (Client::reopen's sockets)
  // check_sequence sockets: updates whose "s" was not the previous one's + 1 (a gap, a duplicate
  // or a reordering).
  uint64_t disorder = 0;
  std::map<int, uint64_t> close_codes;
  int64_t last_update_us = 0;
  int64_t last_subscribed_us = 0;  // the last `subscribed` frame's arrival
  int64_t first_revoked_us = 0, last_revoked_us = 0;
  std::string first_error;
  std::string sample_update;  // one update frame's text, as received

  void add(const GroupStats& o) {
    updates += o.updates;
    subscribed += o.subscribed;
    revoked += o.revoked;
    progress += o.progress;
    errors += o.errors;
    other += o.other;
    upgraded += o.upgraded;
    failed += o.failed;
    closed += o.closed;
    resyncs += o.resyncs;
    retries += o.retries;
    disorder += o.disorder;
    for (const auto& [code, n] : o.close_codes) close_codes[code] += n;
    last_update_us = std::max(last_update_us, o.last_update_us);
    last_subscribed_us = std::max(last_subscribed_us, o.last_subscribed_us);
    if (o.first_revoked_us && (!first_revoked_us || o.first_revoked_us < first_revoked_us))
      first_revoked_us = o.first_revoked_us;
    last_revoked_us = std::max(last_revoked_us, o.last_revoked_us);
    if (first_error.empty()) first_error = o.first_error;
    if (sample_update.empty()) sample_update = o.sample_update;
  }
};

struct Conn {
  enum State { idle, connecting, handshake, open, closed };
  State state = idle;
  int fd = -1;
  int group = kOutlive;
  bool sample = false;
  bool writable_wanted = false;
  bool opening = false;  // counted against the loop's open concurrency until subscribed or failed
  bool sub_active = false;  // a subscription is live (subscribed seen, not revoked/unsubscribed)
  std::string sub_id;
  std::string local_address;
  std::string request;    // the HTTP upgrade
  std::string first_sub;  // sent once the upgrade is answered
  std::string out;        // bytes not yet written
  std::string in;         // bytes not yet parsed
  uint64_t updates = 0, mark = 0;
  int index = 0;  // within its group
  // Each update's data carries "s", its number among its key's updates (1, 2, ...): with one key
  // per socket, every one must arrive exactly once and in order.
  bool check_sequence = false;
  int64_t last_seq = 0;
  uint64_t disorder = 0;
  // Several subscriptions (Client::open_multi): each on its own key, whose updates' "s" must
  // follow one another across reconnects; each remembers its last cursor (subscribed, update,
  // resync, and progress once confirmed, as clients/js/outlive.js) to resume from on reopen.
  struct Sub {
    std::string id, key, scope;  // scope: JSON text
    std::string cursor;
    bool confirmed = false;
    uint64_t updates = 0, mark = 0;
    int64_t last_seq = 0;
    uint64_t disorder = 0;
  };
  std::vector<Sub> subs;  // empty: the one `first_sub`
  size_t answered = 0;    // subs answered (subscribed or error) since the upgrade
  int attempts = 0;       // reconnects after a close since reopen()
  int close_code = 0;     // the last close frame's code
  std::string channel, target, headers;  // the subs' channel; to build the upgrade again
};

// What a check_sequence socket received (Client::sequences), or one subscription of an
// open_multi socket (Client::sub_sequences: `key` is its key).
struct SocketSequence {
  int index = 0;
  bool open = false;
  uint64_t updates = 0;  // since mark()
  int64_t last_seq = 0;
  uint64_t disorder = 0;
  std::string key;
};

class Loop : public EpollThread<Loop> {
 public:
  explicit Loop(int open_limit) : open_limit_(open_limit) {
    buffer_.resize(256 * 1024);
    start_thread();
  }
  ~Loop() {
    stop_thread();
    for (auto& c : conns_) {
      if (c->fd >= 0) ::close(c->fd);
    }
  }

  // --- on the loop thread (through post/call) ---

  void add(std::unique_ptr<Conn> c, int port) {
    port_[c->group] = port;
    pending_.push_back(c.get());
    conns_.push_back(std::move(c));
    pump();
  }

  GroupStats stats(int group) const { return stats_[group]; }
  std::vector<std::pair<int64_t, int64_t>> take_latencies(int group) {
    return std::exchange(latencies_[group], {});
  }
  std::vector<std::pair<int64_t, int64_t>> take_revocations(int group) {
    return std::exchange(revoked_at_[group], {});
  }

  void mark(int group) {
    for (auto& c : conns_) {
      if (c->group != group) continue;
      c->mark = c->updates;
      for (auto& sub : c->subs) sub.mark = sub.updates;
    }
  }
  // Update frames per socket since mark(): min, max, over sockets open at the time of asking.
  std::tuple<uint64_t, uint64_t, int> per_socket(int group) const {
    uint64_t lo = UINT64_MAX, hi = 0;
    int open = 0;
    for (const auto& c : conns_) {
      if (c->group != group || c->state != Conn::open) continue;
      lo = std::min(lo, c->updates - c->mark);
      hi = std::max(hi, c->updates - c->mark);
      ++open;
    }
    return {open ? lo : 0, hi, open};
  }
  std::vector<SocketSequence> sequences(int group) const {
    std::vector<SocketSequence> out;
    for (const auto& c : conns_) {
      if (c->group != group) continue;
      out.push_back({c->index, c->state == Conn::open, c->updates - c->mark, c->last_seq,
                     c->disorder, {}});
    }
    return out;
  }
  std::vector<SocketSequence> sub_sequences(int group) const {
    std::vector<SocketSequence> out;
    for (const auto& c : conns_) {
      if (c->group != group) continue;
      for (const auto& sub : c->subs)
        out.push_back({c->index, c->state == Conn::open, sub.updates - sub.mark, sub.last_seq,
                       sub.disorder, sub.key});
    }
    return out;
  }
  // Opens again every closed socket of `group`, to `port`, each sub from its cursor, past the
  // open concurrency (a reconnect storm): each at a uniform random time in [0, jitter_ms) from
  // now, or all now with 0.
  int reopen(int group, int port, int jitter_ms) {
    std::uniform_int_distribution<int64_t> jitter(0, std::max(0, jitter_ms - 1) * int64_t{1000});
    const int64_t now = wall_us();
    port_[group] = port;
    retry_[group] = true;
    int n = 0;
    for (auto& c : conns_) {
      if (c->group != group || c->state != Conn::closed) continue;
      prepare_reopen(*c);
      ++n;
      if (jitter_ms <= 0) {
        start(*c);
      } else {
        timers_.emplace(now + jitter(random_), c.get());
      }
    }
    return n;
  }
  int inactive_in(int group, int lo, int hi) const {
    int n = 0;
    for (const auto& c : conns_)
      n += c->group == group && c->state == Conn::open && !c->sub_active && c->index >= lo &&
           c->index < hi;
    return n;
  }
  int open_count(int group, bool with_subscription) const {
    int n = 0;
    for (const auto& c : conns_) {
      if (c->group == group && c->state == Conn::open && (!with_subscription || c->sub_active)) ++n;
    }
    return n;
  }
  // Ends the live subscription (if any) and subscribes with a new id: {"type":"sub",...}.
  void resubscribe(int group, const std::string& channel, const std::string& new_id,
                   bool only_inactive, int lo, int hi) {
    for (auto& c : conns_) {
      if (c->group != group || c->state != Conn::open || c->index < lo || c->index >= hi) continue;
      if (only_inactive && c->sub_active) continue;
      if (c->sub_active) {
        send_text(*c, nlohmann::json{{"type", "unsub"}, {"id", c->sub_id}}.dump());
        c->sub_active = false;
      }
      c->sub_id = new_id;
      send_text(*c, nlohmann::json{{"type", "sub"},
                                   {"id", new_id},
                                   {"channel", channel},
                                   {"scope", nlohmann::json::object()}}
                        .dump());
    }
  }
  // Subs confirmed (`subscribed` since their socket's last upgrade) on open sockets.
  int64_t confirmed(int group) const {
    int64_t n = 0;
    for (const auto& c : conns_) {
      if (c->group != group || c->state != Conn::open) continue;
      for (const auto& sub : c->subs) n += sub.confirmed;
    }
    return n;
  }
  void close_group(int group) {
    retry_[group] = false;
    for (auto& c : conns_) {
      if (c->group == group) close(*c);
    }
  }
  void close_all() {
    for (bool& r : retry_) r = false;
    for (auto& c : conns_) close(*c);
  }

 private:
  // A close frame (1000) if the socket is open, then the connection is dropped.
  void close(Conn& c) {
    if (c.state == Conn::open) {
      std::string frame;
      const char code[2] = {static_cast<char>(1000 >> 8), static_cast<char>(1000 & 0xff)};
      append_frame(frame, 0x8, code, 2);
      [[maybe_unused]] auto n = write(c.fd, frame.data(), frame.size());
    }
    drop(c, false);
  }

  // (EpollThread's)
  friend class EpollThread<Loop>;
  void on_event(void* ptr, uint32_t events) { handle(*static_cast<Conn*>(ptr), events); }
  int timeout_ms() const {
    if (timers_.empty()) return 100;
    return static_cast<int>(std::clamp<int64_t>((timers_.top().first - wall_us()) / 1000, 0, 100));
  }
  void after_events() {
    const int64_t now = wall_us();
    while (!timers_.empty() && timers_.top().first <= now) {
      Conn* c = timers_.top().second;
      timers_.pop();
      start(*c);
    }
  }

  void pump() {
    while (opening_ < open_limit_ && !pending_.empty()) {
      Conn* c = pending_.front();
      pending_.pop_front();
      start(*c);
    }
  }

  void start(Conn& c) {
    if (!c.opening) {
      c.opening = true;
      ++opening_;
    }
    c.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.fd < 0) return fail(c, std::string("socket: ") + std::strerror(errno));
    const int one = 1;
    setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_in local{};
    local.sin_family = AF_INET;
    inet_pton(AF_INET, c.local_address.c_str(), &local.sin_addr);
    if (bind(c.fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0)
      return fail(c, "bind " + c.local_address + ": " + std::strerror(errno));
    sockaddr_in remote{};
    remote.sin_family = AF_INET;
    remote.sin_port = htons(static_cast<uint16_t>(port_[c.group]));
    remote.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(c.fd, reinterpret_cast<sockaddr*>(&remote), sizeof remote) != 0 &&
        errno != EINPROGRESS)
      return fail(c, std::string("connect: ") + std::strerror(errno));
    c.state = Conn::connecting;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT;
    ev.data.ptr = &c;
    epoll_ctl(ep_, EPOLL_CTL_ADD, c.fd, &ev);
    c.writable_wanted = true;
  }

  void done_opening(Conn& c) {
    if (!c.opening) return;
    c.opening = false;
    --opening_;
    pump();
  }

  // The sub a frame names by "id" (an open_multi socket's), or null.
  static Conn::Sub* sub_of(Conn& c, const char* p, size_t n) {
    if (c.subs.empty()) return nullptr;
    const auto id = json_string(p, n, "\"id\"");
    for (auto& sub : c.subs)
      if (sub.id == id) return &sub;
    return nullptr;
  }

  // An update of an open_multi socket: the sub of its key counts it, checks its "s" against the
  // previous one (a gap, a duplicate or a reordering is disorder) and keeps its cursor.
  void on_multi_update(Conn& c, GroupStats& s, const char* p, size_t n) {
    const auto key = json_string(p, n, "\"key\"");
    for (auto& sub : c.subs) {
      if (sub.key != key) continue;
      ++sub.updates;
      const auto seq = json_integer(p, n, "\"s\"");
      if (!seq || *seq != sub.last_seq + 1) {
        ++sub.disorder;
        ++s.disorder;
      }
      if (seq) sub.last_seq = *seq;
      const auto cursor = json_string(p, n, "\"cursor\"");
      if (!cursor.empty()) sub.cursor = cursor;
      return;
    }
    ++s.other;  // an update of a key none of its subs follows
  }

  void fail(Conn& c, const std::string& why) {
    auto& s = stats_[c.group];
    ++s.failed;
    if (s.first_error.empty()) s.first_error = why;
    drop(c, true);
  }

  void drop(Conn& c, bool count) {
    if (c.state == Conn::closed) return;
    if (count) ++stats_[c.group].closed;
    if (c.fd >= 0) {
      epoll_ctl(ep_, EPOLL_CTL_DEL, c.fd, nullptr);
      ::close(c.fd);
      c.fd = -1;
    }
    c.state = Conn::closed;
    c.sub_active = false;
    c.out.clear();
    c.in.clear();
    done_opening(c);
    if (retry_[c.group] && !c.subs.empty()) retry(c);
  }

  void prepare_reopen(Conn& c) {
    c.state = Conn::idle;
    c.request = upgrade_request(port_[c.group], c.target, c.headers);
    c.answered = 0;
    c.close_code = 0;
    for (auto& sub : c.subs) sub.confirmed = false;
  }

  // After reopen(), a socket that closes comes back as clients/js/outlive.js does: after a delay
  // uniform in [minimum, min(30 s, 500 ms * 2^attempt)), minimum 5 s after 1013, every sub from
  // its cursor.
  void retry(Conn& c) {
    const int64_t minimum = c.close_code == 1013 ? 5'000 : 0;
    const int64_t ceiling = std::min<int64_t>(
        30'000, std::max<int64_t>(int64_t{500} << std::min(c.attempts, 6), 2 * minimum));
    std::uniform_int_distribution<int64_t> delay(minimum * 1000, ceiling * 1000 - 1);
    ++c.attempts;
    ++stats_[c.group].retries;
    prepare_reopen(c);
    timers_.emplace(wall_us() + delay(random_), &c);
  }

  void want_writable(Conn& c, bool on) {
    if (c.writable_wanted == on || c.fd < 0) return;
    c.writable_wanted = on;
    epoll_event ev{};
    ev.events = EPOLLIN | (on ? EPOLLOUT : 0u);
    ev.data.ptr = &c;
    epoll_ctl(ep_, EPOLL_CTL_MOD, c.fd, &ev);
  }

  void flush(Conn& c) {
    while (!c.out.empty()) {
      const ssize_t n = ::write(c.fd, c.out.data(), c.out.size());
      if (n > 0) {
        c.out.erase(0, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n < 0 && errno == EINTR) continue;
      if (c.state != Conn::open) return fail(c, std::string("write: ") + std::strerror(errno));
      return drop(c, true);
    }
    if (c.state != Conn::closed) want_writable(c, !c.out.empty());
  }

  void send_text(Conn& c, const std::string& text) {
    append_frame(c.out, 0x1, text.data(), text.size());
    flush(c);
  }

  void handle(Conn& c, uint32_t events) {
    if (c.state == Conn::connecting) {
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) return fail(c, std::string("connect: ") + std::strerror(err));
      if (!(events & (EPOLLOUT | EPOLLIN))) return;
      c.state = Conn::handshake;
      c.out = c.request;
      flush(c);
      if (c.state == Conn::closed) return;
    }
    if (events & EPOLLOUT) {
      flush(c);
      if (c.state == Conn::closed) return;
    }
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) read_some(c);
  }

  void read_some(Conn& c) {
    const ssize_t n = ::read(c.fd, buffer_.data(), buffer_.size());
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      if (c.state != Conn::open) return fail(c, std::string("read: ") + std::strerror(errno));
      return drop(c, true);
    }
    if (n == 0) {
      if (c.state != Conn::open) return fail(c, "closed during the upgrade");
      return drop(c, true);
    }
    now_ = wall_us();
    if (c.state == Conn::handshake) {
      c.in.append(buffer_.data(), static_cast<size_t>(n));
      const auto end = c.in.find("\r\n\r\n");
      if (end == std::string::npos) {
        if (c.in.size() > 16384) fail(c, "upgrade response too long");
        return;
      }
      if (c.in.rfind("HTTP/1.1 101", 0) != 0)
        return fail(c, "upgrade refused: " + c.in.substr(0, c.in.find("\r\n")));
      ++stats_[c.group].upgraded;
      c.state = Conn::open;
      std::string rest = c.in.substr(end + 4);
      c.in.clear();
      if (c.subs.empty()) {
        send_text(c, c.first_sub);
      } else {
        for (const auto& sub : c.subs) {
          std::string frame = R"({"type":"sub","id":")" + sub.id + R"(","channel":")" +
                              c.channel + R"(","scope":)" + sub.scope;
          if (!sub.cursor.empty()) frame += R"(,"cursor":")" + sub.cursor + "\"";
          send_text(c, frame + "}");
          if (c.state == Conn::closed) return;
        }
      }
      if (c.state == Conn::closed || rest.empty()) return;
      c.in = std::move(rest);
      const size_t used = parse(c, c.in.data(), c.in.size());
      if (c.state != Conn::closed) c.in.erase(0, used);
      return;
    }
    if (c.in.empty()) {
      const size_t used = parse(c, buffer_.data(), static_cast<size_t>(n));
      if (c.state != Conn::closed && used < static_cast<size_t>(n))
        c.in.assign(buffer_.data() + used, static_cast<size_t>(n) - used);
    } else {
      c.in.append(buffer_.data(), static_cast<size_t>(n));
      const size_t used = parse(c, c.in.data(), c.in.size());
      if (c.state != Conn::closed) c.in.erase(0, used);
    }
  }

  // Handles every complete frame in [p, p + n); returns the bytes used.
  size_t parse(Conn& c, const char* p, size_t n) {
    size_t at = 0;
    while (c.state == Conn::open && n - at >= 2) {
      const auto* h = reinterpret_cast<const uint8_t*>(p + at);
      const uint8_t opcode = h[0] & 0x0f;
      const bool masked = (h[1] & 0x80) != 0;
      uint64_t len = h[1] & 0x7f;
      size_t header = 2;
      if (len == 126) {
        if (n - at < 4) break;
        len = (static_cast<uint64_t>(h[2]) << 8) | h[3];
        header = 4;
      } else if (len == 127) {
        if (n - at < 10) break;
        len = 0;
        for (int i = 0; i < 8; ++i) len = (len << 8) | h[2 + i];
        header = 10;
      }
      if (masked) header += 4;
      if (n - at < header + len) break;
      const char* payload = p + at + header;
      on_frame(c, opcode, payload, static_cast<size_t>(len));
      at += header + static_cast<size_t>(len);
    }
    return at;
  }

  static bool starts(const char* p, size_t n, const char* prefix, size_t k) {
    return n >= k && std::memcmp(p, prefix, k) == 0;
  }

  void on_frame(Conn& c, uint8_t opcode, const char* p, size_t n) {
    auto& s = stats_[c.group];
    if (opcode == 0x9) {  // ping: pong with the same payload
      append_frame(c.out, 0xA, p, n);
      flush(c);
      return;
    }
    if (opcode == 0xA) return;
    if (opcode == 0x8) {
      const int code =
          n >= 2 ? (static_cast<uint8_t>(p[0]) << 8 | static_cast<uint8_t>(p[1])) : 1005;
      s.close_codes[code]++;
      c.close_code = code;
      if (c.opening) {
        ++s.failed;
        if (s.first_error.empty())
          s.first_error = "closed with " + std::to_string(code) + " while opening";
        return drop(c, false);
      }
      return drop(c, true);
    }
    if (opcode != 0x1) {
      ++s.other;
      return;
    }
    // Update frames start with their type (outlive builds the head by hand); the others are
    // nlohmann objects with sorted keys ({"cursor":..,"id":..,"type":"subscribed"}).
    static constexpr char kUpdate[] = R"({"type":"update")";
    static constexpr char kSubscribed[] = R"("type":"subscribed")";
    static constexpr char kRevoked[] = R"("type":"revoked")";
    static constexpr char kProgress[] = R"("type":"progress")";
    static constexpr char kError[] = R"("type":"error")";
    static constexpr char kResync[] = R"("type":"resync")";
    auto has = [&](const char* what, size_t k) { return memmem(p, n, what, k) != nullptr; };
    if (starts(p, n, kUpdate, sizeof kUpdate - 1)) {
      ++s.updates;
      ++c.updates;
      s.last_update_us = now_;
      if (!c.subs.empty()) on_multi_update(c, s, p, n);
      if (c.check_sequence && c.subs.empty()) {
        const auto seq = json_integer(p, n, "\"s\"");
        if (!seq || *seq != c.last_seq + 1) {
          ++c.disorder;
          ++s.disorder;
        }
        if (seq) c.last_seq = *seq;
      }
      if (c.sample) {
        const auto t = json_integer(p, n, "\"t\"");
        const auto seq = json_integer(p, n, "\"n\"");
        if (t && seq) latencies_[c.group].emplace_back(*seq, now_ - *t);
        if (s.sample_update.empty()) s.sample_update.assign(p, n);
      }
    } else if (has(kProgress, sizeof kProgress - 1)) {
      ++s.progress;
      if (!c.subs.empty()) {
        const auto cursor = json_string(p, n, "\"cursor\"");
        for (auto& sub : c.subs)
          if (sub.confirmed && !cursor.empty()) sub.cursor = cursor;
      }
    } else if (has(kSubscribed, sizeof kSubscribed - 1)) {
      ++s.subscribed;
      s.last_subscribed_us = now_;
      c.sub_active = true;
      if (Conn::Sub* sub = sub_of(c, p, n)) {
        sub->confirmed = true;
        const auto cursor = json_string(p, n, "\"cursor\"");
        if (!cursor.empty()) sub->cursor = cursor;
      }
      if (++c.answered >= c.subs.size()) done_opening(c);
    } else if (has(kRevoked, sizeof kRevoked - 1)) {
      ++s.revoked;
      c.sub_active = false;
      if (!s.first_revoked_us) s.first_revoked_us = now_;
      s.last_revoked_us = std::max(s.last_revoked_us, now_);
      revoked_at_[c.group].emplace_back(now_, 0);
    } else if (has(kResync, sizeof kResync - 1)) {
      ++s.resyncs;
      if (Conn::Sub* sub = sub_of(c, p, n)) {
        const auto cursor = json_string(p, n, "\"cursor\"");
        if (!cursor.empty()) sub->cursor = cursor;
      }
    } else if (has(kError, sizeof kError - 1)) {
      ++s.errors;
      if (!c.subs.empty() && ++c.answered >= c.subs.size()) done_opening(c);
      if (s.first_error.empty()) s.first_error.assign(p, std::min<size_t>(n, 300));
    } else {
      ++s.other;
    }
  }

  const int open_limit_;
  std::vector<char> buffer_;
  int64_t now_ = 0;
  int opening_ = 0;
  int port_[kGroups] = {0, 0};
  bool retry_[kGroups] = {false, false};  // reconnect after a close (set by reopen())
  std::deque<Conn*> pending_;
  // reopen()'s jittered starts: (wall µs, socket), earliest first
  std::priority_queue<std::pair<int64_t, Conn*>, std::vector<std::pair<int64_t, Conn*>>,
                      std::greater<>>
      timers_;
  std::mt19937_64 random_{0x5707};
  std::vector<std::unique_ptr<Conn>> conns_;
  GroupStats stats_[kGroups];
  std::vector<std::pair<int64_t, int64_t>> latencies_[kGroups];  // (n, microseconds)
  std::vector<std::pair<int64_t, int64_t>> revoked_at_[kGroups];
};

class Client {
 public:
  Client(int threads, int open_concurrency) {
    for (int i = 0; i < threads; ++i)
      loops_.push_back(std::make_unique<Loop>(std::max(1, open_concurrency / threads)));
  }
  ~Client() {
    for (auto& l : loops_) l->call([&] { l->close_all(); });
  }

  // Opens `count` sockets of `group` to 127.0.0.1:port from 127.<group + 1>.x.y, at most 4 per
  // source address (outlive allows 5 opens per second per address for API keys).
  void open(int group, int count, int port, const std::string& target,
            const std::function<std::string(int)>& headers, const std::string& channel,
            int sample_every, bool check_sequence = false) {
    for (int i = 0; i < count; ++i) {
      auto c = std::make_unique<Conn>();
      c->group = group;
      c->sample = i % sample_every == 0;
      c->local_address = source_address(group, i);
      c->request = upgrade_request(port, target, headers(i));
      c->sub_id = "s1";
      c->index = i;
      c->check_sequence = check_sequence;
      c->first_sub = nlohmann::json{{"type", "sub"},
                                    {"id", "s1"},
                                    {"channel", channel},
                                    {"scope", nlohmann::json::object()}}
                         .dump();
      Loop& l = *loops_[static_cast<size_t>(i) % loops_.size()];
      l.post([&l, raw = c.release(), port] { l.add(std::unique_ptr<Conn>(raw), port); });
    }
  }

  // Opens `count` sockets as open() does, socket i with one sub per (id, key, scope JSON) of
  // subs(i), each checking its key's order (Loop::on_multi_update) and keeping its cursor.
  using SubSpec = std::tuple<std::string, std::string, std::string>;
  void open_multi(int group, int count, int port, const std::string& target,
                  const std::function<std::string(int)>& headers, const std::string& channel,
                  const std::function<std::vector<SubSpec>(int)>& subs, int sample_every) {
    for (int i = 0; i < count; ++i) {
      auto c = std::make_unique<Conn>();
      c->group = group;
      c->sample = i % sample_every == 0;
      c->local_address = source_address(group, i);
      c->target = target;
      c->headers = headers(i);
      c->request = upgrade_request(port, target, c->headers);
      c->index = i;
      c->channel = channel;
      for (auto& [id, key, scope] : subs(i)) {
        Conn::Sub sub;
        sub.id = id;
        sub.key = key;
        sub.scope = scope;
        c->subs.push_back(std::move(sub));
      }
      Loop& l = *loops_[static_cast<size_t>(i) % loops_.size()];
      l.post([&l, raw = c.release(), port] { l.add(std::unique_ptr<Conn>(raw), port); });
    }
  }
  // Opens again every closed socket of `group` to `port`, each sub from its cursor, all within
  // `jitter_ms` (0: at once) rather than through the open concurrency; from then on a socket of
  // the group that closes reconnects with the browser client's backoff (Loop::retry), until
  // close_group(). Returns how many.
  int reopen(int group, int port, int jitter_ms) {
    int n = 0;
    for (auto& l : loops_) n += l->call([&] { return l->reopen(group, port, jitter_ms); });
    return n;
  }
  int64_t confirmed(int group) {
    int64_t n = 0;
    for (auto& l : loops_) n += l->call([&] { return l->confirmed(group); });
    return n;
  }
  std::vector<SocketSequence> sub_sequences(int group) {
    std::vector<SocketSequence> all;
    for (auto& l : loops_) {
      auto v = l->call([&] { return l->sub_sequences(group); });
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  }

  GroupStats stats(int group) {
    GroupStats s;
    for (auto& l : loops_) s.add(l->call([&] { return l->stats(group); }));
    return s;
  }
  std::vector<std::pair<int64_t, int64_t>> take_latencies(int group) {
    std::vector<std::pair<int64_t, int64_t>> all;
    for (auto& l : loops_) {
      auto v = l->call([&] { return l->take_latencies(group); });
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  }
  std::vector<int64_t> take_revoked_times(int group) {
    std::vector<int64_t> all;
    for (auto& l : loops_) {
      auto v = l->call([&] { return l->take_revocations(group); });
      for (auto& [t, unused] : v) all.push_back(t);
    }
    return all;
  }
  void mark(int group) {
    for (auto& l : loops_) l->call([&] { l->mark(group); });
  }
  std::tuple<uint64_t, uint64_t, int> per_socket(int group) {
    uint64_t lo = UINT64_MAX, hi = 0;
    int open = 0;
    for (auto& l : loops_) {
      auto [a, b, n] = l->call([&] { return l->per_socket(group); });
      if (n) lo = std::min(lo, a);
      hi = std::max(hi, b);
      open += n;
    }
    return {open ? lo : 0, hi, open};
  }
  std::vector<SocketSequence> sequences(int group) {
    std::vector<SocketSequence> all;
    for (auto& l : loops_) {
      auto v = l->call([&] { return l->sequences(group); });
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  }
  int open_count(int group, bool with_subscription) {
    int n = 0;
    for (auto& l : loops_) n += l->call([&] { return l->open_count(group, with_subscription); });
    return n;
  }
  void resubscribe(int group, const std::string& channel, const std::string& id, bool only_inactive,
                   int lo, int hi) {
    for (auto& l : loops_)
      l->call([&] { l->resubscribe(group, channel, id, only_inactive, lo, hi); });
  }
  int inactive_in(int group, int lo, int hi) {
    int n = 0;
    for (auto& l : loops_) n += l->call([&] { return l->inactive_in(group, lo, hi); });
    return n;
  }
  void close_group(int group) {
    for (auto& l : loops_) l->call([&] { l->close_group(group); });
  }

 private:
  std::vector<std::unique_ptr<Loop>> loops_;
};

// ---------------------------------------------------------------------------------------------
// A blocking websocket connection for the bench driver to the baseline's /publish.

class PublishSocket {
 public:
  PublishSocket(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
      throw std::runtime_error(std::string("publish socket: connect: ") + std::strerror(errno));
    write_all(upgrade_request(port, "/publish", ""));
    std::string resp;
    char buf[4096];
    while (resp.find("\r\n\r\n") == std::string::npos) {
      const ssize_t n = read(fd_, buf, sizeof buf);
      if (n <= 0) throw std::runtime_error("publish socket: no upgrade response");
      resp.append(buf, static_cast<size_t>(n));
    }
    if (resp.rfind("HTTP/1.1 101", 0) != 0)
      throw std::runtime_error("publish socket: upgrade refused: " + resp);
  }
  ~PublishSocket() {
    if (fd_ >= 0) ::close(fd_);
  }
  void send(const std::string& text) {
    std::string frame;
    append_frame(frame, 0x1, text.data(), text.size());
    write_all(frame);
  }

 private:
  void write_all(const std::string& s) {
    size_t at = 0;
    while (at < s.size()) {
      const ssize_t n = ::write(fd_, s.data() + at, s.size() - at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        throw std::runtime_error(std::string("publish socket: write: ") + std::strerror(errno));
      at += static_cast<size_t>(n);
    }
  }
  int fd_ = -1;
};

}  // namespace outlive::bench
