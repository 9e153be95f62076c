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
  // Unused since claims are partitions (sql/003): ownership is the replica's lease (sql/005,
  // lease_ttl below), whose bound SPEC 1 fixes at 5 s. Kept so existing configurations stay valid.
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
  // Ownership (sql/005): the lease is renewed every `lease_renew` from the loop and dies after
  // `lease_ttl` without a renewal (Postgres's clock); the replica itself stops publishing
  // `lease_margin` before that by its own clock. SPEC 1: another replica takes over within 5 s.
  std::chrono::milliseconds lease_renew = std::chrono::milliseconds(500);
  std::chrono::milliseconds lease_ttl = std::chrono::seconds(3);
  std::chrono::milliseconds lease_margin = std::chrono::milliseconds(500);
  // NATS silent this long with a publish waiting for its answer: the replica gives its partitions
  // up until NATS answers again (a probe every second).
  std::chrono::milliseconds nats_silence = std::chrono::seconds(2);
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
  std::atomic<uint64_t> turns{0};  // of the loop (a loop that waits for its deadlines turns rarely)
  // Ownership lost, by cause: the lease ran out (the replica was frozen or Postgres did not
  // answer in time), the database connection was lost, NATS did not answer.
  std::atomic<uint64_t> lost_lease{0};
  std::atomic<uint64_t> lost_database{0};
  std::atomic<uint64_t> lost_nats{0};
  // Publishes the fence refused: rows held when the lease ran out, never sent.
  std::atomic<uint64_t> fenced{0};
  // Publishes sent again because NATS reconnected before they were answered.
  std::atomic<uint64_t> resent{0};
};

// The publishing counts of one app (/metrics' `app` label); Stats holds their sums.
struct AppStats {
  std::atomic<uint64_t> published{0};
  std::atomic<uint64_t> publish_errors{0};
  std::atomic<uint64_t> fenced{0};
};

// One per replica. start() runs the loop on its own thread (and a LISTEN thread for wake): it holds
// one lease for all its apps (sql/005), owns the partitions the live leases assign it, reads their
// rows by position and publishes them per key in order, only while its lease holds. stop() stops
// reading, lets in-flight publishes finish (up to stop_grace), deletes what was acked and ends its
// lease, which frees its partitions.
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
  // Runs for every update handed to NATS, on the publisher thread, before its ack (tests: what a
  // replica sends after it lost its lease); `sequence` and `acked_at` are not known yet.
  void on_sent(std::function<void(const Published&)> callback);
  const Stats& stats() const;
  // From any thread: the counts of `app`, nullptr when it is not one of Options::apps. Lives as
  // long as the publisher.
  const AppStats* app_stats(const std::string& app) const;
  // From any thread (/metrics): partitions of `app` this replica owns now; seconds since its lease
  // was last renewed (-1 before the first renewal).
  int partitions_owned(const std::string& app) const;
  double heartbeat_age_seconds() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace outlive::publisher
