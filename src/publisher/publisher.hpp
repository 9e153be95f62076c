#pragma once
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.hpp"

namespace outlive::topic {
class Client;
}

namespace outlive::publisher {

struct Options {
  std::string replica = "r1";
  std::vector<std::string> apps;
  int claim_size = 100;  // SPEC 3: a read takes up to 100
  // Unused since claims are partition locks (sql/003): a dead replica's partitions are taken
  // over as soon as Postgres drops its connection. Kept so existing configurations stay valid.
  std::chrono::milliseconds lease = std::chrono::seconds(30);
  std::chrono::milliseconds poll_interval = std::chrono::seconds(1);
  std::chrono::milliseconds publish_timeout = std::chrono::seconds(5);
  // Rows held per app: batches_in_flight x claim_size (waiting or in flight); a backlog does not
  // slow a read down.
  int batches_in_flight = 4;
  std::chrono::milliseconds backoff_base = std::chrono::seconds(1);
  std::chrono::milliseconds backoff_cap = std::chrono::minutes(5);
  std::chrono::milliseconds waiting_threshold = std::chrono::seconds(60);
  std::chrono::milliseconds waiting_log_interval = std::chrono::minutes(1);
  std::chrono::milliseconds stop_grace = std::chrono::seconds(5);
};

struct Published {
  std::string app_id;
  std::string key;
  uint64_t sequence;
  std::chrono::system_clock::time_point created_at;  // the commit's clock (Postgres)
  std::chrono::system_clock::time_point acked_at;    // when the ack reached this process
  // Where the time went (publisher_bench): when the row was read, when it was handed to NATS.
  std::chrono::system_clock::time_point read_at{};
  std::chrono::system_clock::time_point sent_at{};
};

struct Stats {
  std::atomic<uint64_t> published{0};
  std::atomic<uint64_t> publish_errors{0};
  std::atomic<uint64_t> claims{0};
  std::atomic<uint64_t> claimed_updates{0};
  std::atomic<uint64_t> waiting_logs{0};
};

// One per replica. start() runs the loop on its own thread (and a LISTEN thread for wake): it owns
// a fair share of each app's 64 partitions (session advisory locks), reads their rows by position
// and publishes them per key in order. stop() stops reading, lets in-flight publishes finish (up
// to stop_grace), deletes what was acked and closes its connection, which frees its partitions.
class Publisher {
 public:
  Publisher(std::string database_url, topic::Client& nats, Options options,
            const Clock& clock = SteadyClock::instance());
  ~Publisher();
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  void start();
  void stop();
  // Runs for every acknowledged update, on the publisher thread (benchmarks, tests, metrics).
  void on_published(std::function<void(const Published&)> callback);
  const Stats& stats() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace outlive::publisher
