#pragma once
// The thread under the benches' load clients (fanout_client.hpp, storm_client.hpp): one epoll
// loop that hands each ready socket to the client (`Derived::on_event`), and runs what other
// threads post to it between two waits, woken through an eventfd. CRTP: `Derived` provides
//   void on_event(void* ptr, uint32_t events);  // ptr: what the socket was registered with
//   int timeout_ms();                            // the next wait's limit
//   void after_events();                         // after each wait (timers)
// and calls start_thread() once its members are ready and stop_thread() first in its destructor.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace outlive::bench {

template <class Derived>
class EpollThread {
 public:
  EpollThread() {
    ep_ = epoll_create1(EPOLL_CLOEXEC);
    wake_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;  // the wake-up: no socket is registered with null
    epoll_ctl(ep_, EPOLL_CTL_ADD, wake_, &ev);
  }
  ~EpollThread() {
    ::close(ep_);
    ::close(wake_);
  }
  EpollThread(const EpollThread&) = delete;
  EpollThread& operator=(const EpollThread&) = delete;

  // Any thread: runs `f` on the loop's thread after its current wait.
  void post(std::function<void()> f) {
    {
      std::lock_guard lock(mutex_);
      tasks_.push_back(std::move(f));
    }
    const uint64_t one = 1;
    [[maybe_unused]] auto n = write(wake_, &one, sizeof one);
  }

  // Any thread but the loop's: runs `f` there and returns what it returned.
  template <typename F>
  auto call(F f) -> decltype(f()) {
    std::promise<decltype(f())> p;
    auto fut = p.get_future();
    post([&] {
      if constexpr (std::is_void_v<decltype(f())>) {
        f();
        p.set_value();
      } else {
        p.set_value(f());
      }
    });
    return fut.get();
  }

 protected:
  void start_thread() {
    thread_ = std::thread([this] { run(); });
  }
  void stop_thread() {
    if (!thread_.joinable()) return;
    post([this] { stop_ = true; });
    thread_.join();
  }

  int ep_ = -1;

 private:
  void run() {
    auto& self = static_cast<Derived&>(*this);
    std::vector<epoll_event> events(1024);
    while (!stop_) {
      const int n =
          epoll_wait(ep_, events.data(), static_cast<int>(events.size()), self.timeout_ms());
      for (int i = 0; i < n; ++i) {
        const epoll_event& e = events[static_cast<size_t>(i)];
        if (e.data.ptr == nullptr) {
          uint64_t v;
          [[maybe_unused]] auto r = read(wake_, &v, sizeof v);
          continue;
        }
        self.on_event(e.data.ptr, e.events);
      }
      self.after_events();
      std::vector<std::function<void()>> tasks;
      {
        std::lock_guard lock(mutex_);
        tasks.swap(tasks_);
      }
      for (auto& t : tasks) t();
    }
  }

  int wake_ = -1;
  std::thread thread_;
  std::mutex mutex_;
  std::vector<std::function<void()>> tasks_;
  bool stop_ = false;
};

}  // namespace outlive::bench
