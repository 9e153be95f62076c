#include "fanout/hub.hpp"

#include <algorithm>

namespace outlive::fanout {

Hub::ReaderRef& Hub::register_reader(const std::shared_ptr<Reader>& reader,
                                     std::vector<Targets>& retired) {
  auto [it, fresh] = readers_.try_emplace(reader.get());
  ReaderRef& ref = it->second;
  if (!fresh) {
    if (ref.reader.expired()) {
      // (a Reader* of a reader that finished without leaving, back as a new reader: the old
      // one's places go first)
      while (!ref.seats.empty()) leave(ref, ref.seats.size() - 1, retired);
    }
    leave_members(ref);
  }
  ref.reader = reader;
  join_members(reader.get(), ref);
  reader->hub_entry_ = &ref;
  return ref;
}

void Hub::join_members(Reader* raw, ReaderRef& ref) {
  ref.member = static_cast<uint32_t>(members_.size());
  members_.push_back(Member{raw, &ref});
}

void Hub::leave_members(ReaderRef& ref) {
  if (ref.member + 1 != members_.size()) {
    members_[ref.member] = members_.back();
    members_[ref.member].ref->member = ref.member;
  }
  members_.pop_back();
}

void Hub::add_reader(const std::shared_ptr<Reader>& reader) {
  std::vector<Targets> retired;  // released after the lock
  std::lock_guard lock(mutex_);
  register_reader(reader, retired);
}

void Hub::leave(ReaderRef& ref, size_t s, std::vector<Targets>& retired) {
  const Seat seat = ref.seats[s];
  ref.seats[s] = ref.seats.back();
  ref.seats.pop_back();
  KeyFollowers& k = *seat.followers;
  changed(k, retired);
  const auto last = static_cast<uint32_t>(k.list.size() - 1);
  if (seat.index != last) {
    Follower& moved = k.list[seat.index] = std::move(k.list[last]);
    for (Seat& other : moved.ref->seats) {
      if (other.followers == &k) {
        other.index = seat.index;
        break;
      }
    }
  }
  k.list.pop_back();
  if (k.list.empty()) followers_.erase(followers_.find(*seat.key));
}

void Hub::remove_reader(Reader* reader) {
  std::vector<Targets> retired;
  std::lock_guard lock(mutex_);
  auto ref = readers_.find(reader);
  if (ref == readers_.end()) return;
  while (!ref->second.seats.empty()) leave(ref->second, ref->second.seats.size() - 1, retired);
  leave_members(ref->second);
  readers_.erase(ref);
  reader->hub_entry_ = nullptr;
}

const std::string* Hub::intern(const std::string& channel) {
  return &*channel_names_.insert(channel).first;
}

uint64_t Hub::follow(const std::set<std::string>& keys, const std::string& channel,
                     const std::shared_ptr<Reader>& reader, std::shared_ptr<const Viewer> viewer) {
  std::vector<Targets> retired;
  std::lock_guard lock(mutex_);
  if (!reader->hub_entry_) return looked_up_;
  ReaderRef& ref = *static_cast<ReaderRef*>(reader->hub_entry_);
  const std::string* name = intern(channel);
  for (const auto& k : keys) {
    auto& [hk, followers] = *followers_.try_emplace(k).first;
    auto seat = std::find_if(ref.seats.begin(), ref.seats.end(),
                             [&](const Seat& s) { return s.followers == &followers; });
    if (seat == ref.seats.end()) {
      const auto index = static_cast<uint32_t>(followers.list.size());
      followers.list.push_back(Follower{&ref, viewer, {}});
      seat = ref.seats.insert(ref.seats.end(), Seat{&hk, &followers, index});
    }
    auto& channels = followers.list[seat->index].channels;
    auto via = std::find_if(channels.begin(), channels.end(),
                            [&](const auto& c) { return c.first == name; });
    if (via == channels.end()) {
      channels.emplace_back(name, 1);
      changed(followers, retired);
    } else {
      ++via->second;
    }
  }
  return looked_up_;
}

void Hub::unfollow(const std::string& key, const std::string& channel, Reader* reader) {
  std::vector<Targets> retired;
  std::lock_guard lock(mutex_);
  if (!reader->hub_entry_) return;
  ReaderRef& ref = *static_cast<ReaderRef*>(reader->hub_entry_);
  // Among the reader's own seats (usually one): no lookup of the key in followers_.
  auto seat = std::find_if(ref.seats.begin(), ref.seats.end(),
                           [&](const Seat& s) { return *s.key == key; });
  if (seat == ref.seats.end()) return;
  KeyFollowers& followers = *seat->followers;
  auto& channels = followers.list[seat->index].channels;
  auto via = std::find_if(channels.begin(), channels.end(),
                          [&](const auto& c) { return *c.first == channel; });
  if (via != channels.end() && --via->second <= 0) {
    channels.erase(via);
    changed(followers, retired);
  }
  if (channels.empty()) leave(ref, static_cast<size_t>(seat - ref.seats.begin()), retired);
}

Targets Hub::targets(const std::string& key, uint64_t position) {
  static const Targets none = std::make_shared<const std::vector<Target>>();
  std::lock_guard lock(mutex_);
  looked_up_ = std::max(looked_up_, position);
  auto it = followers_.find(key);
  if (it == followers_.end()) return none;
  auto& followers = it->second;
  if (followers.snapshot) return followers.snapshot;
  auto list = std::make_shared<std::vector<Target>>();
  list->reserve(followers.list.size());
  for (const Follower& f : followers.list) {
    auto reader = f.ref->reader.lock();
    if (!reader) continue;
    Target t{std::move(reader), f.viewer, {}};
    for (const auto& [channel, n] : f.channels) t.channels.push_back(channel);
    list->push_back(std::move(t));
  }
  followers.snapshot = std::move(list);
  return followers.snapshot;
}

void Hub::handed_through(uint64_t position) {
  std::lock_guard lock(mutex_);
  handed_ = std::max(handed_, position);
}

uint64_t Hub::handed_through() const {
  std::lock_guard lock(mutex_);
  return handed_;
}

std::vector<std::shared_ptr<Reader>> Hub::readers() const {
  std::vector<std::shared_ptr<Reader>> out;
  std::lock_guard lock(mutex_);
  out.reserve(members_.size());
  for (const Member& m : members_) {
    if (auto r = m.ref->reader.lock()) out.push_back(std::move(r));
  }
  return out;
}

std::vector<std::shared_ptr<Reader>> Hub::unsettled_readers(uint64_t position) const {
  std::vector<std::shared_ptr<Reader>> out;
  std::lock_guard lock(mutex_);
  // (raw is alive: a reader leaves before its destruction ends, and cannot leave while the walk
  // holds the lock; no reference is taken for the many that are settled)
  for (const Member& m : members_) {
    if (m.raw->settled() >= position) continue;
    if (auto r = m.ref->reader.lock()) out.push_back(std::move(r));
  }
  return out;
}

size_t Hub::reader_count() const {
  std::lock_guard lock(mutex_);
  return readers_.size();
}

}  // namespace outlive::fanout
