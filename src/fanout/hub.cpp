#include "fanout/hub.hpp"

#include <algorithm>

namespace outlive::fanout {

void Hub::add_reader(const std::string& app, const std::shared_ptr<Reader>& reader) {
  std::lock_guard lock(mutex_);
  readers_[reader.get()] = ReaderRef{reader, app, {}};
}

void Hub::remove_reader(Reader* reader) {
  std::lock_guard lock(mutex_);
  auto ref = readers_.find(reader);
  if (ref == readers_.end()) return;
  for (const auto& k : ref->second.keys) {
    auto it = followers_.find(k);
    if (it == followers_.end()) continue;
    it->second.erase(reader);
    if (it->second.empty()) followers_.erase(it);
  }
  readers_.erase(ref);
}

uint64_t Hub::follow(const std::string& app, const std::set<std::string>& keys,
                     const std::string& channel, const std::shared_ptr<Reader>& reader,
                     std::shared_ptr<const std::string> viewer_id,
                     std::shared_ptr<const std::string> viewer_json) {
  std::lock_guard lock(mutex_);
  auto ref = readers_.find(reader.get());
  for (const auto& k : keys) {
    const auto hk = hub_key(app, k);
    auto& f = followers_[hk][reader.get()];
    if (f.reader.expired()) {
      f = Follower{reader, viewer_id, viewer_json, {}};
    }
    f.channels[channel]++;
    if (ref != readers_.end()) ref->second.keys.insert(hk);
  }
  return looked_up_[app];
}

void Hub::unfollow(const std::string& app, const std::string& key, const std::string& channel,
                   Reader* reader) {
  std::lock_guard lock(mutex_);
  const auto hk = hub_key(app, key);
  auto it = followers_.find(hk);
  if (it == followers_.end()) return;
  auto f = it->second.find(reader);
  if (f == it->second.end()) return;
  if (--f->second.channels[channel] <= 0) f->second.channels.erase(channel);
  if (!f->second.channels.empty()) return;
  it->second.erase(f);
  if (it->second.empty()) followers_.erase(it);
  if (auto ref = readers_.find(reader); ref != readers_.end()) ref->second.keys.erase(hk);
}

std::vector<Target> Hub::targets(const std::string& app, const std::string& key,
                                 uint64_t position) {
  std::vector<Target> out;
  std::lock_guard lock(mutex_);
  auto& through = looked_up_[app];
  through = std::max(through, position);
  auto it = followers_.find(hub_key(app, key));
  if (it == followers_.end()) return out;
  out.reserve(it->second.size());
  for (const auto& [raw, f] : it->second) {
    auto reader = f.reader.lock();
    if (!reader) continue;
    Target t{std::move(reader), f.viewer_id, f.viewer_json, {}};
    t.channels.reserve(f.channels.size());
    for (const auto& [channel, n] : f.channels) t.channels.push_back(channel);
    out.push_back(std::move(t));
  }
  return out;
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

std::vector<std::shared_ptr<Reader>> Hub::readers(const std::string& app) const {
  std::vector<std::shared_ptr<Reader>> out;
  std::lock_guard lock(mutex_);
  out.reserve(readers_.size());
  for (const auto& [raw, ref] : readers_) {
    if (!app.empty() && ref.app != app) continue;
    if (auto r = ref.reader.lock()) out.push_back(std::move(r));
  }
  return out;
}

size_t Hub::reader_count() const {
  std::lock_guard lock(mutex_);
  return readers_.size();
}

}  // namespace outlive::fanout
