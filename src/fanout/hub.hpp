#pragma once
// Who follows which key of one app (SPEC 5.6): the registry the app's dispatcher reads once per
// update, and the positions that keep subscriptions and progress frames in step with the live
// feed. One per app, owned by its AppDelivery. Thread-safe.
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <boost/container/small_vector.hpp>

#include "fanout/delivery.hpp"

namespace outlive::fanout {

struct HubEntry {};

// A reader following a key, as the dispatcher sees it. The channel names are the hub's own,
// interned: they live as long as the hub.
struct Target {
  std::shared_ptr<Reader> reader;
  std::shared_ptr<const Viewer> viewer;
  boost::container::small_vector<const std::string*, 1> channels;
};
// Every follower of a key at one moment, shared: built when the dispatcher first looks the key up
// after its followers changed, not once per update.
using Targets = std::shared_ptr<const std::vector<Target>>;

class Hub {
 public:
  // A reader of the app (every open socket, subscribed or not): stop, progress and refreshes reach
  // it. It leaves (remove_reader) before its destruction ends: the hub reads the settled position
  // of every reader it holds without taking a reference. A reader is in one hub at most.
  void add_reader(const std::shared_ptr<Reader>& reader);
  // The reader leaves everything it followed.
  void remove_reader(Reader* reader);

  // Follows `keys` through `channel` for `viewer`. Returns the position live delivery of these
  // keys starts after: every later update of them reaches this reader. The viewer's strings are
  // the reader's own, shared: a follower copies no bytes of them. A reader that is not in the
  // hub (never added, or left) follows nothing: it may be finishing.
  uint64_t follow(const std::set<std::string>& keys, const std::string& channel,
                  const std::shared_ptr<Reader>& reader, std::shared_ptr<const Viewer> viewer);
  void unfollow(const std::string& key, const std::string& channel, Reader* reader);

  // The readers following `key` now (never null); marks `position` as looked up (follow()
  // returns it from then on). Called by the dispatcher once per update, in topic order.
  Targets targets(const std::string& key, uint64_t position);

  // Every update of the app up to `position` has been handed to its readers.
  void handed_through(uint64_t position);
  uint64_t handed_through() const;

  // Every reader.
  std::vector<std::shared_ptr<Reader>> readers() const;
  // Calls `fn` for every reader under the hub's lock, taking no reference (after an
  // access update, 5,000 references taken and dropped held the lock the sockets' unfollows
  // wait for). `fn` must be quick and must not call the hub. Sound because a reader leaves the
  // hub (remove_reader, which waits for this lock) before any of its own members are destroyed:
  // `fn` may meet a reader whose last reference is gone, never one half destroyed.
  template <class Fn>
  void for_each_reader(Fn fn) const {
    std::lock_guard lock(mutex_);
    for (const Member& m : members_) {
      if (!m.ref->reader.expired()) fn(*m.raw);
    }
  }
  // The readers not settled at `position` (Reader::settled()): those the progress tick has
  // something to do for.
  std::vector<std::shared_ptr<Reader>> unsettled_readers(uint64_t position) const;
  size_t reader_count() const;

 private:
  struct ReaderRef;
  struct Follower {
    ReaderRef* ref;  // its reader's entry in readers_ (nodes stay), which holds the reader
    std::shared_ptr<const Viewer> viewer;
    // Interned channel -> subscriptions following the key through it (usually one channel).
    boost::container::small_vector<std::pair<const std::string*, int>, 1> channels;
  };
  struct KeyFollowers {
    // Dense: a follower that leaves takes the last one's place, so leaving frees nothing and
    // costs no lookup (5,000 revoked subscribers leave at once).
    std::vector<Follower> list;
    Targets snapshot;  // null once they changed
  };
  // Where a reader sits among one key's followers.
  struct Seat {
    const std::string* key;   // the followers_ entry's own key (it stays while followed)
    KeyFollowers* followers;  // (unordered_map nodes stay)
    uint32_t index;           // in followers->list
  };
  // A reader among the hub's readers: the progress tick walks them every second, so they sit in
  // one dense list (5,000 readers a walk of contiguous memory, not of hash nodes).
  struct Member {
    Reader* raw;
    struct ReaderRef* ref;
  };
  using Members = std::vector<Member>;
  struct ReaderRef : HubEntry {
    std::weak_ptr<Reader> reader;
    uint32_t member = 0;  // where it is in members_
    // The keys it follows, to leave them at once (usually one).
    boost::container::small_vector<Seat, 1> seats;
  };
  // Joins the hub's readers / leaves them (the last member takes its place).
  void join_members(Reader* raw, ReaderRef& ref);
  void leave_members(ReaderRef& ref);

  mutable std::mutex mutex_;
  const std::string* intern(const std::string& channel);
  // The snapshot goes to `retired`, released after the lock: it may hold a reader's last reference.
  static void changed(KeyFollowers& k, std::vector<Targets>& retired) {
    if (k.snapshot) retired.push_back(std::move(k.snapshot));
  }
  ReaderRef& register_reader(const std::shared_ptr<Reader>& reader, std::vector<Targets>& retired);
  // The reader leaves the key of its seat `s`.
  void leave(ReaderRef& ref, size_t s, std::vector<Targets>& retired);

  std::unordered_map<std::string, KeyFollowers> followers_;
  std::set<std::string> channel_names_;  // nodes stay
  Members members_;
  std::unordered_map<Reader*, ReaderRef> readers_;
  uint64_t looked_up_ = 0;
  uint64_t handed_ = 0;
};

}  // namespace outlive::fanout
