#include "ws/io_threads.hpp"

#include <boost/asio/execution/context.hpp>
#include <boost/asio/query.hpp>

#include "common/log.hpp"
#include "common/thread_failures.hpp"
#include "common/thread_name.hpp"

namespace outlive::ws {

IoThreads::IoThreads(int count) {
  for (int i = 0; i < std::max(count, 1); ++i) contexts_.push_back(std::make_unique<Context>());
}

IoThreads::~IoThreads() { stop_and_join(); }

size_t IoThreads::index_of(const boost::asio::any_io_executor& executor) const {
  auto& context = boost::asio::query(executor, boost::asio::execution::context);
  for (size_t i = 0; i < contexts_.size(); ++i) {
    if (&context == static_cast<boost::asio::execution_context*>(contexts_[i].get())) return i;
  }
  return 0;
}

void IoThreads::start() {
  if (!threads_.empty()) return;
  for (auto& c : contexts_) {
    busy_.push_back(boost::asio::make_work_guard(*c));
    threads_.emplace_back([context = c.get(), n = threads_.size()] {
      name_this_thread("outlive-io-" + std::to_string(n));
      run_guarded(*context);
    });
  }
}

// The last error funnel of the threads that serve sockets (SPEC 5.7 rev 3): a socket's own
// handlers catch first and close that socket 1011 (session::Session::serving_failed); a handler
// that throws past them loses its own operation (its connection's shared_ptr is released with the
// handler, which closes that socket) and the thread goes back to serving every other one.
std::atomic<uint64_t> IoThreads::handler_failures_{0};

void IoThreads::run_guarded(boost::asio::io_context& context) {
  for (;;) {
    try {
      context.run();
      return;
    } catch (const std::exception& e) {
      handler_failures_.fetch_add(1, std::memory_order_relaxed);
      count_thread_failure(ThreadKind::io);
      log::limited(log::Level::error, "a handler on an io thread failed; its connection is dropped",
                   {{"error", e.what()}});
    } catch (...) {
      handler_failures_.fetch_add(1, std::memory_order_relaxed);
      count_thread_failure(ThreadKind::io);
      log::limited(log::Level::error,
                   "a handler on an io thread failed; its connection is dropped");
    }
  }
}

void IoThreads::stop_and_join() {
  busy_.clear();
  for (auto& c : contexts_) c->stop();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

void IoThreads::drain_and_shut_down(std::chrono::milliseconds limit) {
  std::vector<std::thread> drains;
  for (auto& c : contexts_) {
    drains.emplace_back([context = c.get(), limit] {
      context->restart();
      const auto until = std::chrono::steady_clock::now() + limit;
      for (;;) {
        try {
          context->run_until(until);
          return;
        } catch (const std::exception& e) {
          handler_failures_.fetch_add(1, std::memory_order_relaxed);
          count_thread_failure(ThreadKind::io);
          log::error("a handler on an io thread failed while stopping", {{"error", e.what()}});
        }
      }
    });
  }
  for (auto& t : drains) t.join();
  for (auto& c : contexts_) {
    c->stop();
    c->shutdown();
  }
}

}  // namespace outlive::ws
