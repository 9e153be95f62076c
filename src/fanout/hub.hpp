#pragma once
// Who follows which key (SPEC 5.6): the registry the dispatcher reads once per update, and the
// positions that keep subscriptions and progress frames in step with the live feed. Thread-safe.
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "fanout/delivery.hpp"

namespace outlive::fanout {

// A reader following a key, as the dispatcher sees it.
struct Target {
  std::shared_ptr<Reader> reader;
  std::shared_ptr<const std::string> viewer_id;
  std::shared_ptr<const std::string> viewer_json;  // the viewer object handed to authorize()
  std::vector<std::string> channels;
};

class Hub {
 public:
  // A reader of `app` (every open socket, subscribed or not): stop, progress and refreshes reach
  // it.
  void add_reader(const std::string& app, const std::shared_ptr<Reader>& reader);
  // The reader leaves everything it followed.
  void remove_reader(Reader* reader);

  // Follows `keys` through `channel` for `viewer_id`. Returns the position live delivery of these
  // keys starts after: every later update of them reaches this reader. The viewer's strings are
  // the reader's own, shared: a follower copies no bytes of them.
  uint64_t follow(const std::string& app, const std::set<std::string>& keys,
                  const std::string& channel, const std::shared_ptr<Reader>& reader,
                  std::shared_ptr<const std::string> viewer_id,
                  std::shared_ptr<const std::string> viewer_json);
  void unfollow(const std::string& app, const std::string& key, const std::string& channel,
                Reader* reader);

  // The readers following `key` now; marks `position` as looked up (follow() returns it from then
  // on). Called by the dispatcher once per update, in topic order.
  std::vector<Target> targets(const std::string& app, const std::string& key, uint64_t position);

  // Every update of `app` up to `position` has been handed to its readers.
  void handed_through(const std::string& app, uint64_t position);
  uint64_t handed_through(const std::string& app) const;

  std::vector<std::shared_ptr<Reader>> readers(const std::string& app = {}) const;
  size_t reader_count() const;

 private:
  struct Follower {
    std::weak_ptr<Reader> reader;
    std::shared_ptr<const std::string> viewer_id;
    std::shared_ptr<const std::string> viewer_json;
    std::map<std::string, int> channels;  // channel -> subscriptions following the key through it
  };
  struct ReaderRef {
    std::weak_ptr<Reader> reader;
    std::string app;
    std::set<std::string> keys;  // hub keys it follows, to leave them at once
  };
  static std::string hub_key(const std::string& app, const std::string& key) {
    return app + '\0' + key;
  }

  mutable std::mutex mutex_;
  std::unordered_map<std::string, std::unordered_map<Reader*, Follower>> followers_;
  std::unordered_map<Reader*, ReaderRef> readers_;
  std::unordered_map<std::string, uint64_t> looked_up_;  // per app
  std::unordered_map<std::string, uint64_t> handed_;     // per app
};

}  // namespace outlive::fanout
