#pragma once
// Access decisions cached per (key, viewer id), shared by every socket of a replica (SPEC 5.5).
// An access update forgets a key's decisions; decisions also expire so access changed without an
// access update still shows. Bounded (SPEC 5.5 rev 2): expired decisions are evicted as new ones
// arrive, and past `max_entries` the least recently used go first. Thread-safe.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace outlive::access {

class Decisions {
 public:
  using Clock = std::chrono::steady_clock;
  // `max_generations` bounds the keys whose forget() is remembered exactly (see generation()).
  explicit Decisions(std::chrono::milliseconds lifetime = std::chrono::minutes(5),
                     size_t max_entries = 1'000'000, size_t max_generations = 65'536)
      : lifetime_(lifetime),
        max_entries_(std::max<size_t>(1, max_entries)),
        max_generations_(std::max<size_t>(1, max_generations)) {}
  Decisions(const Decisions&) = delete;
  Decisions& operator=(const Decisions&) = delete;

  // The cached decision, or nullopt when there is none or it expired. Counts as a use.
  std::optional<bool> get(const std::string& key, const std::string& viewer_id,
                          Clock::time_point now, Clock::time_point* expires = nullptr) const {
    std::lock_guard lock(mutex_);
    auto k = entries_.find(key);
    if (k == entries_.end()) return std::nullopt;
    auto v = k->second.viewers.find(viewer_id);
    if (v == k->second.viewers.end() || now >= v->second.expires) return std::nullopt;
    move_to_back(kRecent, v->second);
    if (expires) *expires = v->second.expires;
    return v->second.allowed;
  }

  // Changes whenever a decision of `key` may have changed other than by expiring: a forget(), a
  // decision added or given another value. Decisions of the key read while the stamp stayed the
  // same still hold until they expire, so they may be reused without reading them again.
  std::pair<uint64_t, uint64_t> stamp(const std::string& key) const {
    std::lock_guard lock(mutex_);
    auto k = entries_.find(key);
    return {generation_locked(key), k == entries_.end() ? 0 : k->second.stamp};
  }

  void put(const std::string& key, const std::string& viewer_id, bool allowed,
           Clock::time_point now) {
    std::lock_guard lock(mutex_);
    put_locked(key, viewer_id, allowed, now);
  }

  // Forgets the key's decisions. Their memory is freed when the returned handle is dropped: the
  // dispatcher drops it once the access update's round went out, since freeing thousands of
  // decisions (~2 ms for 5,000) would otherwise delay every `revoked` frame of the key.
  std::shared_ptr<void> forget(const std::string& key) {
    std::shared_ptr<void> released;
    std::lock_guard lock(mutex_);
    if (auto k = entries_.find(key); k != entries_.end()) {
      for (auto& [viewer, node] : k->second.viewers) {
        unlink(kRecent, node);
        unlink(kPut, node);
      }
      count_ -= k->second.viewers.size();
      released = std::make_shared<decltype(entries_)::node_type>(entries_.extract(k));
    }
    const uint64_t value = ++clock_;
    auto [g, inserted] = generations_.try_emplace(key);
    if (inserted) {
      g->second.order = forgotten_.insert(forgotten_.end(), &g->first);
    } else {
      forgotten_.splice(forgotten_.end(), forgotten_, g->second.order);
    }
    g->second.value = value;
    while (generations_.size() > max_generations_) {
      // The oldest forget goes: it holds the lowest value, so the floor rises the least.
      auto oldest = generations_.find(*forgotten_.front());
      auto& floor = floors_[bucket(oldest->first)];
      floor = std::max(floor, oldest->second.value);
      forgotten_.pop_front();
      generations_.erase(oldest);
    }
    return released;
  }

  // True when some decision of `key` is held (perhaps expired): false spares a caller the lookup
  // per viewer right after an access update forgot them all.
  bool holds(const std::string& key) const {
    std::lock_guard lock(mutex_);
    return entries_.count(key) > 0;
  }

  // Changes with every forget() of `key`: a check that started before an access update must not
  // cache, nor act on, an answer from before it. Values come from one counter shared by all
  // keys. A key whose last forget() is no longer remembered reads as the highest value evicted
  // from its hash bucket, which only grows and is at least that forget's value: a reader
  // comparing a value read before with one read after may see a change that did not happen (and
  // checks again), but never misses one that did.
  uint64_t generation(const std::string& key) const {
    std::lock_guard lock(mutex_);
    return generation_locked(key);
  }

  // put() only if no forget() happened since `generation` was read.
  bool put_if_current(const std::string& key, const std::string& viewer_id, bool allowed,
                      Clock::time_point now, uint64_t generation) {
    std::lock_guard lock(mutex_);
    if (generation_locked(key) != generation) return false;
    put_locked(key, viewer_id, allowed, now);
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

  // Decisions held, including expired ones not evicted yet.
  size_t size() const {
    std::lock_guard lock(mutex_);
    return count_;
  }

  // Keys whose last forget() is remembered exactly (at most max_generations).
  size_t generations_size() const {
    std::lock_guard lock(mutex_);
    return generations_.size();
  }

 private:
  struct Slot;
  // One decision, on two intrusive lists (no allocation to reorder them, so get() allocates
  // nothing): by last use, for the bound, and by put, for expiry (the lifetime is one for all).
  struct Node {
    bool allowed = false;
    Clock::time_point expires;
    mutable const Node* prev[2] = {nullptr, nullptr};
    mutable const Node* next[2] = {nullptr, nullptr};
    Slot* slot = nullptr;
    const std::string* viewer = nullptr;  // its key in slot->viewers
  };
  // One key's decisions. Pointers into unordered_map elements stay valid until they are erased.
  struct Slot {
    const std::string* key = nullptr;  // its key in entries_
    std::unordered_map<std::string, Node> viewers;
    uint64_t stamp = 0;  // clock_ when a decision was last added or changed its value
  };
  struct Generation {
    uint64_t value = 0;
    std::list<const std::string*>::iterator order;
  };
  static constexpr int kRecent = 0;  // least recently used first
  static constexpr int kPut = 1;     // first put first, so first to expire
  // How many expired decisions one put() evicts at most: more than it adds, so they cannot pile
  // up, while a put() after a quiet spell does not hold the lock for long.
  static constexpr int kEvictPerPut = 8;
  static constexpr size_t kFloorBuckets = 4096;

  struct List {
    const Node* head = nullptr;
    const Node* tail = nullptr;
  };

  // Only a node's mutable links change here, so a const get() may reorder.
  void link_back(int l, const Node& n) const {
    n.prev[l] = lists_[l].tail;
    n.next[l] = nullptr;
    (lists_[l].tail ? lists_[l].tail->next[l] : lists_[l].head) = &n;
    lists_[l].tail = &n;
  }
  void unlink(int l, const Node& n) const {
    (n.prev[l] ? n.prev[l]->next[l] : lists_[l].head) = n.next[l];
    (n.next[l] ? n.next[l]->prev[l] : lists_[l].tail) = n.prev[l];
    n.prev[l] = n.next[l] = nullptr;
  }
  void move_to_back(int l, const Node& n) const {
    if (lists_[l].tail == &n) return;
    unlink(l, n);
    link_back(l, n);
  }

  void erase(const Node& n) {
    unlink(kRecent, n);
    unlink(kPut, n);
    Slot* slot = n.slot;
    slot->viewers.erase(slot->viewers.find(*n.viewer));  // n is gone from here on
    --count_;
    if (slot->viewers.empty()) entries_.erase(entries_.find(*slot->key));
  }

  void put_locked(const std::string& key, const std::string& viewer_id, bool allowed,
                  Clock::time_point now) {
    for (int i = 0; i < kEvictPerPut && lists_[kPut].head && now >= lists_[kPut].head->expires;
         ++i) {
      erase(*lists_[kPut].head);
    }
    auto [k, new_key] = entries_.try_emplace(key);
    if (new_key) k->second.key = &k->first;
    auto [v, new_viewer] = k->second.viewers.try_emplace(viewer_id);
    Node& n = v->second;
    if (new_viewer) {
      n.slot = &k->second;
      n.viewer = &v->first;
      link_back(kRecent, n);
      link_back(kPut, n);
      ++count_;
      k->second.stamp = ++clock_;
    } else {
      move_to_back(kRecent, n);
      move_to_back(kPut, n);
      if (n.allowed != allowed) k->second.stamp = ++clock_;
    }
    n.allowed = allowed;
    n.expires = now + lifetime_;
    while (count_ > max_entries_) {
      const Node* first_put = lists_[kPut].head;
      erase(now >= first_put->expires ? *first_put : *lists_[kRecent].head);
    }
  }

  static size_t bucket(const std::string& key) {
    return std::hash<std::string>{}(key) % kFloorBuckets;
  }
  uint64_t generation_locked(const std::string& key) const {
    auto it = generations_.find(key);
    return it == generations_.end() ? floors_[bucket(key)] : it->second.value;
  }

  const std::chrono::milliseconds lifetime_;
  const size_t max_entries_;
  const size_t max_generations_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Slot> entries_;
  mutable std::array<List, 2> lists_;
  size_t count_ = 0;
  uint64_t clock_ = 0;  // the last value forget() or a stamp took
  std::unordered_map<std::string, Generation> generations_;
  std::list<const std::string*> forgotten_;  // keys of generations_, oldest forget first
  // Per hash bucket of keys: the highest value evicted from generations_. A vector, so the
  // class stays small for its users' stacks.
  std::vector<uint64_t> floors_ = std::vector<uint64_t>(kFloorBuckets, 0);
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
