// A connection's write side (ws/write_side): what a write's result means (write on, wait for room,
// the peer is gone, the close frame went out), corking up to 64 KiB, the close after the last
// frame, and the batch's share of a write. The test plays the connection (a fake owner that
// records what it is told) and the peer (the other end of a socketpair, read without waiting):
// no network, no io_uring (no SendBatch::Scope is open, so every write is the side's own).
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <array>
#include <cerrno>
#include <memory>
#include <string>

#include "ws/write_side.hpp"

using namespace outlive::ws;

namespace {

struct FakeOwner : WriteSide::Owner {
  WriteSide* side = nullptr;
  int waits = 0, drains = 0, failures = 0, rooms = 0, closes_sent = 0;
  size_t bytes = 0;
  void wait_writable() override { ++waits; }
  void taken(size_t n, SendQueue::Taken what) override {
    bytes += n;
    if (what.popped) ++rooms;
    if (what.close_sent) ++closes_sent;
  }
  // As the connection does: the close follows the last frame.
  void drained() override {
    ++drains;
    side->send_control(Opcode::close, close_payload(1000, ""));
  }
  void write_failed() override { ++failures; }
  std::shared_ptr<WriteSide> batch_hold() override { return {std::shared_ptr<WriteSide>(), side}; }
};

// A write side on one end of a socketpair; the test reads the other.
struct Rig {
  std::array<int, 2> fds{-1, -1};
  FakeOwner owner;
  std::unique_ptr<WriteSide> side;
  Rig() {
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds.data()) == 0);
    side = std::make_unique<WriteSide>(owner, fds[0]);
    owner.side = side.get();
  }
  ~Rig() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  // Everything the peer can read now.
  std::string peer_reads() {
    std::string out;
    std::array<char, 64 * 1024> buf;
    for (;;) {
      const ssize_t n = ::recv(fds[1], buf.data(), buf.size(), MSG_DONTWAIT);
      if (n <= 0) return out;
      out.append(buf.data(), static_cast<size_t>(n));
    }
  }
};

std::string text_bytes(const std::string& payload) {
  const Frame f = Frame::text(payload);
  return std::string(reinterpret_cast<const char*>(f.header.bytes.data()), f.header.size) + payload;
}

// The batch's part of a write: what it would hand the kernel.
size_t prepare(WriteSide& side) {
  msghdr msg{};
  std::array<iovec, 24> iov{};
  size_t offered = 0;
  REQUIRE(side.prepare_batched(msg, iov.data(), 6, offered));
  return offered;
}

}  // namespace

TEST_CASE("write side: frames go out at once, in order, and each that leaves makes room") {
  Rig r;
  r.side->send(Frame::text("one"));
  r.side->send(Frame::text("two"));
  CHECK(r.peer_reads() == text_bytes("one") + text_bytes("two"));
  CHECK(r.side->queued_bytes() == 0);
  CHECK(r.owner.bytes == 10);
  CHECK(r.owner.rooms == 2);
  CHECK(r.owner.waits == 0);
  CHECK_FALSE(r.side->writing());
}

TEST_CASE("write side: corked frames wait until uncork, or until 64 KiB wait") {
  Rig r;
  r.side->cork();
  // One byte under kCorkedBytes (a 2-byte header, then the payload) stays queued...
  const std::string under(SendQueue::kCorkedBytes - 1 - 4, 'a');
  r.side->send(Frame::text(under));
  CHECK(r.side->queued_bytes() == SendQueue::kCorkedBytes - 1);
  CHECK(r.peer_reads().empty());
  r.side->uncork();
  CHECK(r.peer_reads() == text_bytes(under));

  // ...and at kCorkedBytes the queue goes out though still corked.
  r.side->cork();
  r.side->send(Frame::text(under));
  CHECK(r.peer_reads().empty());
  r.side->send(Frame::text(""));  // its 2 bytes make 64 KiB + 1
  CHECK(r.peer_reads() == text_bytes(under) + text_bytes(""));
  CHECK(r.side->queued_bytes() == 0);
}

TEST_CASE("write side: a partial batched write waits for room, then the rest follows") {
  Rig r;
  r.side->cork();  // queued, not written: the test plays the batch
  const std::string payload(100, 'x');
  r.side->send(Frame::text(payload));
  const size_t offered = prepare(*r.side);
  CHECK(offered == 102);
  r.side->on_batched_write(40, offered);
  CHECK(r.owner.waits == 1);
  CHECK(r.side->writing());
  CHECK(r.side->queued_bytes() == 102);  // (the front's written part counts until it leaves)
  CHECK(r.owner.rooms == 0);
  r.side->uncork();  // waiting for room: nothing is written before on_writable
  CHECK(r.peer_reads().empty());
  r.side->on_writable(true);
  CHECK_FALSE(r.side->writing());
  CHECK(r.peer_reads() == text_bytes(payload).substr(40));
  CHECK(r.owner.rooms == 1);
  CHECK(r.owner.bytes == 102);
}

