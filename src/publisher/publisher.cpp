#include "publisher/publisher.hpp"

#include <charconv>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>

#include "common/log.hpp"
#include "common/socket_slot.hpp"
#include "common/thread_name.hpp"
#include "outbox/partitions.hpp"
#include "publisher/backoff.hpp"
#include "publisher/held.hpp"
#include "publisher/horizon.hpp"
#include "publisher/loop_wake.hpp"
#include "publisher/settler.hpp"
#include "topic/client.hpp"

namespace outlive::publisher {

using outbox::PendingRow;

class Publisher::Impl {
 public:
  Impl(std::string url, topic::Client& nats, Options options, const Clock& clock)
      : url_(std::move(url)), nats_(nats), options_(std::move(options)), clock_(clock) {
    apps_.resize(options_.apps.size());
    app_stats_ = std::make_unique<AppStats[]>(apps_.size());
    for (size_t i = 0; i < apps_.size(); ++i) {
      apps_[i].id = options_.apps[i];
      apps_[i].subject = topic::subject_for(apps_[i].id);
      apps_[i].stats = &app_stats_[i];
    }
    owned_count_ = std::make_unique<std::atomic<int>[]>(apps_.size());
  }

  void start() {
    nats_.set_publish_handler([this](const topic::PublishResult& r) {
      bool was_empty = false;
      {
        std::lock_guard lock(mutex_);
        was_empty = results_.empty();
        results_.push_back(r);
      }
      // The loop takes every result at once: one wake per batch of acks, not one per ack.
      if (was_empty) signal();
    });
    // A member name of its own per run: a restarted publisher never renews its previous lease.
    std::random_device random;
    char suffix[17];
    std::snprintf(suffix, sizeof suffix, "%08x%08x", random(), random());
    member_ = options_.replica + "/" + suffix;
    epoch_ = 0;
    able_ = true;
    heartbeat_us_ = -1;
    stopping_ = false;
    finished_ = false;
    stop_seen_ = false;
    store_slot_.reset();
    settler_slot_.reset();
    wake_.reset();
    loop_ = std::thread([this] {
      name_this_thread("outlive-publish");
      run();
    });
  }

  void stop() {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      stopping_ = true;
    }
    signal();
    // A database that stops answering without closing the connection would hold the loop in a
    // call forever, so what waits on it is cut short (its connection shut down): at once when the
    // loop has not seen the stop within a second (it is blocked in a call whose result matters no
    // more), else after stop_grace for in-flight publishes and the last deletes.
    if (loop_.joinable()) {
      std::unique_lock lock(mutex_);
      if (!finished_cv_.wait_for(lock, kStopMargin, [&] { return stop_seen_ || finished_; })) {
        lock.unlock();
        log::warn("publisher: the database does not answer; stopping without waiting for it",
                  {{"replica", options_.replica}});
        store_slot_.interrupt();
        wake_.interrupt();
        lock.lock();
      }
      if (!finished_cv_.wait_for(lock, options_.stop_grace + kStopMargin,
                                 [&] { return finished_; })) {
        lock.unlock();
        log::warn("publisher: the last deletes do not finish; stopping without them",
                  {{"replica", options_.replica}});
        store_slot_.interrupt();
        wake_.interrupt();
        settler_slot_.interrupt();
      }
    }
    if (loop_.joinable()) loop_.join();
    nats_.set_publish_handler(nullptr);
  }

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

