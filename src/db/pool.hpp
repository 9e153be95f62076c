#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <pqxx/pqxx>
#include <string>
#include <thread>
#include <vector>

namespace outlive::db {

// Each worker owns one connection; a task runs with it and must catch its own exceptions (a lost
// connection is reopened for the next task). Statements are cut off after `statement_timeout`, so
// a check that hangs frees its worker.
class Pool {
 public:
  using Task = std::function<void(pqxx::connection&)>;
  Pool(std::string url, int workers,
       std::chrono::milliseconds statement_timeout = std::chrono::seconds(15));
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  void post(Task task);
  // Runs a task and returns its result on the calling thread (startup checks, tests).
  bool healthy();
  void stop();

 private:
  void work();
  const std::string url_;
  const std::chrono::milliseconds statement_timeout_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace outlive::db
