#include "fanout/hub.hpp"

#include <algorithm>

namespace outlive::fanout {

void Hub::add_reader(const std::string& app, const std::shared_ptr<Reader>& reader) {
  std::lock_guard lock(mutex_);
  readers_[reader.get()] = ReaderRef{reader, &*app_names_.insert(app).first, {}};
}

void Hub::remove_reader(Reader* reader) {
  std::vector<Targets> retired;
  std::lock_guard lock(mutex_);
  auto ref = readers_.find(reader);
  if (ref == readers_.end()) return;
  for (const std::string* k : ref->second.keys) {
    auto it = followers_.find(*k);
    if (it == followers_.end()) continue;
    if (it->second.by_reader.erase(reader) > 0) changed(it->second, retired);
    if (it->second.by_reader.empty()) followers_.erase(it);
  }
  readers_.erase(ref);
}

const std::string* Hub::intern(const std::string& app, const std::string& channel) {
  return &*channel_names_[app].insert(channel).first;
}

uint64_t Hub::follow(const std::string& app, const std::set<std::string>& keys,
                     const std::string& channel, const std::shared_ptr<Reader>& reader,
                     std::shared_ptr<const Viewer> viewer) {
  std::vector<Targets> retired;
  std::lock_guard lock(mutex_);
  const std::string* name = intern(app, channel);
  auto ref = readers_.find(reader.get());
  for (const auto& k : keys) {
    auto& [hk, followers] = *followers_.try_emplace(hub_key(app, k)).first;
    auto& f = followers.by_reader[reader.get()];
    if (f.reader.expired()) {
      f = Follower{reader, viewer, {}};
      // (a Reader* of a reader that finished without leaving may come back with a new reader)
      if (ref != readers_.end() &&
          std::find(ref->second.keys.begin(), ref->second.keys.end(), &hk) ==
              ref->second.keys.end())
        ref->second.keys.push_back(&hk);
    }
    auto via = std::find_if(f.channels.begin(), f.channels.end(),
                            [&](const auto& c) { return c.first == name; });
    if (via == f.channels.end()) {
      f.channels.emplace_back(name, 1);
      changed(followers, retired);
    } else {
      ++via->second;
    }
  }
  return looked_up_[app];
}

void Hub::unfollow(const std::string& app, const std::string& key, const std::string& channel,
                   Reader* reader) {
  std::vector<Targets> retired;
  std::lock_guard lock(mutex_);
  const auto hk = hub_key(app, key);
  auto it = followers_.find(hk);
  if (it == followers_.end()) return;
  auto f = it->second.by_reader.find(reader);
  if (f == it->second.by_reader.end()) return;
  auto& channels = f->second.channels;
  auto via = std::find_if(channels.begin(), channels.end(),
                          [&](const auto& c) { return *c.first == channel; });
  if (via != channels.end() && --via->second <= 0) {
    channels.erase(via);
    changed(it->second, retired);
  }
  if (!channels.empty()) return;
  changed(it->second, retired);
  if (auto ref = readers_.find(reader); ref != readers_.end()) {
    auto& keys = ref->second.keys;
    auto at = std::find(keys.begin(), keys.end(), &it->first);
    if (at != keys.end()) {
      *at = keys.back();
      keys.pop_back();
    }
  }
  it->second.by_reader.erase(f);
  if (it->second.by_reader.empty()) followers_.erase(it);
}

Targets Hub::targets(const std::string& app, const std::string& key, uint64_t position) {
  static const Targets none = std::make_shared<const std::vector<Target>>();
  std::lock_guard lock(mutex_);
  auto& through = looked_up_[app];
  through = std::max(through, position);
  auto it = followers_.find(hub_key(app, key));
  if (it == followers_.end()) return none;
  auto& followers = it->second;
  if (followers.snapshot) return followers.snapshot;
  auto list = std::make_shared<std::vector<Target>>();
  list->reserve(followers.by_reader.size());
  for (const auto& [raw, f] : followers.by_reader) {
    auto reader = f.reader.lock();
    if (!reader) continue;
    Target t{std::move(reader), f.viewer, {}};
    for (const auto& [channel, n] : f.channels) t.channels.push_back(channel);
    list->push_back(std::move(t));
  }
  followers.snapshot = std::move(list);
  return followers.snapshot;
}

void Hub::handed_through(const std::string& app, uint64_t position) {
  std::lock_guard lock(mutex_);
  auto& through = handed_[app];
  through = std::max(through, position);
}

uint64_t Hub::handed_through(const std::string& app) const {
  std::lock_guard lock(mutex_);
  auto it = handed_.find(app);
  return it == handed_.end() ? 0 : it->second;
}

template <class Keep>
std::vector<std::shared_ptr<Reader>> Hub::readers_where(Keep keep) const {
  std::vector<std::shared_ptr<Reader>> out;
  std::lock_guard lock(mutex_);
  for (const auto& [raw, ref] : readers_) {
    if (!keep(raw, ref)) continue;
    if (auto r = ref.reader.lock()) out.push_back(std::move(r));
  }
  return out;
}

std::vector<std::shared_ptr<Reader>> Hub::readers(const std::string& app) const {
  return readers_where(
      [&](Reader*, const ReaderRef& ref) { return app.empty() || *ref.app == app; });
}

std::vector<std::shared_ptr<Reader>> Hub::unsettled_readers(const std::string& app,
                                                            uint64_t position) const {
  // (raw is alive: a reader leaves before its destruction ends, and cannot leave while the walk
  // holds the lock; no reference is taken for the many that are settled)
  return readers_where([&](Reader* raw, const ReaderRef& ref) {
    return *ref.app == app && raw->settled() < position;
  });
}

size_t Hub::reader_count() const {
  std::lock_guard lock(mutex_);
  return readers_.size();
}

}  // namespace outlive::fanout
