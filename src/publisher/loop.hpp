#pragma once
// The publisher's loop (publisher.hpp's Impl), shared by its two halves: publisher.cpp runs the
// loop and keeps ownership (lease rounds, the fence, NATS health); sending.cpp reads the owned
// partitions and publishes per key, in order, and settles what was acked. One thread runs all of
// it; other threads only queue results and deletes under mutex_ and wake the loop.
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/outage_log.hpp"
#include "common/socket_slot.hpp"
#include "outbox/partitions.hpp"
#include "publisher/held.hpp"
#include "publisher/lease_term.hpp"
#include "publisher/loop_wake.hpp"
#include "publisher/nats_health.hpp"
#include "publisher/publisher.hpp"
#include "publisher/settler.hpp"
#include "topic/client.hpp"

namespace outlive::publisher {

using outbox::PendingRow;

class Publisher::Impl {
 public:
  Impl(std::string url, topic::Client& nats, Options options, const Clock& clock);
  void start();
  void stop();

  Stats stats_;
  std::unique_ptr<AppStats[]> app_stats_;  // per app, like apps_
  std::function<void(const Published&)> on_published_;
  std::function<void(const Published&)> on_sent_;

  const AppStats* app_stats(const std::string& app) const {
    for (size_t i = 0; i < apps_.size(); ++i) {
      if (apps_[i].id == app) return &app_stats_[i];
    }
    return nullptr;
  }
  int partitions_owned(const std::string& app) const {
    for (size_t i = 0; i < apps_.size(); ++i) {
      if (apps_[i].id == app) return owned_count_[i].load();
    }
    return 0;
  }
  double heartbeat_age_seconds() const {
    const int64_t at = heartbeat_us_.load();
    if (at < 0) return -1;
    return (steady_us() - at) / 1e6;
  }

 private:
  int max_held() const { return options_.batches_in_flight * options_.claim_size; }

  void run();

  // Another thread has something for the loop (a result, a delete, a wake, the stop).
  void signal() { wake_.signal(); }

  void wait(Clock::duration timeout);
  Clock::duration next_wait();
  void connect();

  // The connection failed: its lease ends with its backend, so another replica may own our
  // partitions now; nothing more is published and everything held is forgotten.
  void lose_database(const std::string& error);

  // ---- ownership (sql/006: one lease per replica for all its apps)

  bool owns_any() const {
    if (!in_flight_.empty()) return true;
    for (const auto& a : apps_) {
      if (!a.owned.empty()) return true;
    }
    return false;
  }

  // One round trip for every app: renews the lease (or takes a new one) and reads the live leases,
  // from which every member computes the same assignment. Nothing per app is written or locked,
  // so an idle replica costs Postgres one UPDATE per round however many apps it serves.
  void lease_round();
  void assign(const std::vector<outbox::LeaseMember>& live);

  // The lease may have run out (by this loop's clock): another replica may own these keys now.
  void fence(Clock::time_point now);

  // Drops everything held (waiting and in flight: never published by this replica now); what was
  // acked is still deleted. The next round takes a new lease under a new epoch.
  void lose_lease(std::atomic<uint64_t>& cause, const std::string& why);

  // The others take this replica's partitions at their next round instead of after the ttl.
  void end_lease();

  void give_up_partitions();

  // A replica that cannot publish holds no keys (SPEC 1): NATS silent for `nats_silence` while a
  // publish waits for its answer, or disconnected that long, gives every partition up; a probe
  // every second tells when NATS answers again, and the next round takes a share again.
  void check_nats(Clock::time_point now);
  // A publish sent before NATS reconnected is sent again on the new connection (the same
  // Nats-Msg-Id: the stream keeps one copy): its answer was lost with the old one, and waiting for
  // the silence rule or the timeout delayed its key by seconds.
  void resend_after_reconnect(Clock::time_point now);

  // ---- reads

  bool room(const App& a) const { return max_held() - a.held >= options_.claim_size / 2; }

  void read(App& a, Clock::time_point now);

