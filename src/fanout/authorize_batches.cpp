#include "fanout/authorize_batches.hpp"

#include <algorithm>
#include <utility>

namespace outlive::fanout {

AuthorizeBatches::AuthorizeBatches(size_t batch_size, size_t followers,
                                   std::vector<std::vector<AskedDecision>>& asked, Send send)
    : batch_size_(std::max<size_t>(batch_size, 1)),
      followers_(followers),
      asked_(asked),
      send_(std::move(send)) {
  asked_.clear();
}

uint32_t AuthorizeBatches::start_batch(const std::string* channel) {
  batches_.push_back(AuthorizeBatch{channel, {}, "["});
  asked_.emplace_back();
  return static_cast<uint32_t>(batches_.size() - 1);
}

void AuthorizeBatches::send(uint32_t n) {
  AuthorizeBatch& b = batches_[n];
  b.viewers += ']';
  send_(n, std::move(b));
}

void AuthorizeBatches::add(AskedDecision decision, const std::string* channel,
                           const Viewer& viewer) {
  auto o =
      std::find_if(open_.begin(), open_.end(), [&](const Open& c) { return c.channel == channel; });
  if (o == open_.end()) {
    o = open_.insert(open_.end(), Open{channel, {}, start_batch(channel)});
    o->batch_of_viewer.reserve(followers_);
  }
  auto [at, fresh] = o->batch_of_viewer.try_emplace(viewer.id, 0);
  if (fresh) {
    if (batches_[o->filling].ids.size() >= batch_size_) {
      send(o->filling);
      o->filling = start_batch(channel);
    }
    AuthorizeBatch& b = batches_[o->filling];
    if (!b.ids.empty()) b.viewers += ',';
    b.viewers += viewer.json;
    b.ids.push_back(viewer.id);
    at->second = o->filling;
  }
  asked_[at->second].push_back(decision);
}

void AuthorizeBatches::finish() {
  for (const Open& o : open_) send(o.filling);
  open_.clear();
}

}  // namespace outlive::fanout
