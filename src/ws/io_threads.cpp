#include "ws/io_threads.hpp"

#include <boost/asio/execution/context.hpp>
#include <boost/asio/query.hpp>

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
      context->run();
    });
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
      context->run_for(limit);
    });
  }
  for (auto& t : drains) t.join();
  for (auto& c : contexts_) {
    c->stop();
    c->shutdown();
  }
}

}  // namespace outlive::ws
