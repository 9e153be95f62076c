#include "publisher/settler.hpp"

#include <memory>

#include "common/log.hpp"
#include "common/thread_name.hpp"
#include "outbox/partitions.hpp"

namespace outlive::publisher {

Settler::Settler(std::string database_url, std::function<void(std::vector<int64_t>)> on_deleted,
                 SocketSlot* slot)
    : url_(std::move(database_url)),
      on_deleted_(std::move(on_deleted)),
      slot_(slot ? *slot : own_slot_),
      thread_([this] {
        name_this_thread("outlive-settle");
        run();
      }) {}

Settler::~Settler() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void Settler::add(std::vector<int64_t> positions) {
  if (positions.empty()) return;
  bool was_empty = false;
  {
    std::lock_guard lock(mutex_);
    was_empty = queue_.empty();
    queue_.insert(queue_.end(), positions.begin(), positions.end());
  }
  if (was_empty) cv_.notify_one();
}

void Settler::run() {
  std::unique_ptr<outbox::PartitionStore> store;
  ClearSlotOnExit clear_at_exit{slot_};  // before the connection closes
  std::unique_lock lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything handed over is deleted
    std::vector<int64_t> batch;
    batch.swap(queue_);
    lock.unlock();
    bool deleted = false;
    // A connection that died in an outage is replaced before use (its socket holds the server's
    // goodbye), and one that dies under the delete is replaced and the delete tried once more at
    // once: after Postgres returns, acked rows are deleted without a failure and a 500 ms wait.
    if (store && !store->alive()) {
      slot_.clear();
      store.reset();
    }
    for (int attempt = 0; attempt < 2 && !deleted; ++attempt) {
      const bool fresh = !store;
      try {
        if (!store) {
          store = std::make_unique<outbox::PartitionStore>(url_);
          slot_.set(store->socket());
        }
        store->settle(batch, {});
        deleted = true;
        outage_.succeeded();
      } catch (const std::exception& e) {
        const bool lost = store && !store->alive();
        slot_.clear();
        store.reset();
        if (fresh || !lost) {
          outage_.failed(e.what(), {{"count", batch.size()}});
          break;
        }
      }
    }
    if (deleted) on_deleted_(std::move(batch));
    lock.lock();
    if (deleted) continue;
    queue_.insert(queue_.begin(), batch.begin(), batch.end());
    if (stopping_) return;
    cv_.wait_for(lock, std::chrono::milliseconds(500), [&] { return stopping_; });
    if (stopping_) return;
  }
}

}  // namespace outlive::publisher
