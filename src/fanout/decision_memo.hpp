#pragma once
// Per key with many followers, the decisions read for its latest update, reused by the next while
// the followers (Targets is shared until they change), the cache's stamp for the key and every
// decision's expiry allow: a hot key's update then spares a lock, two hash lookups and a string
// per follower. On the dispatcher's thread only.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fanout/hub.hpp"

namespace outlive::fanout {

class DecisionMemo {
 public:
  using Clock = std::chrono::steady_clock;
  using Stamp = std::pair<uint64_t, uint64_t>;  // access::Decisions::stamp()
  static constexpr size_t kMinFollowers = 16;   // fewer are read from the cache each time
  static constexpr size_t kMaxKeys = 4096;      // 4 bytes per follower each

  // Worth keeping for these followers: enough of them, each through at most 32 channels.
  static bool fits(const std::vector<Target>& targets) {
    if (targets.size() < kMinFollowers) return false;
    for (const auto& t : targets) {
      if (t.channels.size() > 32) return false;
    }
    return true;
  }

  // The key's decisions if they still hold for `targets` at `stamp` and `now`, per target: bit i
  // allowed through its channels[i]. Null otherwise (a stale memo is dropped).
  const std::vector<uint32_t>* find(const std::string& key, const Targets& targets, Stamp stamp,
                                    Clock::time_point now) {
    auto m = memos_.find(key);
    if (m == memos_.end()) return nullptr;
    const Memo& memo = m->second;
    if (memo.stamp == stamp && now < memo.expires && memo.targets.lock() == targets)
      return &memo.allowed;
    memos_.erase(m);
    return nullptr;
  }

  // Keeps the decisions read for `targets` (stamp read before them, the earliest expiry).
  void keep(const std::string& key, const Targets& targets, Stamp stamp, Clock::time_point expires,
            std::vector<uint32_t>&& allowed) {
    if (memos_.size() >= kMaxKeys) memos_.clear();
    Memo& memo = memos_[key];
    memo.targets = targets;
    memo.stamp = stamp;
    memo.expires = expires;
    memo.allowed = std::move(allowed);
  }

 private:
  struct Memo {
    std::weak_ptr<const std::vector<Target>> targets;
    Stamp stamp;
    Clock::time_point expires;
    std::vector<uint32_t> allowed;
  };
  std::unordered_map<std::string, Memo> memos_;
};

}  // namespace outlive::fanout
