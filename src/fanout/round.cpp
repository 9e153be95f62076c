#include "fanout/round.hpp"

#include "fanout/hub.hpp"

namespace outlive::fanout {

std::vector<Delivery>& Round::part_of(const std::shared_ptr<Reader>& reader) {
  if (reader->round_ != number_) {
    reader->round_ = number_;
    reader->slot_ = static_cast<uint32_t>(parts_.size());
    parts_.emplace_back(reader, std::vector<Delivery>());
  }
  return parts_[reader->slot_].second;
}

void Round::post(uint64_t through) {
  std::vector<std::shared_ptr<Reader>> ready;
  ready.reserve(parts_.size());
  for (auto& [reader, part] : parts_) {
    if (reader->offer(std::move(part), through)) ready.push_back(std::move(reader));
  }
  parts_.clear();
  ++number_;
  if (!ready.empty()) host_.take(std::move(ready));
  if (!delays_.empty()) host_.on_round(app_, delays_);
  delays_.clear();
  hub_.handed_through(through);
}

}  // namespace outlive::fanout
