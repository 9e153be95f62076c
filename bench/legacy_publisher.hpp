#pragma once
// Today's lease claim (before issue 15), for the benchmark's same-run comparison only.
#include <functional>
#include <memory>
#include <string>

#include "publisher/publisher.hpp"

namespace outlive::legacy_claim {

class Publisher {
 public:
  Publisher(std::string database_url, topic::Client& nats, publisher::Options options,
            const Clock& clock = SteadyClock::instance());
  ~Publisher();
  void start();
  void stop();
  void on_published(std::function<void(const publisher::Published&)> callback);
  const publisher::Stats& stats() const;
  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Creates schema legacy with today's claim function over events.outbox (its lease columns stay).
void install(const std::string& database_url);

}  // namespace outlive::legacy_claim
