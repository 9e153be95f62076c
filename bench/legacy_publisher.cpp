// Today's claim before issue 15, kept for the benchmark only (docs/BENCHMARKS.md): the publisher
// loop of commit cf66cc2 over legacy.claim, a copy of the lease claim of sql/002_claim_plan.sql in
// a schema of its own (install() below), so the product keeps one claim.
#include "bench/legacy_publisher.hpp"

#include <condition_variable>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <pqxx/pqxx>
#include <thread>
#include <unordered_map>

#include "common/log.hpp"
#include "publisher/backoff.hpp"
#include "topic/client.hpp"

namespace outlive::legacy_claim {
using publisher::backoff_delay;
using publisher::Options;
using publisher::Published;
using publisher::Stats;
namespace {

using KeyId = std::pair<std::string, std::string>;  // (app, key)

struct Row {
  int64_t position = 0;
  std::string id;
  std::string app_id;
  std::string key;
  std::string envelope;
  int64_t created_at_us = 0;
  int attempts = 0;
};

// One claim: per key, its rows in position order; at most one row of a key is in flight.
struct Batch {
  std::map<KeyId, std::deque<Row>> waiting;
  int in_flight = 0;
  bool done() const { return waiting.empty() && in_flight == 0; }
};

struct InFlight {
  Batch* batch;
  Row row;
  Clock::time_point deadline;
};

struct Failure {
  int64_t position;
  std::chrono::milliseconds delay;
  std::string error;
};

std::string pg_array(const std::vector<std::string>& items) {
  std::string out = "{";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + items[i];
  return out + "}";
}

std::string pg_array(const std::vector<int64_t>& items) {
  std::string out = "{";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + std::to_string(items[i]);
  return out + "}";
}

std::string pg_interval(std::chrono::milliseconds d) {
  return std::to_string(d.count()) + " milliseconds";
}

}  // namespace

class Publisher::Impl {
 public:
  Impl(std::string url, topic::Client& nats, Options options, const Clock& clock)
      : url_(std::move(url)),
        nats_(nats),
        options_(std::move(options)),
        clock_(clock),
        apps_array_(pg_array(options_.apps)) {}

  void start() {
    nats_.set_publish_handler([this](const topic::PublishResult& r) {
      {
        std::lock_guard lock(mutex_);
        results_.push_back(r);
      }
      cv_.notify_one();
    });
    stopping_ = false;
    loop_ = std::thread([this] { run(); });
    listener_ = std::thread([this] { listen(); });
  }

  void stop() {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_one();
    if (loop_.joinable()) loop_.join();
    if (listener_.joinable()) listener_.join();
    nats_.set_publish_handler(nullptr);
  }

  void wake() {
    {
      std::lock_guard lock(mutex_);
      wake_ = true;
    }
    cv_.notify_one();
  }

  Stats stats_;
  std::function<void(const Published&)> on_published_;

