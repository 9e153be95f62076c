// The publisher's sending half (loop.hpp): reads of the owned partitions and of detached keys,
// one update in flight per key, acks handed to the settler, failures backed off.
#include <algorithm>
#include <charconv>
#include <chrono>

#include "common/log.hpp"
#include "publisher/backoff.hpp"
#include "publisher/loop.hpp"

namespace outlive::publisher {

void Publisher::Impl::read(App& a, Clock::time_point now) {
  if (a.owned.empty()) a.read_now = false;  // a wake for partitions of others
  if (a.owned.empty() || !room(a)) return;
  const int n = std::min(options_.claim_size, max_held() - a.held);
  const int64_t after = a.horizon.cursor();
  const std::vector<int> parts(a.owned.begin(), a.owned.end());
  const std::vector<std::string> skip(a.detached.begin(), a.detached.end());
  const outbox::Lease lease{member_, term_.epoch()};
  auto result = store_->read(a.id, after, parts, skip, a.known_after(after), n, &lease);
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

void Publisher::Impl::poll(Clock::time_point now) {
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

void Publisher::Impl::read_keys(App& a, Clock::time_point now) {
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

void Publisher::Impl::take(App& a, std::vector<PendingRow>&& rows, Clock::time_point now) {
  std::vector<std::string> touched;
  const SystemTime read_at = std::chrono::system_clock::now();
  for (auto& row : rows) {
    auto& k = a.keys[row.key];
    k.partition = row.partition;
    if (k.retry_at) continue;  // backing off: read again by key when due
    if (row.backoff_ms > 0) {  // failed earlier (here or at a previous owner) and backing off
      a.detach(row.key, k, now + std::chrono::milliseconds(row.backoff_ms));
      continue;
    }
    if (!a.known.insert(row.position).second) continue;
    a.held++;
    stats_.claimed_updates++;
    touched.push_back(row.key);
    k.waiting.push_back(Taken{std::move(row), read_at});
    if (k.in_flight && k.waiting.size() == 1) mark_urgent(k.token);
    if (!k.detached && static_cast<int>(k.waiting.size()) >= options_.claim_size)
      a.detach(touched.back(), k, std::nullopt);
  }
  for (const auto& key : touched) send_next(a, key);
}

void Publisher::Impl::send_next(App& a, const std::string& key) {
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
  if (!term_.may_send(clock_.now())) return;
  PendingRow row = std::move(k.waiting.front().row);
  const SystemTime read_at = k.waiting.front().read_at;
  k.waiting.pop_front();
  const uint64_t token = ++next_token_;
  const uint64_t reconnects = nats_.reconnects();  // before: a reconnect meanwhile resends it
  const auto error = nats_.publish_async(a.subject, row.envelope, row.id, token,
                                         options_.publish_timeout, created_header_for(row));
  if (error) {
    a.held--;
    return fail(a, row, *error);
  }
  k.in_flight = true;
  k.token = token;
  if (!k.waiting.empty()) mark_urgent(token);
  health_.sent(clock_.now());
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
                                     read_at, sent_at, reconnects});
}

const std::vector<std::pair<std::string, std::string>>& Publisher::Impl::created_header_for(
    const PendingRow& row) {
  char digits[24];
  const auto end = std::to_chars(digits, digits + sizeof digits, row.created_at_us).ptr;
  created_header_[0].second.assign(digits, end);  // reuses the string's buffer
  return created_header_;
}

void Publisher::Impl::handle_result(const topic::PublishResult& result) {
  if (result.answered) health_.answered(clock_.now());
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

void Publisher::Impl::expire_in_flight(Clock::time_point now) {
  std::vector<uint64_t> expired;
  for (const auto& [token, f] : in_flight_) {
    if (now >= f.deadline) expired.push_back(token);
  }
  const std::string error =
      "no acknowledgement within " + std::to_string(options_.publish_timeout.count()) + " ms";
  for (uint64_t token : expired) give_up_in_flight(token, error);
}

void Publisher::Impl::resend_after_reconnect(Clock::time_point now) {
  const uint64_t reconnects = nats_.reconnects();
  if (reconnects == reconnects_seen_) return;
  reconnects_seen_ = reconnects;
  if (!term_.may_send(now)) return;  // the fence: they expire instead
  std::vector<std::pair<uint64_t, std::string>> failed;
  uint64_t resent = 0;
  for (auto& [token, f] : in_flight_) {
    if (f.reconnects == reconnects || now >= f.deadline) continue;  // (expire_in_flight's)
    f.reconnects = reconnects;
    // Within the first send's deadline: the earlier copy's timeout comes no later than this one's.
    const auto left = std::max(std::chrono::milliseconds(1),
                               std::chrono::ceil<std::chrono::milliseconds>(f.deadline - now));
    auto error =
        nats_.publish_async(f.app->subject, f.row.envelope, f.row.id, token, left, created_header_for(f.row));
    if (error) {
      failed.emplace_back(token, std::move(*error));
      continue;
    }
    resent++;
    health_.sent(now);
  }
  stats_.resent += resent;
  if (resent > 0) {
    log::info("publisher: NATS reconnected; sends again what it had not answered",
              {{"count", resent}, {"replica", options_.replica}});
  }
  for (auto& [token, error] : failed) give_up_in_flight(token, error);
}

void Publisher::Impl::give_up_in_flight(uint64_t token, const std::string& error) {
  auto it = in_flight_.find(token);
  InFlight f = std::move(it->second);
  in_flight_.erase(it);
  nats_.forget(f.row.id);
  unmark_urgent(token);
  f.app->keys[f.row.key].in_flight = false;
  f.app->held--;
  fail(*f.app, f.row, error);
}

void Publisher::Impl::fail(App& a, const PendingRow& row, const std::string& error) {
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
  a.detach(row.key, k, clock_.now() + delay);
}

void Publisher::Impl::forget_in_flight() {
  {
    std::lock_guard lock(mutex_);
    urgent_.clear();
  }
  for (auto& [token, f] : in_flight_) {
    nats_.forget(f.row.id);
    f.app->keys[f.row.key].in_flight = false;
    f.app->held--;
    f.app->known.erase(f.row.position);
  }
  in_flight_.clear();
}

void Publisher::Impl::settle() {
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

void Publisher::Impl::forget_deleted(const std::vector<int64_t>& positions) {
  for (int64_t position : positions) {
    auto it = deleting_.find(position);
    if (it == deleting_.end()) continue;  // forgotten when the database was lost
    it->second->known.erase(position);
    deleting_.erase(it);
  }
}

void Publisher::Impl::log_waiting() {
  for (const auto& w : store_->waiting(options_.apps, options_.waiting_threshold)) {
    stats_.waiting_logs++;
    log::warn("Live updates wait to be published", {{"app", w.app},
                                                    {"count", w.count},
                                                    {"oldest_age_s", w.oldest_age_s},
                                                    {"replica", options_.replica}});
  }
}

}  // namespace outlive::publisher
