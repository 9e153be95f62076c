#pragma once
// One app's ticks, run by its dispatcher's thread between rounds (so they see each round's
// hand-off): progress once a second, collections' keys() again every minute.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "fanout/hub.hpp"
#include "fanout/round.hpp"
#include "tab/protocol.hpp"
#include "topic/cursor.hpp"

namespace outlive::fanout {

class Ticks {
 public:
  using Clock = std::chrono::steady_clock;
  // `identity`: the topic's (the progress frame's cursor), read only once ticks run.
  Ticks(const std::string& app, const topic::TopicIdentity& identity, Hub& hub, DeliveryHost& host,
        std::chrono::milliseconds progress, std::chrono::milliseconds refresh)
      : app_(app),
        identity_(identity),
        hub_(hub),
        host_(host),
        progress_(progress),
        refresh_(refresh) {}

  void start(Clock::time_point now) {
    next_progress_ = now + progress_;
    next_refresh_ = now + refresh_;
  }
  // When the next one is due.
  Clock::time_point next() const { return std::min(next_progress_, next_refresh_); }

  // The ticks due at `now`. Progress: every reader hears how far its app's updates have been
  // handed off, so an idle subscription's cursor keeps up and a reader that falls behind later
  // starts its catch-up from there rather than from a key's last update; a reader that got there
  // with its live updates (Reader::settled) is not visited.
  void run(Clock::time_point now) {
    if (now >= next_progress_) {
      next_progress_ = now + progress_;
      if (const uint64_t through = hub_.handed_through(); through > 0) {
        auto readers = hub_.unsettled_readers(through);
        host_.on_progress(app_, readers.size());
        if (!readers.empty()) host_.progress(std::move(readers), tick_at(through, now));
      }
    }
    if (now >= next_refresh_) {
      next_refresh_ = now + refresh_;
      refresh_collections();
    }
  }

  // keys() again for every reader's collections (also after an access update's round).
  void refresh_collections() {
    hub_.for_each_reader([](Reader& r) { r.refresh_collections(); });
  }

 private:
  ProgressTick tick_at(uint64_t through, Clock::time_point now) const {
    return {through,
            std::make_shared<const std::string>(
                tab::frames::progress(topic::Cursor::at(identity_, through).encode())),
            now};
  }

  const std::string& app_;
  const topic::TopicIdentity& identity_;
  Hub& hub_;
  DeliveryHost& host_;
  const std::chrono::milliseconds progress_;
  const std::chrono::milliseconds refresh_;
  Clock::time_point next_progress_{};
  Clock::time_point next_refresh_{};
};

}  // namespace outlive::fanout