 private:
  void run() {
    auto now = clock_.now();
    auto next_poll = now;
    auto next_waiting_check = now + options_.waiting_log_interval;
    std::optional<Clock::time_point> stop_deadline;
    bool claim_now = true;
    for (;;) {
      std::deque<topic::PublishResult> results;
      bool stopping = false;
      {
        std::lock_guard lock(mutex_);
        results.swap(results_);
        if (std::exchange(wake_, false)) claim_now = true;
        stopping = stopping_;
      }
      now = clock_.now();
      for (const auto& r : results) handle_result(r, claim_now);
      expire_in_flight(now, claim_now);
      if (stopping) {
        if (!stop_deadline) stop_deadline = now + options_.stop_grace;
        release_waiting();
        if (now >= *stop_deadline) release_in_flight();
      }
      try {
        connect();
        // Deleting acked updates in groups keeps a Postgres round trip off every ack; a key stays
        // blocked by its lease until then, so nothing is claimed twice meanwhile.
        if (stopping || batch_finished_ || !failures_.empty() || acked_.size() >= 1000 ||
            now - last_flush_ >= kFlushInterval) {
          flush();
          last_flush_ = now;
          batch_finished_ = false;
        }
        if (stopping) {
          if (in_flight_.empty()) break;
        } else {
          if (batches_.size() < static_cast<size_t>(options_.batches_in_flight) &&
              (claim_now || now >= next_poll)) {
            claim_now = claim() == options_.claim_size;
            next_poll = now + options_.poll_interval;
          }
          if (now >= next_waiting_check) {
            log_waiting();
            next_waiting_check = now + options_.waiting_log_interval;
          }
        }
      } catch (const std::exception& e) {
        log::error("publisher: database error, retrying",
                   {{"error", e.what()}, {"replica", options_.replica}});
        db_.reset();
        if (stopping && now >= *stop_deadline) break;
        std::unique_lock lock(mutex_);
        cv_.wait_for(lock, std::chrono::milliseconds(500), [&] { return stopping_ != stopping; });
        continue;
      }
      std::unique_lock lock(mutex_);
      auto wait = std::chrono::milliseconds(100);
      if (!claim_now || batches_.size() >= static_cast<size_t>(options_.batches_in_flight)) {
        const auto until_poll =
            std::chrono::duration_cast<std::chrono::milliseconds>(next_poll - clock_.now());
        wait = std::clamp(until_poll, std::chrono::milliseconds(1), wait);
      } else {
        wait = std::chrono::milliseconds(0);
      }
      if (!acked_.empty() || !released_.empty())
        wait = std::min<std::chrono::milliseconds>(wait, kFlushInterval);
      cv_.wait_for(lock, wait, [&] { return !results_.empty() || wake_ || stopping_ != stopping; });
    }
  }

  void connect() {
    if (!db_) db_.emplace(url_);
  }

  int claim() {
    pqxx::nontransaction tx(*db_);
    const auto result = tx.exec_params(
        "SELECT position, id::text, app_id, key, envelope,"
        " (extract(epoch FROM created_at) * 1000000)::bigint, attempts"
        " FROM legacy.claim($1, $2::text[], $3, $4::interval)",
        options_.replica, apps_array_, options_.claim_size, pg_interval(options_.lease));
    stats_.claims++;
    if (result.empty()) return 0;
    stats_.claimed_updates += result.size();
    std::vector<Row> rows;
    rows.reserve(result.size());
    for (const auto& r : result) {
      rows.push_back(Row{r[0].as<int64_t>(), r[1].as<std::string>(), r[2].as<std::string>(),
                         r[3].as<std::string>(), r[4].as<std::string>(), r[5].as<int64_t>(),
                         r[6].as<int>()});
    }
    std::sort(rows.begin(), rows.end(),
              [](const Row& a, const Row& b) { return a.position < b.position; });
    Batch& batch = batches_.emplace_back();
    for (auto& row : rows) batch.waiting[{row.app_id, row.key}].push_back(std::move(row));
    std::vector<KeyId> keys;
    for (const auto& [key, _] : batch.waiting) keys.push_back(key);
    bool unused = false;
    for (const auto& key : keys) send_next(batch, key, unused);
    return static_cast<int>(result.size());
  }

  void send_next(Batch& batch, const KeyId& key, bool& claim_now) {
    auto it = batch.waiting.find(key);
    if (it == batch.waiting.end()) return finish_if_done(batch, claim_now);
    if (it->second.empty()) {
      batch.waiting.erase(it);
      return finish_if_done(batch, claim_now);
    }
    Row row = std::move(it->second.front());
    it->second.pop_front();
    const uint64_t token = ++next_token_;
    const auto error = nats_.publish_async(
        topic::subject_for(row.app_id), row.envelope, row.id, token, options_.publish_timeout,
        {{"Outlive-Created-At", std::to_string(row.created_at_us)}});
    if (error) {
      fail_key(batch, key, row, *error, claim_now);
      return;
    }
    batch.in_flight++;
    in_flight_.emplace(token,
                       InFlight{&batch, std::move(row), clock_.now() + options_.publish_timeout});
  }

  void handle_result(const topic::PublishResult& result, bool& claim_now) {
    auto it = in_flight_.find(result.token);
    if (it == in_flight_.end()) return;
    InFlight f = std::move(it->second);
    in_flight_.erase(it);
    f.batch->in_flight--;
    const KeyId key{f.row.app_id, f.row.key};
    if (result.ok) {
      acked_.push_back(f.row.position);
      stats_.published++;
      if (on_published_) {
        on_published_(Published{
            f.row.app_id,
            f.row.key,
            result.sequence,
            std::chrono::system_clock::time_point(std::chrono::microseconds(f.row.created_at_us)),
            result.acked_at,
            {},
            {}});
      }
      send_next(*f.batch, key, claim_now);
    } else {
      fail_key(*f.batch, key, f.row, result.error, claim_now);
    }
  }