  // The poll covers commits whose wake was lost: one statement asks which apps have rows at all,
  // and only those are read (an idle replica of 80 apps sends one statement a second, not 80).
  void poll(Clock::time_point now);
  void read_keys(App& a, Clock::time_point now);
  void take(App& a, std::vector<PendingRow>&& rows, Clock::time_point now);

  // ---- publishing

  void send_next(App& a, const std::string& key);
  // The publish's headers (`Outlive-Created-At`), in one buffer the loop reuses for every send.
  const std::vector<std::pair<std::string, std::string>>& created_header_for(const PendingRow& row);
  void handle_result(const topic::PublishResult& result);
  void expire_in_flight(Clock::time_point now);
  // Forgets an in-flight publish (a late answer is not reported) and fails it.
  void give_up_in_flight(uint64_t token, const std::string& error);

  // The key backs off; its later rows wait in the outbox behind the failed one (SPEC 3).
  void fail(App& a, const PendingRow& row, const std::string& error);
  void forget_in_flight();

  // Deletes in groups keep a round trip off every ack, and the settler's thread keeps them off
  // this loop; the rows stay known (skipped by reads) until their delete committed.
  void settle();
  void forget_deleted(const std::vector<int64_t>& positions);
  void log_waiting();

  static constexpr auto kSettleInterval = std::chrono::milliseconds(20);
  // Acks nothing waits for are taken at least this often (they free room and go to the settler).
  static constexpr auto kAckInterval = std::chrono::milliseconds(20);

  // The key's next row waits for this publish's ack: its ack wakes the loop (start()).
  void mark_urgent(uint64_t token) {
    std::lock_guard lock(mutex_);
    urgent_.insert(token);
  }
  void unmark_urgent(uint64_t token) {
    std::lock_guard lock(mutex_);
    urgent_.erase(token);
  }
  // What stop() waits beyond stop_grace for the last deletes before it cuts them short.
  static constexpr auto kStopMargin = std::chrono::seconds(1);

  static int64_t steady_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  const std::string url_;
  topic::Client& nats_;
  const Options options_;
  const Clock& clock_;

  LoopWake wake_{url_, clock_};  // signal(): the loop runs again; the LISTEN connection
  std::mutex mutex_;
  std::deque<topic::PublishResult> results_;
  std::unordered_set<uint64_t> urgent_;  // tokens in flight whose key has a row waiting
  std::vector<int64_t> deleted_;  // from the settler: their delete committed
  bool stopping_ = false;
  bool stop_seen_ = false;  // the loop has taken the stop in hand
  bool finished_ = false;   // run() returned (stop() waits for it, bounded)
  std::condition_variable finished_cv_;
  // The loop's and the settler's connections, for stop() to cut short what waits on them.
  SocketSlot store_slot_, settler_slot_;
  std::thread loop_;

  // publisher-thread state
  std::unique_ptr<outbox::PartitionStore> store_;
  std::vector<App> apps_;
  std::unique_ptr<std::atomic<int>[]> owned_count_;  // per app, for /metrics
  std::atomic<int64_t> heartbeat_us_{-1};            // steady clock of the last renewal
  std::string member_;  // this run's name in events.publisher_leases (sql/006)
  LeaseTerm term_{options_.lease_renew, options_.lease_ttl, options_.lease_margin};
  NatsHealth health_{options_.nats_silence};
  uint64_t probes_ = 0;
  std::unordered_map<uint64_t, InFlight> in_flight_;
  uint64_t next_token_ = 0;
  uint64_t reconnects_seen_ = 0;  // nats_.reconnects() when resend_after_reconnect last looked
  std::vector<std::pair<App*, int64_t>> acked_;  // not handed to the settler yet
  std::vector<outbox::FailedPublish> failures_;
  std::unordered_map<int64_t, App*> deleting_;  // handed to the settler, not deleted yet
  std::unique_ptr<Settler> settler_;
  // "database error; publishing stops" once, repeats every 10 s, and when it works again.
  log::OutageLog database_outage_{"publisher: database (publishing stops until it owns partitions again)",
                                  log::Level::error};
  Clock::time_point last_settle_{};
  std::vector<std::pair<std::string, std::string>> created_header_{{"Outlive-Created-At", ""}};
};

}  // namespace outlive::publisher
