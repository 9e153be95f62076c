#pragma once
// One socket's checks: a credential lookup on a pool worker, or an answer of the decider (a code
// channel answers itself), each under the socket's check deadline. A check that throws, finds no
// room in the pool or passes the 10 s deadline closes the socket with 1011 (the tab resumes from
// its cursor). Checks are independent: a re-check, a refresh and a sub never cancel each other.
// Everything runs on the socket's io thread; pool workers post back through
// Context::post_from_worker.
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include <boost/asio/any_io_executor.hpp>

namespace outlive::db {
class Connection;  // db/connection.hpp
}

namespace outlive::session {

struct Context;

// The socket as its checks see it (session::Session).
class CheckedSocket {
 public:
  virtual boost::asio::any_io_executor executor() = 0;  // the socket's io thread
  // Held by a check until it answered or timed out; null once the socket is being destroyed.
  virtual std::shared_ptr<void> keep_alive() = 0;
  virtual bool closing() const = 0;
  // From any thread (a pool worker): work for a closed socket is dropped.
  virtual bool closed() const = 0;
  // Both close the socket with 1011.
  virtual void check_timed_out() = 0;
  virtual void check_failed(const std::string& error) = 0;

 protected:
  ~CheckedSocket() = default;
};

class Checks {
 public:
  // The check's answer, from any thread: its result, or a failure (not empty).
  using Reply = std::function<void(nlohmann::json result, std::string failure)>;
  using Then = std::function<void(const nlohmann::json& result)>;

  // Both outlive the checks (the socket holds the context and its checks).
  Checks(Context& context, CheckedSocket& socket) : context_(context), socket_(socket) {}

  // Runs `work` on a pool worker, then `then` on the socket's io thread.
  void run(std::function<nlohmann::json(db::Connection&)> work, Then then);
  // The same for a check that answers itself: `start` runs on the io thread and calls its argument
  // once, from any thread, with the result or a failure (code channels answer this way).
  void run_async(std::function<void(Reply)> start, Then then);

 private:
  Context& context_;
  CheckedSocket& socket_;
};

}  // namespace outlive::session
