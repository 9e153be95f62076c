#pragma once
// Calls to one app's hooks (SPEC 5.1, 5.4 rev 4): signed POSTs of JSON over kept-alive HTTP/1.1
// connections, at most hooks.max_in_flight at once; the calls beyond it wait in a bounded queue.
// Calls run on the client's own worker threads (started as needed, each with its kept-alive
// connections), never on an io thread, the dispatcher's or a database worker.
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "http_client/url.hpp"

namespace outlive::hooks {

struct Call {
  http_client::Url url;
  std::string url_text;  // for logs and errors
  std::string body;      // JSON
  std::chrono::steady_clock::time_point deadline;  // waiting in the queue counts
  // When set, the body is this function's, called on the worker that sends the call, just before
  // it does: what joins a batch while the call waits in the queue still goes out with it.
  std::function<std::string()> make_body;
};

// A call's outcome: a 200 with its body, or why not (`failure` not empty: timeout, connection,
// status, no room), the message naming the URL.
struct Answer {
  std::string body;
  std::string failure;
  bool timed_out = false;
  int status = 0;  // the HTTP status when one came
  double seconds = 0;  // from the post to the answer
};

class Client {
 public:
  using Done = std::function<void(Answer)>;
  // `secret` signs every request (hooks::signature); `max_in_flight` workers at most;
  // `max_waiting` calls queued beyond them.
  Client(std::string app, std::string secret, int max_in_flight, size_t max_waiting = 4096);
  ~Client();  // stop()
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Queues `call`; `done` runs once, on a worker thread, with the answer. From any thread, never
  // blocks. With no room in the queue, or once stopped, `done` runs at once on the calling thread
  // with the failure. A call still waiting at its deadline is answered as a timeout, not sent.
  void post(Call call, Done done);

  // Calls queued and not yet started.
  size_t waiting() const;
  // Workers started so far (at most max_in_flight).
  size_t workers() const;

  // Answers the waiting calls as failed, lets the running ones end (each within its deadline) and
  // joins the workers.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outlive::hooks
