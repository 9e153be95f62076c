#pragma once
// Access decisions cached per (key, viewer id), shared by every socket of a replica (SPEC 5.5).
// An access update forgets a key's decisions; decisions also expire so access changed without an
// access update still shows. Thread-safe.
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace outlive::access {

class Decisions {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Decisions(std::chrono::milliseconds lifetime = std::chrono::minutes(5))
      : lifetime_(lifetime) {}

  // The cached decision, or nullopt when there is none or it expired.
  std::optional<bool> get(const std::string& key, const std::string& viewer_id,
                          Clock::time_point now) const {
    std::lock_guard lock(mutex_);
    auto k = entries_.find(key);
    if (k == entries_.end()) return std::nullopt;
    auto v = k->second.find(viewer_id);
    if (v == k->second.end() || now >= v->second.expires) return std::nullopt;
    return v->second.allowed;
  }

  void put(const std::string& key, const std::string& viewer_id, bool allowed,
           Clock::time_point now) {
    std::lock_guard lock(mutex_);
    entries_[key][viewer_id] = Entry{allowed, now + lifetime_};
  }

  void forget(const std::string& key) {
    std::lock_guard lock(mutex_);
    entries_.erase(key);
    ++generations_[key];
  }

  // Bumped by every forget(): a check that started before an access update must not cache, nor
  // act on, an answer from before it.
  uint64_t generation(const std::string& key) const {
    std::lock_guard lock(mutex_);
    auto it = generations_.find(key);
    return it == generations_.end() ? 0 : it->second;
  }

  // put() only if no forget() happened since `generation` was read.
  bool put_if_current(const std::string& key, const std::string& viewer_id, bool allowed,
                      Clock::time_point now, uint64_t generation) {
    std::lock_guard lock(mutex_);
    auto it = generations_.find(key);
    if ((it == generations_.end() ? 0 : it->second) != generation) return false;
    entries_[key][viewer_id] = Entry{allowed, now + lifetime_};
    return true;
  }

  // Of `viewer_ids` (distinct), those without a valid decision for `key`.
  std::vector<std::string> missing(const std::string& key,
                                   const std::vector<std::string>& viewer_ids,
                                   Clock::time_point now) const {
    std::vector<std::string> out;
    for (const auto& id : viewer_ids) {
      if (!get(key, id, now)) out.push_back(id);
    }
    return out;
  }

  size_t size() const {
    std::lock_guard lock(mutex_);
    size_t n = 0;
    for (const auto& [k, m] : entries_) n += m.size();
    return n;
  }

 private:
  struct Entry {
    bool allowed;
    Clock::time_point expires;
  };
  const std::chrono::milliseconds lifetime_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, std::unordered_map<std::string, Entry>> entries_;
  std::unordered_map<std::string, uint64_t> generations_;
};

// Splits `items` into batches of at most `size` (authorize takes up to 500 viewers at once).
template <typename T>
std::vector<std::vector<T>> batches(const std::vector<T>& items, size_t size = 500) {
  std::vector<std::vector<T>> out;
  for (size_t i = 0; i < items.size(); i += size) {
    out.emplace_back(items.begin() + i, items.begin() + std::min(items.size(), i + size));
  }
  return out;
}

}  // namespace outlive::access
