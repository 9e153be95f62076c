#include "session/subscriptions.hpp"

#include <algorithm>
#include <limits>

#include "tab/protocol.hpp"

namespace outlive::session {

bool matches(const tab::Filter& filter, const nlohmann::json& scalar_fields) {
  for (const auto& [name, value] : filter) {
    const auto field = scalar_fields.find(name);
    if (field == scalar_fields.end() || *field != value) return false;
  }
  return true;
}

void Subscriptions::count(const std::string& key, int delta) {
  auto& n = followed_[key];
  n += delta;
  if (n <= 0) followed_.erase(key);
}

void Subscriptions::add(const std::string& id, Subscription sub) {
  for (const auto& [k, pos] : sub.keys) count(k, +1);
  subs_[id] = std::move(sub);
}

std::optional<Subscription> Subscriptions::remove(const std::string& id) {
  auto it = subs_.find(id);
  if (it == subs_.end()) return std::nullopt;
  Subscription sub = std::move(it->second);
  subs_.erase(it);
  for (const auto& [k, pos] : sub.keys) count(k, -1);
  return sub;
}

std::pair<std::set<std::string>, std::set<std::string>> Subscriptions::replace_keys(
    const std::string& id, const std::set<std::string>& keys, uint64_t from) {
  std::set<std::string> gained, lost;
  auto it = subs_.find(id);
  if (it == subs_.end()) return {gained, lost};
  auto& current = it->second.keys;
  for (auto k = current.begin(); k != current.end();) {
    if (keys.count(k->first)) {
      ++k;
      continue;
    }
    lost.insert(k->first);
    count(k->first, -1);
    k = current.erase(k);
  }
  for (const auto& k : keys) {
    if (current.emplace(k, from).second) {
      gained.insert(k);
      count(k, +1);
    }
  }
  return {gained, lost};
}

void Subscriptions::bring_to(const std::string& id, uint64_t position) {
  auto it = subs_.find(id);
  if (it == subs_.end()) return;
  for (auto& [k, pos] : it->second.keys) pos = std::max(pos, position);
}

void Subscriptions::bring_all_to(uint64_t position) {
  for (auto& [id, sub] : subs_)
    for (auto& [k, pos] : sub.keys) pos = std::max(pos, position);
}

bool Subscriptions::wants(const window::Update& u) const {
  if (!follows(u.key)) return false;
  for (const auto& [id, sub] : subs_) {
    auto k = sub.keys.find(u.key);
    if (k != sub.keys.end() && k->second < u.position) return true;
  }
  return false;
}

uint64_t Subscriptions::lowest_position() const {
  uint64_t lowest = std::numeric_limits<uint64_t>::max();
  for (const auto& [id, sub] : subs_) {
    for (const auto& [k, pos] : sub.keys) lowest = std::min(lowest, pos);
  }
  return lowest == std::numeric_limits<uint64_t>::max() ? 0 : lowest;
}

std::vector<std::string> Subscriptions::behind(uint64_t position) const {
  std::vector<std::string> out;
  for (const auto& [id, sub] : subs_) {
    for (const auto& [k, pos] : sub.keys) {
      if (pos < position) {
        out.push_back(id);
        break;
      }
    }
  }
  return out;
}

std::vector<std::string> Subscriptions::channels_of(const std::string& key) const {
  std::vector<std::string> out;
  for (const auto& [id, sub] : subs_) {
    if (sub.keys.count(key) && std::find(out.begin(), out.end(), sub.channel) == out.end())
      out.push_back(sub.channel);
  }
  return out;
}

void Subscriptions::apply(const window::Update& u, const std::string& cursor,
                          const fanout::ChannelAccess& allowed, Effect& out) {
  if (!follows(u.key)) return;
  const nlohmann::json* fields = nullptr;  // the update's own: nothing is allocated per socket
  for (auto& [id, sub] : subs_) {
    auto k = sub.keys.find(u.key);
    if (k == sub.keys.end() || u.position <= k->second) continue;
    k->second = u.position;
    out.applied = true;
    const auto decision = std::find_if(allowed.begin(), allowed.end(),
                                       [&](const auto& a) { return a.first == sub.channel; });
    if (decision == allowed.end() || !decision->second) {
      // Lost access: a single-key subscription ends, a collection drops the key and reloads.
      if (sub.collection) {
        sub.keys.erase(k);
        count(u.key, -1);
        out.dropped.emplace_back(sub.channel, u.key);
        out.frames.push_back(tab::frames::resync(id, cursor, "access"));
      } else {
        out.frames.push_back(tab::frames::revoked(id));
        out.ended.push_back(id);
      }
      continue;
    }
    if (u.kind == window::Kind::resync) {
      out.frames.push_back(tab::frames::resync(id, cursor, "oversized"));
    } else if (u.kind == window::Kind::data && u.data_json) {
      if (sub.filter && !u.access) {
        if (!fields) fields = &u.scalar_fields();
        if (!matches(*sub.filter, *fields)) {
          out.filtered = true;
          continue;
        }
      }
      out.update_ids.push_back(id);
    }
  }
}

}  // namespace outlive::session
