#include "access/authorize_joins.hpp"

#include <algorithm>
#include <utility>

namespace outlive::access {

bool AuthorizeJoins::Batch::wanted() const {
  return std::any_of(waiters.begin(), waiters.end(),
                     [](const Waiter& w) { return !w.wanted || w.wanted(); });
}

std::shared_ptr<AuthorizeJoins::Batch> AuthorizeJoins::join(
    const Key& key, const std::string& viewer_id, const std::string& viewer_json,
    std::function<void(AuthorizeAnswer)> done, std::function<bool()> wanted) {
  std::lock_guard lock(mutex_);
  Slot& slot = slots_[key];
  if (!slot.open) {
    slot.open = std::make_shared<Batch>();
    slot.open_launched = false;
  }
  Batch& b = *slot.open;
  if (std::find(b.ids.begin(), b.ids.end(), viewer_id) == b.ids.end()) {
    if (!b.ids.empty()) b.viewers += ',';
    b.viewers += viewer_json;
    b.ids.push_back(viewer_id);
  }
  b.waiters.push_back(Waiter{viewer_id, std::move(done), std::move(wanted)});
  std::shared_ptr<Batch> launch;
  const bool full = b.ids.size() >= batch_size_;
  // Nothing under way for the key, or nothing more to gather: it starts now.
  if (!slot.open_launched && (slot.running == 0 || full)) {
    slot.open_launched = true;
    slot.running++;
    launch = slot.open;
  }
  if (full) slot.open.reset();  // the next viewer starts another batch
  return launch;
}

void AuthorizeJoins::started(const Key& key, const std::shared_ptr<Batch>& batch) {
  std::lock_guard lock(mutex_);
  auto it = slots_.find(key);
  if (it != slots_.end() && it->second.open == batch) it->second.open.reset();
}

std::shared_ptr<AuthorizeJoins::Batch> AuthorizeJoins::finished(
    const Key& key, const std::shared_ptr<Batch>& batch, const AuthorizeAnswer* answer) {
  std::shared_ptr<Batch> next;
  {
    std::lock_guard lock(mutex_);
    auto it = slots_.find(key);
    if (it != slots_.end()) {
      Slot& slot = it->second;
      // A batch refused before it started (no room in the pool) may still be the open one.
      if (slot.open == batch) slot.open.reset();
      slot.running--;
      if (slot.open && !slot.open_launched) {
        slot.open_launched = true;
        slot.running++;
        next = slot.open;
      } else if (slot.running <= 0 && !slot.open) {
        slots_.erase(it);
      }
    }
  }
  // Nobody joins `batch` any more: its waiters are read without the lock.
  if (!answer) return next;
  for (auto& w : batch->waiters) {
    AuthorizeAnswer own;
    own.ok = answer->ok;
    own.error = answer->error;
    if (answer->allowed.count(w.viewer_id)) own.allowed.insert(w.viewer_id);
    w.done(std::move(own));
  }
  return next;
}

size_t AuthorizeJoins::pending_keys() const {
  std::lock_guard lock(mutex_);
  return slots_.size();
}

}  // namespace outlive::access
