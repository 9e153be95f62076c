#pragma once
// The subscriptions of one socket and how far each key of each has been brought (SPEC 5.2, 5.3,
// 5.5). Pure: what an update does to them is decided here, the socket only writes the frames.
// Keys are delivered in order per key, not across keys (a key whose authorize() is slow waits
// without holding up the others), so positions are kept per key.
#include <boost/container/small_vector.hpp>
#include <boost/container/flat_map.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "fanout/delivery.hpp"
#include "tab/protocol.hpp"
#include "window/window.hpp"

namespace outlive::session {

// Sorted vectors with room for one element in place: most sockets hold one subscription of one
// key, and a map node per key (88 B with malloc's header) was a twentieth of an idle socket
// (issue 46 item 5). A collection's many keys stay sorted, found by binary search.
template <typename T>
using KeyMap = boost::container::small_flat_map<std::string, T, 1>;

struct Subscription {
  std::string channel;
  bool collection = false;
  std::unique_ptr<const std::string> scope;  // JSON text, for keys() again (collections only)
  KeyMap<uint64_t> keys;  // key -> the last position it was brought to
  std::shared_ptr<const tab::Filter> filter;  // null: every update (SPEC 5.2 rev 3)
};

// True when the update's data has every field of the filter, equal to its value.
bool matches(const tab::Filter& filter, const nlohmann::json& scalar_fields);

// What one update does to a socket's subscriptions.
struct Effect {
  std::vector<std::string> update_ids;  // subscriptions that receive the update frame
  std::vector<std::string> frames;      // text frames first (revoked, resync), in order
  std::vector<std::string> ended;       // subscriptions that ended (revoked)
  std::vector<std::pair<std::string, std::string>> dropped;  // (channel, key) a collection lost
  bool applied = false;   // some subscription was brought to the update
  bool filtered = false;  // some subscription was brought to it without it (its filter)
  void clear() {
    update_ids.clear();
    frames.clear();
    ended.clear();
    dropped.clear();
    applied = false;
    filtered = false;
  }
};

class Subscriptions {
 public:
  bool contains(const std::string& id) const { return subs_.count(id) > 0; }
  size_t size() const { return subs_.size(); }
  bool empty() const { return subs_.empty(); }
  const KeyMap<Subscription>& all() const { return subs_; }

  // Adds a subscription whose keys all start at `from`.
  void add(const std::string& id, Subscription sub);
  // Removes it; returns it (its keys are to be unfollowed).
  std::optional<Subscription> remove(const std::string& id);
  // Replaces a collection's key set: new keys start at `from`. Returns (gained, lost).
  std::pair<std::set<std::string>, std::set<std::string>> replace_keys(
      const std::string& id, const std::set<std::string>& keys, uint64_t from);
  // Every key of the subscription is brought to `position` (after a resync).
  void bring_to(const std::string& id, uint64_t position);
  // Every key of every subscription is brought to `position` (everything up to it was received).
  void bring_all_to(uint64_t position);

  // True when a subscription follows `key`.
  bool follows(const std::string& key) const { return followed_.count(key) > 0; }
  // True when some subscription following the update's key has not been brought to it yet.
  bool wants(const window::Update& u) const;
  // The lowest position any followed key has been brought to (0 without keys).
  uint64_t lowest_position() const;
  // Ids of subscriptions with a key brought to less than `position`.
  std::vector<std::string> behind(uint64_t position) const;

  // Applies an update of key `u.key` at `cursor`: `allowed` is the viewer's access per channel.
  // A subscription that lost access ends (single key: revoked) or drops the key (collection:
  // resync access). Keys already brought to the update's position are skipped (no duplicates).
  // A data update a subscription's filter refuses is not for it: it is only brought past it.
  void apply(const window::Update& u, const std::string& cursor,
             const fanout::ChannelAccess& allowed, Effect& out);
  // Channels through which `key` is followed (for access decisions).
  std::vector<std::string> channels_of(const std::string& key) const;

 private:
  void count(const std::string& key, int delta);
  // id -> subscription, sorted (update frames name them in id order); a vector, since every
  // update a socket receives walks them all (a map's node per subscription, 208 B with malloc's
  // header, and a tree walk per update: 6% of the io threads' samples with 4 subs a socket).
  KeyMap<Subscription> subs_;
  // key -> subscriptions following it (the one key most sockets follow is held in place)
  KeyMap<int> followed_;
};

}  // namespace outlive::session