  void expire_in_flight(Clock::time_point now, bool& claim_now) {
    std::vector<uint64_t> expired;
    for (const auto& [token, f] : in_flight_) {
      if (now >= f.deadline) expired.push_back(token);
    }
    for (uint64_t token : expired) {
      auto it = in_flight_.find(token);
      InFlight f = std::move(it->second);
      in_flight_.erase(it);
      nats_.forget(f.row.id);
      f.batch->in_flight--;
      fail_key(
          *f.batch, {f.row.app_id, f.row.key}, f.row,
          "no acknowledgement within " + std::to_string(options_.publish_timeout.count()) + " ms",
          claim_now);
    }
  }

  // The key's update failed: it backs off, and the key's later updates of this claim wait behind
  // it (released, they are claimed again only after it).
  void fail_key(Batch& batch, const KeyId& key, const Row& row, const std::string& error,
                bool& claim_now) {
    stats_.publish_errors++;
    const auto delay = backoff_delay(row.attempts + 1, options_.backoff_base, options_.backoff_cap);
    failures_.push_back(Failure{row.position, delay, error});
    log::warn("publish failed, key backs off", {{"app", row.app_id},
                                                {"key", row.key},
                                                {"attempts", row.attempts + 1},
                                                {"retry_in_ms", delay.count()},
                                                {"error", error}});
    if (auto it = batch.waiting.find(key); it != batch.waiting.end()) {
      for (const auto& later : it->second) released_.push_back(later.position);
      batch.waiting.erase(it);
    }
    finish_if_done(batch, claim_now);
  }

  void finish_if_done(Batch& batch, bool& claim_now) {
    if (!batch.done()) return;
    batches_.remove_if([&](const Batch& b) { return &b == &batch; });
    claim_now = true;  // there may be more behind the keys it held
    batch_finished_ = true;
  }

  void release_waiting() {
    for (auto& batch : batches_) {
      for (const auto& [key, rows] : batch.waiting) {
        for (const auto& r : rows) released_.push_back(r.position);
      }
      batch.waiting.clear();
    }
    batches_.remove_if([](const Batch& b) { return b.done(); });
  }

  void release_in_flight() {
    for (auto& [token, f] : in_flight_) {
      nats_.forget(f.row.id);
      released_.push_back(f.row.position);
    }
    in_flight_.clear();
    batches_.clear();
  }

  void flush() {
    if (acked_.empty() && failures_.empty() && released_.empty()) return;
    pqxx::work tx(*db_);
    if (!acked_.empty()) {
      tx.exec_params("DELETE FROM events.outbox WHERE position = ANY($1::bigint[])",
                     pg_array(acked_));
    }
    if (!released_.empty()) {
      tx.exec_params(
          "UPDATE events.outbox SET claimed_by = NULL, claimed_until = NULL"
          " WHERE position = ANY($1::bigint[]) AND claimed_by = $2",
          pg_array(released_), options_.replica);
    }
    for (const auto& f : failures_) {
      tx.exec_params(
          "UPDATE events.outbox SET claimed_by = NULL, claimed_until = NULL, attempts = attempts + "
          "1,"
          " retry_at = now() + $2::interval, last_error = $3 WHERE position = $1",
          f.position, pg_interval(f.delay), f.error);
    }
    tx.commit();
    acked_.clear();
    released_.clear();
    failures_.clear();
  }

  void log_waiting() {
    pqxx::nontransaction tx(*db_);
    const auto rows = tx.exec_params(
        "SELECT app_id, count(*), extract(epoch FROM now() - min(created_at))::float8"
        " FROM events.outbox WHERE app_id = ANY($1::text[]) AND created_at < now() - $2::interval"
        " GROUP BY app_id",
        apps_array_, pg_interval(options_.waiting_threshold));
    for (const auto& r : rows) {
      stats_.waiting_logs++;
      log::warn("Live updates wait to be published", {{"app", r[0].as<std::string>()},
                                                      {"count", r[1].as<int64_t>()},
                                                      {"oldest_age_s", r[2].as<double>()},
                                                      {"replica", options_.replica}});
    }
  }