  void run() {
    auto next_waiting_check = clock_.now() + options_.waiting_log_interval;
    std::optional<Clock::time_point> stop_deadline;
    for (;;) {
      std::deque<topic::PublishResult> results;
      std::vector<int64_t> deleted;
      bool stopping = false;
      {
        std::lock_guard lock(mutex_);
        results.swap(results_);
        deleted.swap(deleted_);
        stopping = stopping_;
        if (stopping && !stop_seen_) {
          stop_seen_ = true;
          finished_cv_.notify_all();
        }
      }
      const auto now = clock_.now();
      try {
        if (store_ && !store_->alive())
          throw std::runtime_error("the database closed the connection");
        // Before any result is handled (an ack sends the key's next update): a loop that was
        // frozen past its lease publishes nothing more.
        fence(now);
        for (const auto& r : results) handle_result(r);
        forget_deleted(deleted);
        expire_in_flight(now);
        if (stopping) {
          if (!stop_deadline) stop_deadline = now + options_.stop_grace;
          for (auto& a : apps_) drop_waiting(a, [](int) { return true; });
          // Renewed through the grace, so the last acks still count; nothing new is read.
          if (store_ && epoch_ != 0 && now >= next_round_) lease_round();
          if (now >= *stop_deadline) forget_in_flight();
          if (store_) settle();
          if (in_flight_.empty() && (deleting_.empty() || now >= *stop_deadline)) {
            end_lease();
            break;
          }
        } else {
          connect();
          // Acks go to the settler at most every 20 ms (or 100 at once): at 500 single updates a
          // second, one DELETE per ack cost about a tenth of Postgres's CPU (publisher_bench 5,
          // 3.5-3.8 against 4.0-4.2 CPU s in 5 s). The first ack after a quiet spell goes at once.
          if (!failures_.empty() || acked_.size() >= static_cast<size_t>(options_.claim_size) ||
              now - last_settle_ >= kSettleInterval) {
            settle();
          }
          if (now >= next_round_) lease_round();
          check_nats(clock_.now());
          poll(now);
          for (auto& a : apps_) {
            read_keys(a, now);
            if (a.read_now) read(a, now);
          }
          if (now >= next_waiting_check) {
            log_waiting();
            next_waiting_check = now + options_.waiting_log_interval;
          }
        }
      } catch (const std::exception& e) {
        lose_database(e.what());
        if (stopping) break;
        wait(std::chrono::milliseconds(500));
        continue;
      }
      wait(next_wait());
    }
    store_slot_.clear();
    store_.reset();  // closing the connection releases every partition at once
    settler_.reset();
    wake_.close();  // UNLISTEN: a round trip
    {
      std::lock_guard lock(mutex_);
      finished_ = true;
    }
    finished_cv_.notify_all();
  }

  // Another thread has something for the loop (a result, a delete, a wake, the stop).
  void signal() { wake_.signal(); }

  void wait(std::chrono::milliseconds timeout) {
    for (const auto& app : wake_.wait(timeout)) {
      for (auto& a : apps_) {
        if (a.id == app) a.read_now = true;
      }
    }
  }

