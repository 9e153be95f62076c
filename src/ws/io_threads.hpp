#pragma once
// The io threads, each running an io_context of its own (uWebSockets' loops): a connection lives
// on one thread from accept to close, so its handlers never run at the same time and need no
// strand, and work for many connections of one thread (a round of the fan-out, the progress tick)
// reaches it in one hand-off instead of one post per connection.
#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace outlive::ws {

class IoThreads {
 public:
  explicit IoThreads(int count);
  ~IoThreads();
  IoThreads(const IoThreads&) = delete;
  IoThreads& operator=(const IoThreads&) = delete;

  size_t size() const { return contexts_.size(); }
  boost::asio::io_context& at(size_t index) { return *contexts_[index]; }
  // The thread the next connection lives on (round robin).
  size_t next() { return next_.fetch_add(1, std::memory_order_relaxed) % contexts_.size(); }
  // Which thread runs `executor` (0 for an executor of another context).
  size_t index_of(const boost::asio::any_io_executor& executor) const;

  void start();
  bool running() const { return !threads_.empty(); }
  // Stops every context and joins its thread; handlers that did not run stay queued.
  void stop_and_join();
  // After stop_and_join(): runs what is queued, each context on a thread again, until nothing
  // is left or `limit` passed; then stops them and destroys the handlers that never ran.
  void drain_and_shut_down(std::chrono::milliseconds limit);
  // Handlers on these threads that threw (each was logged and cost only its own connection).
  static uint64_t handler_failures() { return handler_failures_.load(std::memory_order_relaxed); }

 private:
  // shutdown() is protected in io_context; stopping needs it to destroy handlers that never ran.
  struct Context : boost::asio::io_context {
    Context() : boost::asio::io_context(1) {}
    using boost::asio::io_context::shutdown;
  };
  std::vector<std::unique_ptr<Context>> contexts_;
  std::vector<std::thread> threads_;
  // A context with nothing to do yet (no socket) would return from run() at once.
  std::vector<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> busy_;
  std::atomic<size_t> next_{0};
  static void run_guarded(boost::asio::io_context& context);
  static std::atomic<uint64_t> handler_failures_;
};

}  // namespace outlive::ws
