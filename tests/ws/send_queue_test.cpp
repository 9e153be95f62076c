// A connection's send queue (ws/send_queue): bytes waiting, partial writes, corking, one pong,
// nothing after the close. Pure: the test plays the kernel.
#include <catch2/catch.hpp>

#include <sys/uio.h>

#include <memory>
#include <string>

#include "ws/send_queue.hpp"

using namespace outlive::ws;

namespace {

// The bytes gather() offers, as one string.
std::string offered(const SendQueue& q, size_t max_frames = 64) {
  iovec iov[64 * 4];
  size_t parts = 0;
  const size_t n = q.gather(iov, max_frames, parts);
  std::string out;
  for (size_t i = 0; i < parts; ++i)
    out.append(static_cast<const char*>(iov[i].iov_base), iov[i].iov_len);
  REQUIRE(out.size() == n);
  return out;
}

std::string wire(const Frame& f) {
  std::string s(f.header.view());
  s += f.own;
  if (f.head) s += *f.head;
  if (f.shared) s += *f.shared;
  return s;
}

}  // namespace

TEST_CASE("send queue: frames go out whole, in order, and a partial write resumes mid-frame") {
  SendQueue q;
  const Frame a = Frame::text("hello");
  const Frame b = Frame::update(std::make_shared<const std::string>(R"({"ids":["s"])"),
                                std::make_shared<const std::string>(R"(,"n":1})"));
  q.push(a);
  q.push(b);
  CHECK(q.bytes() == a.size() + b.size());
  CHECK(offered(q) == wire(a) + wire(b));

  auto taken = q.consume(3);  // mid-header of the first
  CHECK_FALSE(taken.popped);
  CHECK(q.bytes() == a.size() + b.size());  // a frame counts until it is all written
  CHECK(offered(q) == (wire(a) + wire(b)).substr(3));
  taken = q.consume(a.size() - 3);
  CHECK(taken.popped);
  CHECK(q.bytes() == b.size());
  CHECK(offered(q) == wire(b));
  CHECK(offered(q, 0).empty());  // max_frames bounds the gather
  q.consume(b.size());
  CHECK(q.empty());
  CHECK(q.bytes() == 0);
}

TEST_CASE("send queue: corked below 64 KiB holds, at 64 KiB it writes") {
  SendQueue q;
  CHECK_FALSE(q.held());
  q.cork();
  CHECK(q.held());
  // A header of 4 bytes: one byte under the limit.
  q.push(Frame::text(std::string(SendQueue::kCorkedBytes - 5, 'x')));
  REQUIRE(q.bytes() == SendQueue::kCorkedBytes - 1);
  CHECK(q.held());
  q.push(Frame::text(""));  // header of 2 bytes: over
  CHECK(q.bytes() >= SendQueue::kCorkedBytes);
  CHECK_FALSE(q.held());
  q.uncork();
  CHECK_FALSE(q.held());
}

TEST_CASE("send queue: one pong waits at most, a started one is left alone") {
  SendQueue q;
  CHECK_FALSE(q.push_pong("1"));
  CHECK(q.push_pong("22"));  // replaces "1": answers the latest ping
  CHECK(offered(q) == wire(Frame::control(Opcode::pong, "22")));
  CHECK(q.bytes() == Frame::control(Opcode::pong, "22").size());

  q.consume(1);  // the pong is partly written: it cannot change now
  CHECK_FALSE(q.push_pong("333"));
  CHECK(q.bytes() ==
        Frame::control(Opcode::pong, "22").size() + Frame::control(Opcode::pong, "333").size());
}

TEST_CASE("send queue: nothing after a close frame is gathered, and its write is reported") {
  SendQueue q;
  const Frame text = Frame::text("bye");
  const Frame close = Frame::control(Opcode::close, close_payload(1000, ""));
  q.push(text);
  CHECK_FALSE(q.close_queued());
  q.push(close);
  CHECK(q.close_queued());
  q.push(Frame::text("never"));  // (the connection queues nothing after it; the gather stops)
  CHECK(offered(q) == wire(text) + wire(close));
  const auto taken = q.consume(text.size() + close.size());
  CHECK(taken.close_sent);
}

TEST_CASE("send queue: dropping keeps only a partly written frame") {
  SendQueue q;
  const Frame a = Frame::text("aaaa");
  q.push(a);
  q.push(Frame::text("bbbb"));
  q.drop_unstarted();
  CHECK(q.empty());
  CHECK(q.bytes() == 0);

  q.push(a);
  q.push(Frame::text("bbbb"));
  q.consume(2);
  q.drop_unstarted();
  CHECK(q.bytes() == a.size());
  CHECK(offered(q) == wire(a).substr(2));
}
