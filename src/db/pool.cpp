#include "db/pool.hpp"

#include <algorithm>
#include <future>
#include <optional>
#include <pqxx/pqxx>
#include <stdexcept>

#include "common/log.hpp"
#include "common/thread_failures.hpp"
#include "common/thread_name.hpp"
#include "db/connection.hpp"

namespace outlive::db {

std::string with_setting(const std::string& url, const std::string& name,
                         const std::string& value) {
  const std::string setting = name + "=" + value;
  // libpq keeps the last value of a repeated setting, in both forms, so appending overrides.
  if (url.rfind("postgresql://", 0) == 0 || url.rfind("postgres://", 0) == 0) {
    if (url.find('?') == std::string::npos) return url + "?" + setting;
    // "?&" and a trailing "&" followed by nothing are both refused by libpq.
    if (url.back() == '?' || url.back() == '&') return url + setting;
    return url + "&" + setting;
  }
  return url.empty() ? setting : url + " " + setting;
}

std::string with_connect_timeout(const std::string& url, std::chrono::milliseconds timeout) {
  // libpq reads whole seconds, and 0 would mean "wait forever".
  const auto seconds = std::max<int64_t>(1, (timeout.count() + 999) / 1000);
  return with_setting(url, "connect_timeout", std::to_string(seconds));
}

std::string named(const std::string& url, const std::string& application_name) {
  return with_setting(url, "fallback_application_name", application_name);
}

Pool::Pool(std::string url, int workers, std::chrono::milliseconds statement_timeout)
    : Pool(std::move(url), PoolOptions{workers, statement_timeout}) {}

Pool::Pool(std::string url, PoolOptions options)
    : url_(named(with_connect_timeout(url, options.connect_timeout), "outlive-pool")),
      options_(options) {
  if (options_.workers < 1) throw std::invalid_argument("a database pool needs a worker");
  for (int i = 0; i < options_.workers; ++i) {
    auto& slot = *slots_.emplace_back(std::make_unique<SocketSlot>());
    workers_.emplace_back([this, &slot, i] {
      name_this_thread("outlive-db-" + std::to_string(i));
      work(slot);
    });
  }
}

Pool::~Pool() { stop(); }

bool Pool::post(Task task, std::function<bool()> wanted, Urgency urgency) {
  return enqueue(Job{std::move(task), std::move(wanted)}, urgency);
}

bool Pool::enqueue(Job job, Urgency urgency) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_ || tasks_.size() + gathering_.size() >= options_.max_waiting) return false;
    if (urgency == Urgency::gathering) {
      job.queued = std::chrono::steady_clock::now();
      gathering_.push_back(std::move(job));
    } else {
      tasks_.push_back(std::move(job));
    }
  }
  cv_.notify_one();
  return true;
}

bool Pool::gathering_aged(std::chrono::steady_clock::time_point now) const {
  return !gathering_.empty() && now - gathering_.front().queued >= options_.gathering_wait;
}

bool Pool::gathering_ready(std::chrono::steady_clock::time_point now) const {
  return !gathering_.empty() &&
         (gathering_aged(now) || (tasks_.empty() && gathering_running_ < options_.gathering_workers));
}

Pool::Job Pool::take() {
  const auto now = std::chrono::steady_clock::now();
  const bool gathered_enough = gathering_aged(now) || (tasks_.empty() && gathering_ready(now));
  auto& from = gathered_enough ? gathering_ : tasks_;
  Job job = std::move(from.front());
  from.pop_front();
  if (gathered_enough) {
    job.gathering = true;
    ++gathering_running_;
  }
  return job;
}

size_t Pool::waiting() const {
  std::lock_guard lock(mutex_);
  return tasks_.size() + gathering_.size();
}

void Pool::stop() {
  std::deque<Job> dropped, dropped_gathering;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    dropped.swap(tasks_);
    dropped_gathering.swap(gathering_);
  }
  cv_.notify_all();
  retry_cv_.notify_all();
  // Outside the lock: a task's captures may post again when destroyed (refused now).
  dropped.clear();
  dropped_gathering.clear();
  {
    std::unique_lock lock(mutex_);
    const auto all_exited = [&] { return exited_ == static_cast<int>(workers_.size()); };
    if (!exited_cv_.wait_for(lock, std::chrono::seconds(1), all_exited)) {
      lock.unlock();
      log::warn("database pool: stopping cuts short the checks still waiting on the database");
      for (auto& slot : slots_) slot->interrupt();
    }
  }
  for (auto& w : workers_) {
    if (w.joinable()) w.join();
  }
}

bool reopen_if_lost(Connection& conn, const std::exception* e) {
  return conn.can_reopen() && connection_lost(conn.raw(), e) && conn.reopen();
}

void ping(Connection& conn) { pqxx::nontransaction(conn.raw()).exec("SELECT 1"); }

bool Pool::healthy() {
  auto done = std::make_shared<std::promise<bool>>();
  auto result = done->get_future();
  // The task owns the only reference: dropped unrun, it breaks the promise and the answer is
  // at once.
  const bool queued = enqueue(Job{[done = std::move(done)](Connection& c) {
                                    try {
                                      ping(c);
                                      done->set_value(true);
                                    } catch (...) {
                                      done->set_value(false);
                                    }
                                  },
                                  {}, /*waits_for_server=*/false});
  if (!queued) return false;
  try {
    return result.wait_for(std::chrono::seconds(2)) == std::future_status::ready && result.get();
  } catch (const std::future_error&) {
    return false;  // dropped unrun: the worker could not connect
  }
}

size_t Pool::backends_primed() const { return primed_.load(); }