  void listen() {
    class Receiver : public pqxx::notification_receiver {
     public:
      Receiver(pqxx::connection_base& c, Impl& impl)
          : notification_receiver(c, "outlive_wake"), impl_(impl) {}
      void operator()(const std::string& payload, int) override {
        for (const auto& app : impl_.options_.apps) {
          if (app == payload) return impl_.wake();
        }
      }

     private:
      Impl& impl_;
    };
    while (!stopping()) {
      try {
        pqxx::connection conn(url_);
        Receiver receiver(conn, *this);
        while (!stopping()) conn.await_notification(0, 200000);
      } catch (const std::exception& e) {
        log::warn("publisher: wake listener lost its connection", {{"error", e.what()}});
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
    }
  }

  bool stopping() {
    std::lock_guard lock(mutex_);
    return stopping_;
  }

  const std::string url_;
  topic::Client& nats_;
  const Options options_;
  const Clock& clock_;
  const std::string apps_array_;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<topic::PublishResult> results_;
  bool wake_ = false;
  bool stopping_ = false;
  std::thread loop_;
  std::thread listener_;

  // publisher-thread state
  std::optional<pqxx::connection> db_;
  std::list<Batch> batches_;
  std::unordered_map<uint64_t, InFlight> in_flight_;
  uint64_t next_token_ = 0;
  std::vector<int64_t> acked_;
  std::vector<int64_t> released_;
  std::vector<Failure> failures_;
  bool batch_finished_ = false;
  Clock::time_point last_flush_{};
  static constexpr auto kFlushInterval = std::chrono::milliseconds(20);
};

Publisher::Publisher(std::string database_url, topic::Client& nats, Options options,
                     const Clock& clock)
    : impl_(std::make_unique<Impl>(std::move(database_url), nats, std::move(options), clock)) {}
Publisher::~Publisher() { stop(); }
void Publisher::start() { impl_->start(); }
void Publisher::stop() { impl_->stop(); }
void Publisher::on_published(std::function<void(const Published&)> callback) {
  impl_->on_published_ = std::move(callback);
}
const Stats& Publisher::stats() const { return impl_->stats_; }

void install(const std::string& database_url) {
  pqxx::connection c(database_url);
  pqxx::work tx(c);
  tx.exec("CREATE SCHEMA IF NOT EXISTS legacy");
  tx.exec(
      R"SQL(CREATE OR REPLACE FUNCTION legacy.claim(replica text, apps text[], max_rows integer, lease interval)
RETURNS TABLE ("position" bigint, id uuid, app_id text, key text, envelope text,
               created_at timestamptz, attempts integer)
LANGUAGE plpgsql
-- The plan must not depend on statistics: an outbox is a queue, often empty when autovacuum
-- analyzes it, and with such statistics every claim read the whole backlog. Index scans only: the
-- primary key in position order (stops after max_rows), the partial indexes for blocked keys.
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
AS $$
#variable_conflict use_column
BEGIN
  PERFORM pg_advisory_xact_lock(7301, 9);
  RETURN QUERY
  WITH picked AS (
    SELECT o.position FROM events.outbox o
     WHERE o.app_id = ANY(claim.apps) AND o.topic = 'live'
       -- NOT IN over a subquery runs as one hashed SubPlan: O(scanned + blocked). No app filter in
       -- it (pairs of other apps never match): with one, the planner may read the whole backlog.
       AND (o.app_id, o.key) NOT IN (
         SELECT b.app_id, b.key FROM events.outbox b WHERE b.claimed_until > now()
         UNION ALL
         SELECT b.app_id, b.key FROM events.outbox b WHERE b.retry_at > now())
     ORDER BY o.position
     LIMIT claim.max_rows
  )
  UPDATE events.outbox u
     SET claimed_by = claim.replica, claimed_until = now() + claim.lease
    FROM picked
   WHERE u.position = picked.position
  RETURNING u.position, u.id, u.app_id, u.key, u.envelope::text, u.created_at, u.attempts;
END;
$$;
)SQL");
  tx.commit();
}

}  // namespace outlive::legacy_claim