  std::chrono::milliseconds next_wait() {
    const auto now = clock_.now();
    Clock::time_point until = std::min(now + std::chrono::milliseconds(100), next_round_);
    for (const auto& a : apps_) {
      until = std::min(until, a.read_now && room(a) ? now : a.next_read);
      for (const auto& key : a.detached) {
        const auto& k = a.keys.at(key);
        if (k.retry_at) until = std::min(until, *k.retry_at);
      }
    }
    if (!acked_.empty()) until = std::min(until, last_settle_ + kSettleInterval);
    return std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(until - now),
                      std::chrono::milliseconds(0), std::chrono::milliseconds(100));
  }

  void connect() {
    if (!settler_) {
      settler_ = std::make_unique<Settler>(
          url_,
          [this](std::vector<int64_t> positions) {
            bool was_empty = false;
            {
              std::lock_guard lock(mutex_);
              was_empty = deleted_.empty();
              deleted_.insert(deleted_.end(), positions.begin(), positions.end());
            }
            if (was_empty) signal();
          },
          &settler_slot_);
    }
    // Listening now: a read covers whatever committed while nobody listened.
    if (wake_.listen()) {
      for (auto& a : apps_) a.read_now = true;
    }
    if (store_) return;
    store_ = std::make_unique<outbox::PartitionStore>(url_);
    store_slot_.set(store_->socket());
    next_round_ = clock_.now();
  }

  // Postgres released our locks (or will, as the connection is gone): another replica may own
  // our partitions now, so nothing more is published and everything held is forgotten.
  void lose_database(const std::string& error) {
    log::error("publisher: database error; publishing stops until it owns partitions again",
               {{"error", error}, {"replica", options_.replica}});
    if (owns_any()) stats_.lost_database++;
    epoch_ = 0;  // the lease is renewed no more; a new connection takes a new one
    refused_ = false;
    store_slot_.clear();
    store_.reset();
    forget_in_flight();
    acked_.clear();
    failures_.clear();
    deleting_.clear();  // the settler goes on deleting them: they were acked
    for (size_t i = 0; i < apps_.size(); ++i) {
      auto& a = apps_[i];
      owned_count_[i] = 0;
      a.owned.clear();
      a.keys.clear();
      a.detached.clear();
      a.known.clear();
      a.held = 0;
      a.horizon.reset();
      a.read_now = true;
    }
  }

  // ---- ownership (sql/005: one lease per replica for all its apps)

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
  void lease_round() {
    const auto sent = clock_.now();
    const auto round = store_->lease_round(member_, options_.replica, options_.apps,
                                           options_.lease_ttl, epoch_, able_);
    next_round_ = sent + options_.lease_renew;
    if (epoch_ != 0 && round.epoch != epoch_)
      lose_lease(stats_.lost_lease, "the lease ran out before it was renewed");
    epoch_ = round.epoch;
    // The server's expiry is its now() + ttl, taken no earlier than `sent`: by this clock the
    // lease holds at least until sent + ttl, and the loop stops publishing a margin before.
    lease_until_ = sent + options_.lease_ttl - options_.lease_margin;
    heartbeat_us_ = steady_us();
    if (clock_.now() >= lease_until_) {
      // The answer took longer than the lease (a partition that ended just now): by this clock
      // it proves nothing. Another round at once, while the server's expiry is fresh.
      next_round_ = clock_.now();
      return;
    }
    assign(round.live);
  }

  void assign(const std::vector<outbox::LeaseMember>& live) {
    for (size_t i = 0; i < apps_.size(); ++i) {
      auto& a = apps_[i];
      std::set<int> mine;
      if (able_) {
        for (int p : outbox::assigned_partitions(live, a.id, member_)) mine.insert(p);
      }
      if (mine == a.owned) continue;
      bool gained = false;
      for (int p : mine) gained = gained || !a.owned.count(p);
      a.owned = std::move(mine);
      // Keys of partitions given up: what waits is dropped, what is in flight finishes (its ack
      // deletes the row; the new owner may publish it too, under the same Nats-Msg-Id).
      drop_waiting(a, [&](int p) { return a.owned.count(p) == 0; });
      if (gained) {
        // The new partitions' rows lie anywhere below the cursor: read everything pending again
        // (what this replica holds is skipped as known).
        a.horizon.reset();
        a.read_now = true;
      }
      owned_count_[i] = static_cast<int>(a.owned.size());
      int serving = 0;
      for (const auto& m : live) {
        if (m.able && std::find(m.apps.begin(), m.apps.end(), a.id) != m.apps.end()) serving++;
      }
      log::info("publisher: owns partitions", {{"app", a.id},
                                               {"owned", a.owned.size()},
                                               {"replicas", serving},
                                               {"replica", options_.replica}});
    }
  }

  // The lease may have run out (by this loop's clock): another replica may own these keys now.
  void fence(Clock::time_point now) {
    // Also after a refused send: the key's rows wait with nothing in flight, and nothing would
    // send them if a renewal came before this check.
    if (epoch_ != 0 && (now >= lease_until_ || std::exchange(refused_, false)))
      lose_lease(stats_.lost_lease,
                 "the lease was not renewed in time (the replica was frozen or "
                 "the database did not answer)");
  }

  // Drops everything held (waiting and in flight: never published by this replica now); what was
  // acked is still deleted. The next round takes a new lease under a new epoch.
  void lose_lease(std::atomic<uint64_t>& cause, const std::string& why) {
    if (owns_any()) {
      cause++;
      int held = 0;
      for (const auto& a : apps_) {
        held += a.held;
        a.stats->fenced += static_cast<uint64_t>(a.held);
      }
      stats_.fenced += static_cast<uint64_t>(held);
      log::warn("publisher: ownership lost; publishes nothing it held",
                {{"why", why}, {"dropped", held}, {"replica", options_.replica}});
    }
    give_up_partitions();
    epoch_ = 0;
    refused_ = false;
    next_round_ = clock_.now();
  }

  // The others take this replica's partitions at their next round instead of after the ttl.
  void end_lease() {
    if (!store_ || epoch_ == 0) return;
    try {
      store_->lease_end({member_, epoch_});
    } catch (const std::exception& e) {
      log::warn("publisher: ending the lease failed; it runs out by itself",
                {{"error", e.what()}, {"replica", options_.replica}});
    }
    epoch_ = 0;
  }

  void give_up_partitions() {
    forget_in_flight();
    for (size_t i = 0; i < apps_.size(); ++i) {
      auto& a = apps_[i];
      a.owned.clear();
      drop_waiting(a, [](int) { return true; });
      a.horizon.reset();
      a.read_now = true;
      owned_count_[i] = 0;
    }
  }

  // A replica that cannot publish holds no keys (SPEC 1): NATS silent for `nats_silence` while a
  // publish waits for its answer, or disconnected that long, gives every partition up; a probe
  // every second (a publish to a subject no stream takes: the server answers "no responders")
  // tells when NATS answers again, and the next round takes a share again.
  void check_nats(Clock::time_point now) {
    if (!nats_.connected()) {
      if (!disconnected_since_) disconnected_since_ = now;
    } else {
      disconnected_since_.reset();
    }
    if (able_) {
      // Unanswered publishes count until NATS answers anything, whether they timed out since (a
      // timeout backs the key off and its next try waits) or not.
      const bool silent =
          (disconnected_since_ && now - *disconnected_since_ >= options_.nats_silence) ||
          (unanswered_since_ && now - *unanswered_since_ >= options_.nats_silence);
      if (!silent) return;
      unanswered_since_.reset();
      if (owns_any()) stats_.lost_nats++;
      log::warn("publisher: NATS does not answer; gives its partitions up until it does",
                {{"silent_ms", options_.nats_silence.count()}, {"replica", options_.replica}});
      able_ = false;
      give_up_partitions();
      next_round_ = now;  // tells the others at once
      next_probe_ = now;
      return;
    }
    if (probe_sent_at_ && last_answer_ >= *probe_sent_at_ && !disconnected_since_) {
      log::info("publisher: NATS answers again; takes a share of the partitions",
                {{"replica", options_.replica}});
      able_ = true;
      probe_sent_at_.reset();
      next_round_ = now;
      return;
    }
    if (now < next_probe_) return;
    next_probe_ = now + kProbeInterval;
    probe_sent_at_ = now;
    nats_.publish_async("_outlive.probe", "", member_ + "/probe/" + std::to_string(++probes_), 0,
                        kProbeInterval);
  }

  // ---- reads

  bool room(const App& a) const { return max_held() - a.held >= options_.claim_size / 2; }

  std::vector<int64_t> known_after(const App& a, int64_t cursor) const {
    return std::vector<int64_t>(a.known.upper_bound(cursor), a.known.end());
  }

  void read(App& a, Clock::time_point now) {
    if (a.owned.empty()) a.read_now = false;  // a wake for partitions of others
    if (a.owned.empty() || !room(a)) return;
    const int n = std::min(options_.claim_size, max_held() - a.held);
    const int64_t after = a.horizon.cursor();
    const std::vector<int> parts(a.owned.begin(), a.owned.end());
    const std::vector<std::string> skip(a.detached.begin(), a.detached.end());
    const outbox::Lease lease{member_, epoch_};
    auto result = store_->read(a.id, after, parts, skip, known_after(a, after), n, &lease);
    stats_.claims++;
    if (result.lease_lost) {
      lose_lease(stats_.lost_lease, "the database says the lease ran out");
      return;
    }
    a.next_read = now + options_.poll_interval;
    const bool full = static_cast<int>(result.rows.size()) >= n;
    a.read_now = full;
    a.horizon.advance(result, result.rows.empty() ? 0 : result.rows.back().position, full);
    take(a, std::move(result.rows), now);
  }

  // The poll covers commits whose wake was lost: one statement asks which apps have rows at all,
  // and only those are read (an idle replica of 80 apps sends one statement a second, not 80).
  void poll(Clock::time_point now) {
    std::vector<std::string> due;
    for (auto& a : apps_) {
      if (now < a.next_read || a.read_now) continue;
      a.next_read = now + options_.poll_interval;
      if (room(a) && !a.owned.empty()) due.push_back(a.id);
    }
    if (due.empty()) return;
    for (const auto& id : store_->apps_with_rows(due)) {
      for (auto& a : apps_) {
        if (a.id == id) a.read_now = true;
      }
    }
  }

  void read_keys(App& a, Clock::time_point now) {
    std::vector<std::string> due;
    for (const auto& key : a.detached) {
      const auto& k = a.keys.at(key);
      if (k.in_flight || !k.waiting.empty() || (k.retry_at && now < *k.retry_at)) continue;
      if (!a.owned.count(k.partition)) continue;
      due.push_back(key);
    }
    for (const auto& key : due) {
      if (!room(a)) return;
      auto result =
          store_->read_key(a.id, key, {a.known.begin(), a.known.end()}, options_.claim_size);
      stats_.claims++;
      auto& k = a.keys.at(key);
      k.retry_at.reset();
      if (static_cast<int>(result.rows.size()) < options_.claim_size) {
        k.detached = false;  // every pending row of the key is held now
        a.detached.erase(key);
      }
      take(a, std::move(result.rows), now);
      if (!k.detached && k.waiting.empty() && !k.in_flight) a.keys.erase(key);
    }
  }

  void take(App& a, std::vector<PendingRow>&& rows, Clock::time_point now) {
    std::vector<std::string> touched;
    const SystemTime read_at = std::chrono::system_clock::now();
    for (auto& row : rows) {
      auto& k = a.keys[row.key];
      k.partition = row.partition;
      if (k.retry_at) continue;  // backing off: read again by key when due
      if (row.backoff_ms > 0) {  // failed earlier (here or at a previous owner) and backing off
        detach(a, row.key, k, now + std::chrono::milliseconds(row.backoff_ms));
        continue;
      }
      if (!a.known.insert(row.position).second) continue;
      a.held++;
      stats_.claimed_updates++;
      touched.push_back(row.key);
      k.waiting.push_back(Taken{std::move(row), read_at});
      if (!k.detached && static_cast<int>(k.waiting.size()) >= options_.claim_size)
        detach(a, touched.back(), k, std::nullopt);
    }
    for (const auto& key : touched) send_next(a, key);
  }

  void detach(App& a, const std::string& key, KeyState& k,
              std::optional<Clock::time_point> retry_at) {
    k.detached = true;
    a.detached.insert(key);
    if (!retry_at) return;
    k.retry_at = retry_at;
    for (const auto& t : k.waiting) a.known.erase(t.row.position);
    a.held -= static_cast<int>(k.waiting.size());
    k.waiting.clear();
  }

  template <typename Pred>
  void drop_waiting(App& a, Pred partition_dropped) {
    for (auto it = a.keys.begin(); it != a.keys.end();) {
      auto& k = it->second;
      if (!partition_dropped(k.partition)) {
        ++it;
        continue;
      }
      for (const auto& t : k.waiting) a.known.erase(t.row.position);
      a.held -= static_cast<int>(k.waiting.size());
      k.waiting.clear();
      if (k.in_flight) {
        ++it;
        continue;
      }
      a.detached.erase(it->first);
      it = a.keys.erase(it);
    }
  }

  // ---- publishing

  void send_next(App& a, const std::string& key) {
    auto it = a.keys.find(key);
    if (it == a.keys.end()) return;
    auto& k = it->second;
    if (k.in_flight) return;
    if (!a.owned.count(k.partition)) {  // given up: the next owner reads the rest
      a.detached.erase(key);
      a.keys.erase(it);
      return;
    }
    if (k.waiting.empty()) {
      if (!k.detached) a.keys.erase(it);
      return;
    }
    // The fence: nothing is sent once the lease may have run out (the loop drops what it holds
    // at its next turn); another replica may own the key by now.
    if (epoch_ == 0 || clock_.now() >= lease_until_) {
      refused_ = epoch_ != 0;  // the next turn drops what is held (a renewal may come first)
      return;
    }
    PendingRow row = std::move(k.waiting.front().row);
    const SystemTime read_at = k.waiting.front().read_at;
    k.waiting.pop_front();
    const uint64_t token = ++next_token_;
    char digits[24];
    const auto end = std::to_chars(digits, digits + sizeof digits, row.created_at_us).ptr;
    created_header_[0].second.assign(digits, end);  // reuses the string's buffer
    const auto error = nats_.publish_async(a.subject, row.envelope, row.id, token,
                                           options_.publish_timeout, created_header_);
    if (error) {
      a.held--;
      return fail(a, row, *error);
    }
    k.in_flight = true;
    if (!unanswered_since_) unanswered_since_ = clock_.now();
    const auto sent_at = std::chrono::system_clock::now();
    if (on_sent_) {
      on_sent_(Published{
          a.id,
          row.key,
          0,
          std::chrono::system_clock::time_point(std::chrono::microseconds(row.created_at_us)),
          {},
          read_at,
          sent_at});
    }
    in_flight_.emplace(token, InFlight{&a, std::move(row), clock_.now() + options_.publish_timeout,
                                       read_at, sent_at});
  }

  void handle_result(const topic::PublishResult& result) {
    if (result.answered) {
      last_answer_ = clock_.now();
      unanswered_since_.reset();
    }
    auto it = in_flight_.find(result.token);
    if (it == in_flight_.end()) return;
    InFlight f = std::move(it->second);
    in_flight_.erase(it);
    App& a = *f.app;
    a.keys[f.row.key].in_flight = false;
    a.held--;
    if (!result.ok) return fail(a, f.row, result.error);
    acked_.emplace_back(&a, f.row.position);
    stats_.published++;
    a.stats->published++;
    if (on_published_) {
      on_published_(Published{
          a.id, f.row.key, result.sequence,
          std::chrono::system_clock::time_point(std::chrono::microseconds(f.row.created_at_us)),
          result.acked_at, f.read_at, f.sent_at});
    }
    send_next(a, f.row.key);
  }

  void expire_in_flight(Clock::time_point now) {
    std::vector<uint64_t> expired;
    for (const auto& [token, f] : in_flight_) {
      if (now >= f.deadline) expired.push_back(token);
    }
    for (uint64_t token : expired) {
      auto it = in_flight_.find(token);
      InFlight f = std::move(it->second);
      in_flight_.erase(it);
      nats_.forget(f.row.id);
      f.app->keys[f.row.key].in_flight = false;
      f.app->held--;
      fail(*f.app, f.row,
           "no acknowledgement within " + std::to_string(options_.publish_timeout.count()) + " ms");
    }
  }

  // The key backs off; its later rows wait in the outbox behind the failed one (SPEC 3).
  void fail(App& a, const PendingRow& row, const std::string& error) {
    stats_.publish_errors++;
    a.stats->publish_errors++;
    const auto delay = backoff_delay(row.attempts + 1, options_.backoff_base, options_.backoff_cap);
    failures_.push_back(outbox::FailedPublish{row.position, delay, error});
    a.known.erase(row.position);
    log::warn("publish failed, key backs off", {{"app", a.id},
                                                {"key", row.key},
                                                {"attempts", row.attempts + 1},
                                                {"retry_in_ms", delay.count()},
                                                {"error", error}});
    auto& k = a.keys[row.key];
    k.partition = row.partition;
    detach(a, row.key, k, clock_.now() + delay);
  }

  void forget_in_flight() {
    for (auto& [token, f] : in_flight_) {
      nats_.forget(f.row.id);
      f.app->keys[f.row.key].in_flight = false;
      f.app->held--;
      f.app->known.erase(f.row.position);
    }
    in_flight_.clear();
  }

  // Deletes in groups keep a round trip off every ack, and the settler's thread keeps them off
  // this loop; the rows stay known (skipped by reads) until their delete committed.
  void settle() {
    last_settle_ = clock_.now();
    if (!failures_.empty()) {
      store_->settle({}, failures_);
      failures_.clear();
    }
    if (acked_.empty()) return;
    std::vector<int64_t> positions;
    positions.reserve(acked_.size());
    for (const auto& [a, position] : acked_) {
      deleting_.emplace(position, a);
      positions.push_back(position);
    }
    acked_.clear();
    settler_->add(std::move(positions));
  }

  void forget_deleted(const std::vector<int64_t>& positions) {
    for (int64_t position : positions) {
      auto it = deleting_.find(position);
      if (it == deleting_.end()) continue;  // forgotten when the database was lost
      it->second->known.erase(position);
      deleting_.erase(it);
    }
  }

  void log_waiting() {
    for (const auto& w : store_->waiting(options_.apps, options_.waiting_threshold)) {
      stats_.waiting_logs++;
      log::warn("Live updates wait to be published", {{"app", w.app},
                                                      {"count", w.count},
                                                      {"oldest_age_s", w.oldest_age_s},
                                                      {"replica", options_.replica}});
    }
  }

  static constexpr auto kSettleInterval = std::chrono::milliseconds(20);
  // What stop() waits beyond stop_grace for the last deletes before it cuts them short.
  static constexpr auto kStopMargin = std::chrono::seconds(1);
  static constexpr auto kProbeInterval = std::chrono::seconds(1);

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
  // The lease (sql/005): this run's member name, its epoch (0: none held), until when this loop
  // may publish under it (its own clock: the renewal's send time + ttl - margin).
  std::string member_;
  int64_t epoch_ = 0;
  Clock::time_point lease_until_{};
  bool refused_ = false;  // send_next refused a send under the fence since the last turn
  Clock::time_point next_round_{};
  bool able_ = true;  // false: NATS does not answer, the lease asks for no partitions
  Clock::time_point last_answer_{};  // the last publish NATS answered (an ack or a refusal)
  std::optional<Clock::time_point> unanswered_since_;  // the first send since that answer
  std::optional<Clock::time_point> disconnected_since_;
  Clock::time_point next_probe_{};
  std::optional<Clock::time_point> probe_sent_at_;
  uint64_t probes_ = 0;
  std::unordered_map<uint64_t, InFlight> in_flight_;
  uint64_t next_token_ = 0;
  std::vector<std::pair<App*, int64_t>> acked_;  // not handed to the settler yet
  std::vector<outbox::FailedPublish> failures_;
  std::unordered_map<int64_t, App*> deleting_;  // handed to the settler, not deleted yet
  std::unique_ptr<Settler> settler_;
  Clock::time_point last_settle_{};
  std::vector<std::pair<std::string, std::string>> created_header_{{"Outlive-Created-At", ""}};
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
const AppStats* Publisher::app_stats(const std::string& app) const { return impl_->app_stats(app); }
int Publisher::partitions_owned(const std::string& app) const {
  return impl_->partitions_owned(app);
}
void Publisher::on_sent(std::function<void(const Published&)> callback) {
  impl_->on_sent_ = std::move(callback);
}
double Publisher::heartbeat_age_seconds() const { return impl_->heartbeat_age_seconds(); }

}  // namespace outlive::publisher