TEST_CASE("write side: EAGAIN waits for room, EINTR does not, another error loses the peer") {
  Rig r;
  r.side->cork();
  r.side->send(Frame::text("abc"));
  SECTION("EAGAIN") {
    r.side->on_batched_write(-EAGAIN, prepare(*r.side));
    CHECK(r.owner.waits == 1);
    CHECK(r.side->writing());
    CHECK(r.side->queued_bytes() == 5);
    r.side->on_writable(false);  // the wait failed: the socket is gone
    CHECK(r.owner.failures == 1);
  }
  SECTION("EINTR") {
    r.side->on_batched_write(-EINTR, prepare(*r.side));
    CHECK(r.owner.waits == 0);
    CHECK(r.owner.failures == 0);
    CHECK_FALSE(r.side->writing());
    r.side->uncork();  // nothing was taken: the whole frame goes
    CHECK(r.peer_reads() == text_bytes("abc"));
  }
  SECTION("EPIPE") {
    r.side->on_batched_write(-EPIPE, prepare(*r.side));
    CHECK(r.owner.failures == 1);
    CHECK(r.owner.waits == 0);
    CHECK(r.side->queued_bytes() == 5);
  }
}

TEST_CASE("write side: a whole batched write takes the batch's share, the rest stays queued") {
  Rig r;
  r.side->cork();
  for (int i = 0; i < 7; ++i) r.side->send(Frame::text(std::to_string(i)));
  // The batch offers 6 frames (as SendBatch does); the seventh stays for the side's own write.
  const size_t offered = prepare(*r.side);
  CHECK(offered == 18);
  r.side->on_batched_write(static_cast<int>(offered), offered);
  CHECK(r.owner.waits == 0);
  CHECK(r.owner.rooms == 1);
  CHECK(r.side->queued_bytes() == 3);
  r.side->uncork();
  CHECK(r.peer_reads() == text_bytes("6"));
  CHECK(r.side->queued_bytes() == 0);
  CHECK(r.owner.rooms == 2);
}

TEST_CASE("write side: a socket that takes only part of a frame waits until it is writable") {
  Rig r;
  const std::string big(4 * 1024 * 1024, 'b');  // more than a unix socket's buffer
  r.side->send(Frame::text(big));
  REQUIRE(r.owner.waits == 1);
  CHECK(r.side->writing());
  const size_t first = r.owner.bytes;
  CHECK(first > 0);
  CHECK(r.side->queued_bytes() == big.size() + 10);
  r.side->send(Frame::text("after"));  // queued behind, not written while waiting
  std::string got = r.peer_reads();
  CHECK(got.size() == first);
  while (r.side->writing()) {
    r.side->on_writable(true);
    got += r.peer_reads();
  }
  CHECK(got == text_bytes(big) + text_bytes("after"));
  CHECK(r.side->queued_bytes() == 0);
  CHECK(r.owner.rooms >= 1);  // (both may leave in the last write)
  CHECK(r.owner.bytes == big.size() + 10 + 7);
}

TEST_CASE("write side: closing with nothing queued sends the close once, and nothing after it") {
  Rig r;
  r.side->send(Frame::text("last"));
  CHECK(r.side->begin_closing());
  CHECK_FALSE(r.side->begin_closing());
  r.side->send(Frame::text("dropped"));  // the protocol's frames stop once closing
  CHECK(r.side->queued_bytes() == 0);
  CHECK(r.owner.drains == 0);
  r.side->do_write();
  CHECK(r.owner.drains == 1);
  CHECK(r.owner.closes_sent == 1);
  CHECK(r.side->close_queued());
  r.side->do_write();
  r.side->send_control(Opcode::ping, "");  // nothing follows the close
  CHECK(r.owner.drains == 1);
  const std::string close = r.peer_reads();
  CHECK(close.substr(0, text_bytes("last").size()) == text_bytes("last"));
  CHECK(close.substr(text_bytes("last").size()) == "\x88\x02\x03\xe8");
}

TEST_CASE("write side: the close waits behind a partly written frame, and finish stops writing") {
  Rig r;
  r.side->cork();
  r.side->send(Frame::text("partly"));
  r.side->on_batched_write(3, prepare(*r.side));
  REQUIRE(r.side->writing());
  r.side->begin_closing();
  r.side->drop_unstarted();
  r.side->do_write();
  CHECK(r.owner.drains == 0);  // waiting for room: the frame's rest goes first
  SECTION("writable: the rest, then the close") {
    r.side->uncork();
    r.side->on_writable(true);
    CHECK(r.owner.drains == 1);
    CHECK(r.peer_reads() == text_bytes("partly").substr(3) + "\x88\x02\x03\xe8");
  }
  SECTION("finished: nothing more") {
    CHECK(r.side->finish());
    CHECK_FALSE(r.side->finish());
    r.side->on_writable(true);
    r.side->send_control(Opcode::ping, "");
    CHECK(r.owner.failures == 1);  // (the connection's finish() returns at once)
    CHECK(r.peer_reads().empty());
    msghdr msg{};
    std::array<iovec, 24> iov{};
    size_t offered = 0;
    CHECK_FALSE(r.side->prepare_batched(msg, iov.data(), 6, offered));
  }
}
