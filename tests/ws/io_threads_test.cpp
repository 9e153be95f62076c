// The io threads' error funnel (SPEC 5.7 rev 3): a handler that throws costs its own operation,
// never the thread or the process.
#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include <boost/asio/post.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <stdexcept>

#include "common/thread_failures.hpp"
#include "ws/io_threads.hpp"

using namespace outlive::ws;
using namespace std::chrono_literals;

TEST_CASE("a handler that throws on an io thread is logged and the thread serves the next one") {
  IoThreads io(1);
  io.start();
  const auto failures = IoThreads::handler_failures();
  const auto counted = outlive::thread_failures(outlive::ThreadKind::io);  // (on /metrics)
  boost::asio::post(io.at(0), [] { throw std::runtime_error("invalid UTF-8 byte"); });
  boost::asio::post(io.at(0), [] { throw 42; });
  std::promise<void> served;
  boost::asio::post(io.at(0), [&] { served.set_value(); });
  CHECK(served.get_future().wait_for(5s) == std::future_status::ready);
  CHECK(IoThreads::handler_failures() == failures + 2);
  CHECK(outlive::thread_failures(outlive::ThreadKind::io) == counted + 2);
  io.stop_and_join();
}
