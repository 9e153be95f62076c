#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/socket_slot.hpp"
#include "db/liveness.hpp"

namespace outlive::db {

class Connection;  // db/connection.hpp

struct PoolOptions {
  int workers = 8;
  std::chrono::milliseconds statement_timeout{15000};
  // libpq counts whole seconds, at least 2 (it raises 1 to 2).
  std::chrono::milliseconds connect_timeout{5000};
  size_t max_waiting = 1024;
  // Bytes of one block each connection's backend allocates and frees once, the first time its
  // worker finds nothing waiting after connecting (0: none).
  // A glibc backend trims its heap whenever more than 128 KiB sits free at the top, until it first
  // frees a block it had mmap()ed; from then on it keeps up to twice that block's size (mallopt(3),
  // the dynamic mmap threshold). Without this, a backend whose first statements were small gives
  // memory back and maps it again, several times per statement, for every authorize() of hundreds
  // of viewers: 3x its CPU (docs/BENCHMARKS.md, "A revocation's Postgres time").
  size_t backend_heap_prime = 4 << 20;
  // How long a `Urgency::gathering` task may stand aside for tasks posted after it (below).
  std::chrono::milliseconds gathering_wait{1000};
  // At most this many workers run gathering tasks at once (unless the oldest waited
  // gathering_wait), so the calls behind them keep gathering while other workers are idle. One:
  // a reconnect storm of 20,000 subs on 1,000 keys made 1,562-2,765 authorize calls, against
  // 2,660-5,244 with two and 5,125-12,339 with no limit (docs/BENCHMARKS.md).
  int gathering_workers = 1;
};

// What a task's wait in the queue costs. `now`: a question somebody waits on (a credential, a
// sub's keys(), an access update's authorize()). `gathering`: a call that others join while it
// waits to start (authorize_joins.hpp). A worker takes gathering tasks only when no `now` task
// waits and fewer than `gathering_workers` run one, or once the oldest has waited
// `gathering_wait`: in a reconnect storm a key's viewers keep joining its one call while the pool
// answers the sockets' own questions, instead of each arriving after the previous call started
// (issue 46: 5,000-12,000 authorize calls for 20,000 subs on 1,000 keys). An idle pool runs one
// at once.
enum class Urgency { now, gathering };

// Each worker owns one connection; a task runs with it and must catch its own exceptions. A
// connection is never handed to a task once it is known or likely dead (issue 47): one closed by
// the server (its idle socket has something to say), or opened before another connection was
// found dead (db/liveness.hpp, Generations) is replaced first; a task whose connection dies under
// it may retry once on a fresh one (reopen_if_lost). Statements are cut off after `statement_timeout` and
// connecting after `connect_timeout`, so neither a hanging check nor an unreachable server holds a
// worker for long. Waiting work is bounded (SPEC 5.8): beyond `max_waiting` a post is refused and
// its owner answers as for a timeout.
class Pool {
 public:
  using Task = std::function<void(Connection&)>;
  Pool(std::string url, int workers,
       std::chrono::milliseconds statement_timeout = std::chrono::seconds(15));
  Pool(std::string url, PoolOptions options);
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // Queues `task`. Returns false (the task is dropped, never run) when max_waiting tasks already
  // wait or the pool is stopping. `wanted`, when given, is called just before the task would run
  // (before its worker connects, when it must); a task no longer wanted (e.g. its socket closed)
  // is dropped without running. A task whose worker is refused a connection (a server restarting)
  // waits while the worker tries again every 100 ms, as long as it is wanted and at most
  // `statement_timeout`; one whose attempt ran into `connect_timeout` (a server that does not
  // answer) is dropped, so such a server holds no worker for long.
  bool post(Task task, std::function<bool()> wanted = {}, Urgency urgency = Urgency::now);
  size_t waiting() const;          // tasks queued (of either urgency), not yet running
  size_t backends_primed() const;  // times a connection's backend was primed (backend_heap_prime)
  // ping() on a worker's connection, answered on the calling thread (tests); false after 2 s
  // without an answer. Readiness does not use it: it pings a KeptConnection of its own, which
  // stop() can cut short and which does not wait behind the pool's queue.
  bool healthy();
  // Whether checks succeed: false from a connection found dead or a connect that failed until a
  // task next ran to its end on a live connection. Readiness asks this, so /readyz is not 200
  // while checks still fail.
  bool serving() const { return serving_.load(); }
  // Connections closed because they were dead or suspect (not counting failed connects).
  size_t replaced() const { return replaced_.load(); }
  // Drops the waiting tasks, lets running ones finish (for at most 1 s: a server that stops
  // answering would hold them forever; then their connections are shut down) and joins the
  // workers.
  void stop();

 private:
  struct Job {
    Task task;
    std::function<bool()> wanted;
    bool waits_for_server = true;  // false: a probe (healthy()), answered "no" at once
    std::chrono::steady_clock::time_point queued{};
    bool gathering = false;
  };
  // Under mutex_: a gathering task may start now (see PoolOptions::gathering_workers).
  bool gathering_aged(std::chrono::steady_clock::time_point now) const;
  bool gathering_ready(std::chrono::steady_clock::time_point now) const;
  bool enqueue(Job job, Urgency urgency = Urgency::now);
  bool idle() const { return tasks_.empty() && gathering_.empty(); }  // under mutex_
  Job take();  // the next job under mutex_, from a pool that is not idle()
  void work(SocketSlot& slot);
  void prime(Connection& conn);
  const std::string url_;  // with connect_timeout
  const PoolOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::condition_variable retry_cv_;  // a worker waiting to connect again: woken by stop()
  static constexpr std::chrono::milliseconds kConnectRetry{100};
  std::deque<Job> tasks_;      // Urgency::now
  std::deque<Job> gathering_;  // Urgency::gathering
  int gathering_running_ = 0;
  bool stopping_ = false;
  int exited_ = 0;  // workers whose work() returned
  std::atomic<size_t> primed_{0};
  Generations generations_;
  std::atomic<bool> serving_{true};
  std::atomic<size_t> replaced_{0};
  std::condition_variable exited_cv_;
  std::vector<std::unique_ptr<SocketSlot>> slots_;  // per worker, its connection
  std::vector<std::thread> workers_;
};

// `SELECT 1` on `conn`: the one liveness query (Pool::healthy, KeptConnection::ping). Throws when
// it fails.
void ping(Connection& conn);

// For a pool task whose statement failed (threw `e`, or answered a failure: nullptr): when the
// failure was the connection's own loss, its worker opens a fresh one in its place and this
// returns true, for the task to run its statements once more on `conn`; false otherwise (a
// statement's own error, a connection outside the pool, or the server still unreachable). Call
// it once nothing of the failed statements (a transaction, a stream) is alive. Checks only read,
// so running them twice is harmless.
bool reopen_if_lost(Connection& conn, const std::exception* e = nullptr);

// `url` (a postgresql:// URI or a keyword/value conninfo) with libpq's connect_timeout set to
// `timeout` in whole seconds, at least 1. A connect_timeout already in `url` is overridden.
std::string with_connect_timeout(const std::string& url, std::chrono::milliseconds timeout);
// `url` with libpq's setting `name` set to `value` (a value in `url` is overridden). `value` must
// need no quoting or escaping.
std::string with_setting(const std::string& url, const std::string& name, const std::string& value);
// `url` with `application_name` as libpq's fallback_application_name: what pg_stat_activity shows
// for the connection unless `url` (or PGAPPNAME) names it (the pool's connections are
// "outlive-pool").
std::string named(const std::string& url, const std::string& application_name);

}  // namespace outlive::db
