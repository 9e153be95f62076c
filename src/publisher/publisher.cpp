// The publisher's loop (loop.hpp): its thread and stop, the lease rounds and the fence, NATS
// health; the reads and sends are in sending.cpp.
#include "publisher/publisher.hpp"

#include <charconv>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/thread_failures.hpp"
#include "common/thread_name.hpp"
#include "outbox/pg_error.hpp"
#include "publisher/loop.hpp"

namespace outlive::publisher {

Publisher::Impl::Impl(std::string url, topic::Client& nats, Options options, const Clock& clock)
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

void Publisher::Impl::start() {
  nats_.set_publish_handler([this](const topic::PublishResult& r) {
    bool wake = false;
    {
      std::lock_guard lock(mutex_);
      results_.push_back(r);
      // An ack wakes the loop only when something waits for it: the key's next row (urgent_),
      // a failure, the stop. The others are taken at the loop's next turn (a read, or at most
      // kAckInterval later): a wake per ack was the publisher's largest cost with a key per user
      // (docs/CAPACITY.md "A key per user").
      wake = !r.ok || urgent_.erase(r.token) > 0 || stopping_;
    }
    if (wake) signal();
  });
  // A member name of its own per run: a restarted publisher never renews its previous lease.
  std::random_device random;
  char suffix[17];
  std::snprintf(suffix, sizeof suffix, "%08x%08x", random(), random());
  member_ = options_.replica + "/" + suffix;
  term_.drop(clock_.now());
  health_.reset();
  reconnects_seen_ = nats_.reconnects();
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

void Publisher::Impl::stop() {
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

void Publisher::Impl::run() {
  auto next_waiting_check = clock_.now() + options_.waiting_log_interval;
  std::optional<Clock::time_point> stop_deadline;
  for (;;) {
    std::deque<topic::PublishResult> results;
    std::vector<int64_t> deleted;
    bool stopping = false;
    {
      std::lock_guard lock(mutex_);
      results.swap(results_);
      for (const auto& r : results) urgent_.erase(r.token);  // marked after its ack came
      deleted.swap(deleted_);
      stopping = stopping_;
      if (stopping && !stop_seen_) {
        stop_seen_ = true;
        finished_cv_.notify_all();
      }
    }
    const auto now = clock_.now();
    stats_.turns.fetch_add(1, std::memory_order_relaxed);
    try {
      // Every turn, before anything is sent: a connection that died ended its lease, so another
      // replica may own these keys now (publisher: "a replica whose database connection is cut
      // publishes nothing ..."; looking every 100 ms instead let 29 more through under TSan).
      if (store_ && !store_->alive())
        throw Error(Errc::database, "the database closed the connection");
      // Before any result is handled (an ack sends the key's next update): a loop that was
      // frozen past its lease publishes nothing more.
      fence(now);
      for (const auto& r : results) handle_result(r);
      resend_after_reconnect(now);
      forget_deleted(deleted);
      expire_in_flight(now);
      if (stopping) {
        if (!stop_deadline) stop_deadline = now + options_.stop_grace;
        for (auto& a : apps_) a.drop_waiting([](int) { return true; });
        // Renewed through the grace, so the last acks still count; nothing new is read.
        if (store_ && term_.held() && term_.round_due(now)) lease_round();
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
        if (term_.round_due(now)) lease_round();
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
      // The publisher thread's error policy (docs/ARCHITECTURE.md): whatever throws, it gives up
      // its partitions; what it held stays in the outbox and is published again (at least once).
      // Only what an outage does not explain counts as the thread's failure.
      const auto* error = dynamic_cast<const Error*>(&e);
      if (!outbox::from_database(e) && !(error && error->code() == Errc::nats))
        count_thread_failure(ThreadKind::publisher);
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

void Publisher::Impl::wait(Clock::duration timeout) {
  for (const auto& app : wake_.wait(timeout)) {
    for (auto& a : apps_) {
      if (a.id == app) a.read_now = true;
    }
  }
}

Clock::duration Publisher::Impl::next_wait() {
  const auto now = clock_.now();
  Clock::time_point until = std::min(now + std::chrono::milliseconds(100), term_.next_round());
  for (const auto& a : apps_) {
    until = std::min(until, a.read_now && room(a) ? now : a.next_read);
    for (const auto& key : a.detached) {
      const auto& k = a.keys.at(key);
      if (k.retry_at) until = std::min(until, *k.retry_at);
    }
  }
  if (!acked_.empty()) until = std::min(until, last_settle_ + kSettleInterval);
  if (!in_flight_.empty()) until = std::min(until, now + kAckInterval);  // acks that did not wake
  return std::clamp<Clock::duration>(until - now, Clock::duration::zero(),
                                     std::chrono::milliseconds(100));
}

void Publisher::Impl::connect() {
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
  database_outage_.succeeded();
  term_.round_now(clock_.now());
}

void Publisher::Impl::lose_database(const std::string& error) {
  database_outage_.failed(error, {{"replica", options_.replica}});
  if (owns_any()) stats_.lost_database++;
  term_.drop(clock_.now());  // renewed no more; a new connection takes a new lease
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

void Publisher::Impl::lease_round() {
  const auto sent = clock_.now();
  const auto round = store_->lease_round(member_, options_.replica, options_.apps,
                                         options_.lease_ttl, term_.epoch(), health_.able());
  if (term_.held() && round.epoch != term_.epoch())
    lose_lease(stats_.lost_lease, "the lease ran out before it was renewed");
  const bool fresh = term_.renewed(round.epoch, sent, clock_.now());
  heartbeat_us_ = steady_us();
  if (fresh) assign(round.live);
}

void Publisher::Impl::assign(const std::vector<outbox::LeaseMember>& live) {
  for (size_t i = 0; i < apps_.size(); ++i) {
    auto& a = apps_[i];
    std::set<int> mine;
    if (health_.able()) {
      for (int p : outbox::assigned_partitions(live, a.id, member_)) mine.insert(p);
    }
    if (mine == a.owned) continue;
    bool gained = false;
    for (int p : mine) gained = gained || !a.owned.count(p);
    a.owned = std::move(mine);
    // Keys of partitions given up: what waits is dropped, what is in flight finishes (its ack
    // deletes the row; the new owner may publish it too, under the same Nats-Msg-Id).
    a.drop_waiting([&](int p) { return a.owned.count(p) == 0; });
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

void Publisher::Impl::fence(Clock::time_point now) {
  if (term_.fence(now))
    lose_lease(stats_.lost_lease,
               "the lease was not renewed in time (the replica was frozen or "
               "the database did not answer)");
}

void Publisher::Impl::lose_lease(std::atomic<uint64_t>& cause, const std::string& why) {
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
  term_.drop(clock_.now());
}

void Publisher::Impl::end_lease() {
  if (!store_ || !term_.held()) return;
  try {
    store_->lease_end({member_, term_.epoch()});
  } catch (const std::exception& e) {
    log::warn("publisher: ending the lease failed; it runs out by itself",
              {{"error", e.what()}, {"replica", options_.replica}});
  }
  term_.drop(clock_.now());
}

void Publisher::Impl::give_up_partitions() {
  forget_in_flight();
  for (size_t i = 0; i < apps_.size(); ++i) {
    auto& a = apps_[i];
    a.owned.clear();
    a.drop_waiting([](int) { return true; });
    a.horizon.reset();
    a.read_now = true;
    owned_count_[i] = 0;
  }
}

void Publisher::Impl::check_nats(Clock::time_point now) {
  switch (health_.check(now, nats_.connected())) {
    case NatsHealth::Verdict::none:
      return;
    case NatsHealth::Verdict::give_up:
      if (owns_any()) stats_.lost_nats++;
      log::warn("publisher: NATS does not answer; gives its partitions up until it does",
                {{"silent_ms", options_.nats_silence.count()}, {"replica", options_.replica}});
      give_up_partitions();
      term_.round_now(now);  // tells the others at once
      return;
    case NatsHealth::Verdict::able_again:
      log::info("publisher: NATS answers again; takes a share of the partitions",
                {{"replica", options_.replica}});
      term_.round_now(now);
      return;
    case NatsHealth::Verdict::probe:
      nats_.publish_async("_outlive.probe", "", member_ + "/probe/" + std::to_string(++probes_), 0,
                          NatsHealth::kProbeInterval);
      return;
  }
}

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
