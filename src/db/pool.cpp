#include "db/pool.hpp"

#include <future>
#include <optional>

#include "common/log.hpp"

namespace outlive::db {

Pool::Pool(std::string url, int workers, std::chrono::milliseconds statement_timeout)
    : url_(std::move(url)), statement_timeout_(statement_timeout) {
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { work(); });
}

Pool::~Pool() { stop(); }

void Pool::post(Task task) {
  {
    std::lock_guard lock(mutex_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void Pool::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_) {
    if (w.joinable()) w.join();
  }
}

bool Pool::healthy() {
  auto done = std::make_shared<std::promise<bool>>();
  auto result = done->get_future();
  post([done](pqxx::connection& c) {
    try {
      pqxx::nontransaction(c).exec("SELECT 1");
      done->set_value(true);
    } catch (...) {
      done->set_value(false);
    }
  });
  return result.wait_for(std::chrono::seconds(2)) == std::future_status::ready && result.get();
}

void Pool::work() {
  std::optional<pqxx::connection> conn;
  for (;;) {
    Task task;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (stopping_) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    try {
      if (!conn || !conn->is_open()) {
        conn.emplace(url_);
        pqxx::nontransaction(*conn).exec("SET statement_timeout = " +
                                         std::to_string(statement_timeout_.count()));
      }
    } catch (const std::exception& e) {
      log::error("database pool: cannot connect", {{"error", e.what()}});
      conn.reset();
    }
    if (!conn) continue;  // its owner's deadline answers for it (close 1011, the tab resumes)
    task(*conn);
  }
}

}  // namespace outlive::db