void Pool::prime(Connection& conn) {
  // A block of backend_heap_prime bytes, allocated and freed by one statement; built from 4 KiB
  // pieces (repeat() copies its string once per count).
  const size_t pieces = std::max<size_t>(1, options_.backend_heap_prime / 4096);
  try {
    pqxx::nontransaction(conn.raw())
        .exec("SELECT length(repeat(repeat('x', 4096), " + std::to_string(pieces) +
              ")) AS backend_heap_prime");
    ++primed_;
  } catch (const std::exception& e) {
    log::warn("database pool: priming a backend's heap failed", {{"error", e.what()}});
  }
}

void Pool::work(SocketSlot& slot) {
  std::optional<pqxx::connection> conn;
  uint64_t stamp = 0;  // the generation `conn` was opened in
  struct Exit {  // the slot forgets the socket before the connection closes; stop() is told
    Pool& pool;
    SocketSlot& slot;
    ~Exit() {
      slot.clear();
      {
        std::lock_guard lock(pool.mutex_);
        ++pool.exited_;
      }
      pool.exited_cv_.notify_all();
    }
  } at_exit{*this, slot};
  bool primed = false;  // this connection's backend (PoolOptions::backend_heap_prime)
  const auto close = [&] {
    slot.clear();
    conn.reset();
  };
  // A connection that died takes the ones opened before it along (Generations).
  const auto discard = [&] {
    generations_.failed(stamp);
    ++replaced_;
    close();
  };
  bool timed_out = false;  // the last failed connect ran into connect_timeout
  const auto open = [&] {
    close();
    const auto started = std::chrono::steady_clock::now();
    try {
      stamp = generations_.current();
      conn.emplace(url_);
      slot.set(conn->sock());
      primed = false;
      pqxx::nontransaction(*conn).exec("SET statement_timeout = " +
                                       std::to_string(options_.statement_timeout.count()));
      return true;
    } catch (const std::exception& e) {
      // Once per attempt of every worker while the server is away would be dozens a second.
      log::limited(log::Level::error, "database pool: cannot connect", {{"error", e.what()}});
      serving_ = false;
      timed_out = std::chrono::steady_clock::now() - started >= options_.connect_timeout / 2;
      close();
      return false;
    }
  };
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mutex_);
      // Primed when nothing waits, so a burst of checks (a replica's first seconds) never waits
      // for it.
      if (conn && !primed && options_.backend_heap_prime > 0 && idle() && !stopping_) {
        lock.unlock();
        primed = true;
        Connection handle(*conn);
        prime(handle);
        if (connection_lost(*conn)) discard();
        continue;
      }
      for (;;) {
        if (stopping_) return;
        if (!tasks_.empty() || gathering_ready(std::chrono::steady_clock::now())) break;
        if (gathering_.empty()) {
          cv_.wait(lock);
        } else {
          cv_.wait_until(lock, gathering_.front().queued + options_.gathering_wait);
        }
      }
      job = take();
    }
    struct GatheringDone {  // a gathering task's worker is free again: the next may start
      Pool& pool;
      bool gathering;
      ~GatheringDone() {
        if (!gathering) return;
        {
          std::lock_guard lock(pool.mutex_);
          --pool.gathering_running_;
        }
        pool.cv_.notify_one();
      }
    } gathering_done{*this, job.gathering};
    // Asked before connecting, so work of closed sockets never waits on an unreachable server.
    try {
      if (job.wanted && !job.wanted()) continue;
    } catch (const std::exception& e) {
      log::error("database pool: a task's wanted() failed", {{"error", e.what()}});
      continue;
    }
    // Validated before use: after a restart every idle connection has the server's goodbye
    // waiting, and replacing it here costs a connect where using it would cost a viewer's check.
    if (conn && (generations_.suspect(stamp) || idle_connection_dead(*conn))) discard();
    // The server away (a restart): the task waits for it while it is wanted, for at most a
    // statement's time, instead of being dropped. Dropped, its owner's deadline would close the
    // socket 1011 seconds after a fast restart was over; waiting, it is answered when the server
    // is back. Past that its owner's deadline answers for it (1011, the tab resumes).
    if (!conn && !open() && job.waits_for_server && !timed_out) {
      const auto give_up = std::chrono::steady_clock::now() + options_.statement_timeout;
      for (;;) {
        {
          std::unique_lock lock(mutex_);
          // Not cv_: a post's notify_one taken here would leave an idle worker asleep.
          retry_cv_.wait_for(lock, kConnectRetry, [&] { return stopping_; });
          if (stopping_) return;
        }
        try {
          if (job.wanted && !job.wanted()) break;
        } catch (const std::exception&) {
          break;
        }
        if (std::chrono::steady_clock::now() > give_up || open() || timed_out) break;
      }
    }
    if (!conn) continue;
    Connection handle(*conn, [&] {
      discard();
      return open();
    });
    try {
      job.task(handle);
    } catch (const std::exception& e) {
      // A task should catch its own (a check's answers its caller: the check fails, 1011); one
      // that did not must not take the worker with it. Its caller's deadline answers for it.
      count_thread_failure(ThreadKind::pool);
      log::error("database pool: a task failed", {{"error", e.what()}});
    } catch (...) {
      count_thread_failure(ThreadKind::pool);
      log::error("database pool: a task failed", {{"error", "unknown exception"}});
    }
    if (!conn) continue;  // its retry could not connect (serving_ is false already)
    if (connection_lost(*conn)) {
      serving_ = false;
      discard();
    } else {
      serving_ = true;
    }
  }
}

}  // namespace outlive::db
