#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include "hooks/client.hpp"

#include <boost/beast/http.hpp>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "common/thread_name.hpp"
#include "hooks/signature.hpp"
#include "http_client/link.hpp"

namespace outlive::hooks {

namespace {

namespace http = boost::beast::http;
using Clock = std::chrono::steady_clock;

// An answer is a JSON document of keys or viewer ids: 8 MiB holds 1,000 long keys many times over.
constexpr size_t kMaxBody = 8 * 1024 * 1024;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

struct Client::Impl {
  const std::string app;
  const std::string secret;
  const size_t max_in_flight;
  const size_t max_waiting;

  struct Job {
    Call call;
    Done done;
    Clock::time_point posted;
  };
  mutable std::mutex mutex;
  std::condition_variable wake;
  std::deque<Job> jobs;
  std::vector<std::thread> threads;
  size_t idle = 0;
  bool stopping = false;

  Impl(std::string a, std::string s, int in_flight, size_t waiting)
      : app(std::move(a)),
        secret(std::move(s)),
        max_in_flight(in_flight < 1 ? 1 : static_cast<size_t>(in_flight)),
        max_waiting(waiting) {}

  Answer send(std::map<std::string, std::unique_ptr<http_client::Link>>& links, Job& job) {
    Answer a;
    const std::string what = "hook POST " + job.call.url_text;
    auto& link = links[job.call.url.origin()];
    if (!link) link = std::make_unique<http_client::Link>(job.call.url, what);
    http_client::Request request{http::verb::post, job.call.url.target, 11};
    request.set(http::field::content_type, "application/json");
    request.set(http::field::accept, "application/json");
    request.set(kSignatureHeader, signature(secret, job.call.body, std::time(nullptr)));
    request.body() = job.call.body;
    try {
      auto response = link->exchange(request, job.call.deadline, kMaxBody);
      a.status = response.result_int();
      if (a.status != 200) {
        a.failure = what + ": status " + std::to_string(a.status) + " (200 expected)";
      } else {
        a.body = std::move(response.body());
      }
    } catch (const Error& e) {
      // The Link's message names the URL and the step that failed.
      a.failure = std::string(e.what());
      a.timed_out = e.code() == Errc::timeout;
      if (a.failure.rfind(what, 0) != 0) a.failure = what + ": " + a.failure;
    } catch (const std::exception& e) {
      a.failure = what + ": " + e.what();
    }
    return a;
  }

  void work() {
    name_this_thread("outlive-hooks");
    // Kept-alive connections of this worker, one per origin.
    std::map<std::string, std::unique_ptr<http_client::Link>> links;
    std::unique_lock lock(mutex);
    for (;;) {
      ++idle;
      wake.wait(lock, [&] { return stopping || !jobs.empty(); });
      --idle;
      if (jobs.empty()) return;  // stopping
      Job job = std::move(jobs.front());
      jobs.pop_front();
      lock.unlock();
      Answer answer;
      if (job.call.make_body && Clock::now() < job.call.deadline) {
        job.call.body = job.call.make_body();
      }
      if (Clock::now() >= job.call.deadline) {
        answer.failure = "hook POST " + job.call.url_text +
                         ": no answer within the timeout (waiting for one of the app's " +
                         std::to_string(max_in_flight) + " hook calls in flight)";
        answer.timed_out = true;
      } else {
        answer = send(links, job);
      }
      answer.seconds = seconds_since(job.posted);
      job.done(std::move(answer));
      job = Job{};
      lock.lock();
    }
  }
};

Client::Client(std::string app, std::string secret, int max_in_flight, size_t max_waiting)
    : impl_(std::make_unique<Impl>(std::move(app), std::move(secret), max_in_flight, max_waiting)) {}

Client::~Client() { stop(); }

void Client::post(Call call, Done done) {
  auto& s = *impl_;
  std::string refused;
  {
    std::lock_guard lock(s.mutex);
    if (s.stopping) {
      refused = "the replica is stopping";
    } else if (s.jobs.size() >= s.max_waiting) {
      refused = std::to_string(s.max_waiting) + " hook calls of app " + s.app + " wait already";
    } else {
      s.jobs.push_back(Impl::Job{std::move(call), std::move(done), Clock::now()});
      // A worker per call in flight, started when none is idle for it.
      if (s.idle < s.jobs.size() && s.threads.size() < s.max_in_flight) {
        s.threads.emplace_back([impl = impl_.get()] { impl->work(); });
      }
      s.wake.notify_one();
      return;
    }
  }
  Answer a;
  a.failure = "hook POST " + call.url_text + ": " + refused;
  done(std::move(a));
}

size_t Client::waiting() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->jobs.size();
}

size_t Client::workers() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->threads.size();
}

void Client::stop() {
  auto& s = *impl_;
  std::deque<Impl::Job> dropped;
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(s.mutex);
    if (s.stopping && s.threads.empty()) return;
    s.stopping = true;
    dropped.swap(s.jobs);
    threads.swap(s.threads);
  }
  s.wake.notify_all();
  for (auto& job : dropped) {
    Answer a;
    a.failure = "hook POST " + job.call.url_text + ": the replica is stopping";
    job.done(std::move(a));
  }
  for (auto& t : threads) t.join();
}

}  // namespace outlive::hooks
