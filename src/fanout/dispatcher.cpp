#include "fanout/dispatcher.hpp"

#include <algorithm>
#include <utility>

#include "access/decider.hpp"
#include "common/fault.hpp"
#include "common/log.hpp"
#include "common/thread_failures.hpp"
#include "common/thread_name.hpp"
#include "fanout/authorize_batches.hpp"
#include "fanout/frame.hpp"

namespace outlive::fanout {

Dispatcher::Dispatcher(std::string app, const std::map<std::string, config::Channel>& channels,
                       Hub& hub, access::Decider& decider, DispatcherOptions options,
                       DeliveryHost& host)
    : app_(std::move(app)),
      channels_(channels),
      hub_(hub),
      host_(host),
      decider_(decider),
      options_(options),
      round_(app_, hub, host),
      ticks_(app_, identity_, hub, host, options.progress_interval, options.collection_refresh) {}

Dispatcher::~Dispatcher() { stop(); }

void Dispatcher::start(topic::TopicIdentity identity) {
  if (thread_.joinable()) return;
  identity_ = std::move(identity);
  ticks_.start(std::chrono::steady_clock::now());
  thread_ = std::thread([this] {
    name_this_thread("outlive-fanout");
    run();
  });
}

void Dispatcher::stop() {
  {
    std::lock_guard lock(queue_->mutex);
    queue_->stop = true;
  }
  queue_->wake.notify_all();
  queue_->has_room.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Dispatcher::push(const window::UpdatePtr& update) {
  auto& q = *queue_;
  std::unique_lock lock(q.mutex);
  q.has_room.wait(lock, [&] { return q.stop || q.waiting < options_.max_waiting; });
  if (q.stop) return;
  q.incoming.push_back(update);
  ++q.waiting;
  q.wake.notify_one();
}

size_t Dispatcher::waiting() const {
  std::lock_guard lock(queue_->mutex);
  return queue_->waiting;
}

void Dispatcher::run() {
  auto& q = *queue_;
  std::vector<window::UpdatePtr> batch;
  std::vector<Answer> answers;
  for (;;) {
    batch.clear();
    answers.clear();
    auto deadline = abandoned_through_ > 0 ? std::chrono::steady_clock::now() : ticks_.next();
    for (const auto& [key, lane] : lanes_) {
      if (lane.asking > 0) deadline = std::min(deadline, lane.deadline);
    }
    {
      std::unique_lock lock(q.mutex);
      const auto ready = [&] { return q.stop || !q.incoming.empty() || !q.answers.empty(); };
      q.wake.wait_until(lock, deadline, ready);
      if (q.stop) return;
      answers.swap(q.answers);
      while (!q.incoming.empty() && batch.size() < options_.round_size) {
        batch.push_back(std::move(q.incoming.front()));
        q.incoming.pop_front();
      }
    }
    size_t next = 0;
    try {
      work(answers, batch, next);
    } catch (const std::exception& e) {
      recover(e.what(), batch, next);
    } catch (...) {
      recover("unknown exception", batch, next);
    }
  }
}

void Dispatcher::work(std::vector<Answer>& answers, const std::vector<window::UpdatePtr>& batch,
                      size_t& next) {
  if (abandoned_through_ > 0) resync_abandoned();
  for (const auto& a : answers) apply(a);
  answers.clear();
  const auto now = std::chrono::steady_clock::now();
  expire(now);
  for (; next < batch.size(); ++next) {
    fault::hit(fault::Site::dispatcher);  // (tests only: common/fault.hpp)
    take(batch[next]);
  }
  run_endings();
  post_round();
  ticks_.run(now);  // between rounds: it sees this round's hand-off
}

// Nothing here can tell how far the failed pass got: the lanes' updates may be handed to some of
// their readers and not to others. So the delivery of everything taken so far starts over from
// the readers' side: each live reader resyncs the subscriptions short of the abandoned position
// (SPEC 1, no silent gap; a reader catching up reads those updates from the window). The
// process, the app's other updates and its sockets go on.
void Dispatcher::recover(const std::string& what, std::vector<window::UpdatePtr>& batch,
                         size_t next) {
  count_thread_failure(ThreadKind::dispatcher);
  uint64_t through = std::max(abandoned_through_, taken_through_);
  if (next < batch.size()) through = std::max(through, batch[next]->position);
  log::limited(log::Level::error, "The delivery failed; its live readers resync",
               {{"app", app_}, {"through", through}, {"error", what}});
  for (auto& [key, lane] : lanes_) {
    for (const auto& item : lane.items) {
      if (item.update->access) --access_pending_;
    }
  }
  lanes_.clear();  // answers still out for them find no lane and are dropped
  // (endings_ stay: their readers were marked and are ended once the round is out)
  taken_through_ = through;
  hand_offs_.abandon_through(through);
  abandoned_through_ = through;
  {
    auto& q = *queue_;
    std::lock_guard lock(q.mutex);
    // The batch's later updates are taken again, first; the failed one is the gap.
    for (size_t i = batch.size(); i > next + 1; --i) q.incoming.push_front(batch[i - 1]);
    q.waiting = q.incoming.size();
  }
  batch.clear();
  queue_->has_room.notify_all();
}

void Dispatcher::resync_abandoned() {
  // (a reader whose part holds deliveries of the failed pass receives them first: harmless, the
  // resync follows)
  for (const auto& reader : hub_.readers()) {
    round_.part_of(reader).push_back(Delivery{nullptr, {}, false, abandoned_through_});
  }
  post_round();
  abandoned_through_ = 0;
}

void Dispatcher::take(const window::UpdatePtr& update) {
  taken_through_ = update->position;
  hand_offs_.taken(update->position);
  std::shared_ptr<void> forgotten;
  if (update->access) {
    // Decisions of the key made before it are forgotten now: nothing of the key after it goes
    // out before its readers were checked again.
    ++access_pending_;
    forgotten = decider_.decisions().forget(update->key);
    last_access_position_ = update->position;
  }
  if (update->lost_through > 0) {
    // Ahead of this update in every reader's round (whatever key it follows): the positions lost
    // may have held any key's updates.
    for (const auto& reader : hub_.readers()) {
      round_.part_of(reader).push_back(Delivery{nullptr, {}, false, update->lost_through});
    }
  }
  if (update->kind == window::Kind::disconnect) return take_disconnect(update);
  if (update->kind == window::Kind::gap) return release(update->position);  // (its lost_through)
  lanes_[update->key].items.push_back(Item{
      update, hub_.targets(update->key, update->position), {}, false, std::move(forgotten), {}});
  run_lane(update->key);
}

void Dispatcher::release(uint64_t position) {
  hand_offs_.handed(position);  // nothing of it is handed to a reader
  {
    std::lock_guard lock(queue_->mutex);
    --queue_->waiting;
  }
  queue_->has_room.notify_one();
}

void Dispatcher::take_disconnect(const window::UpdatePtr& update) {
  release(update->position);
  const window::Disconnect& d = *update->disconnect;
  if (!disconnects_seen_.insert(d.id).second) return;
  disconnects_seen_order_.push_back(d.id);
  if (disconnects_seen_order_.size() > 1024) {
    disconnects_seen_.erase(disconnects_seen_order_.front());
    disconnects_seen_order_.pop_front();
  }
  host_.on_disconnect(app_, d);
  Ending ending{update->position, d.reason, {}};
  for (auto& reader : hub_.readers()) {
    if (!reader->viewed_by(d.viewer)) continue;
    reader->end_after(update->position);
    ending.readers.push_back(std::move(reader));
  }
  log::info("A disconnect ends the viewer's sockets", {{"app", app_},
                                                       {"viewer", d.viewer},
                                                       {"reason", d.reason},
                                                       {"sockets", ending.readers.size()},
                                                       {"position", update->position}});
  if (!ending.readers.empty()) endings_.push_back(std::move(ending));
}

void Dispatcher::run_endings() {
  while (!endings_.empty() && endings_.front().position <= handed_through()) {
    post_round();  // what they were handed before the disconnect, first
    host_.disconnect(std::move(endings_.front().readers), endings_.front().reason);
    endings_.pop_front();
  }
}

void Dispatcher::run_lane(const std::string& key) {
  auto it = lanes_.find(key);
  if (it == lanes_.end()) return;
  Lane& lane = it->second;
  while (!lane.items.empty() && lane.asking == 0) {
    Item& item = lane.items.front();
    if (!item.decided) {
      // Decisions are read once per follower: one that expires while others are asked is never
      // mistaken for a denial.
      item.decided = true;
      const bool missing = decide(key, item);
      if (missing) {
        ask(key, lane, item);
        if (lane.asking > 0) return;
      }
    }
    hand_off(item);
    const bool access = item.update->access;
    const std::shared_ptr<void> forgotten = std::move(item.forgotten);  // freed after the round
    lane.items.pop_front();
    {
      std::lock_guard lock(queue_->mutex);
      --queue_->waiting;
    }
    queue_->has_room.notify_one();
    if (access) {
      // The access update's round goes out before collections run keys() again.
      post_round();
      --access_pending_;
      ticks_.refresh_collections();
    }
  }
  if (lane.items.empty() && lane.asking == 0) lanes_.erase(it);
}

// A hot key's next update finds the same followers and the same decisions (DecisionMemo).
bool Dispatcher::decide(const std::string& key, Item& item) {
  const auto now = access::Decisions::Clock::now();
  auto& decisions = decider_.decisions();
  const auto stamp = decisions.stamp(key);  // before the reads: a change meanwhile shows next time
  const auto& targets = *item.targets;
  item.pending.reserve(targets.size());
  if (const auto* memo = memo_.find(key, item.targets, stamp, now)) {
    for (size_t j = 0; j < targets.size(); ++j) {
      Pending& p = item.pending.emplace_back(Pending{&targets[j], {}});
      for (size_t i = 0; i < targets[j].channels.size(); ++i)
        p.access.allowed.emplace_back(*targets[j].channels[i], ((*memo)[j] >> i) & 1u);
    }
    return false;
  }
  auto expires = access::Decisions::Clock::time_point::max();
  // None held (the key's access update forgot them): every follower is asked, none looked up.
  const DecisionLookup lookup{decisions, app_, now, !decisions.holds(key), &expires};
  bool missing = false;
  for (const auto& t : targets) {
    Pending& p = item.pending.emplace_back(Pending{&t, {}});
    read_access(lookup, key, t.channels, t.viewer->id, p.access);
    missing = missing || p.access.missing != 0;
  }
  if (missing || !DecisionMemo::fits(targets)) return missing;
  std::vector<uint32_t> allowed;
  allowed.reserve(targets.size());
  for (const auto& p : item.pending) {
    uint32_t bits = 0;
    for (size_t i = 0; i < p.access.allowed.size(); ++i)
      bits |= uint32_t(p.access.allowed[i].second) << i;
    allowed.push_back(bits);
  }
  memo_.keep(key, item.targets, stamp, expires, std::move(allowed));
  return false;
}

void Dispatcher::ask(const std::string& key, Lane& lane, Item& item) {
  lane.asking = 0;
  lane.ask_id = ++next_ask_;
  lane.deadline = std::chrono::steady_clock::now() + options_.check_timeout;
  const uint64_t generation = decider_.decisions().generation(key);
  const auto send = [&](uint32_t n, AuthorizeBatch&& b) {
    ++lane.asking;
    std::weak_ptr<Queue> weak = queue_;
    auto done = [weak, key, ask_id = lane.ask_id, n](access::AuthorizeAnswer a) mutable {
      auto q = weak.lock();
      if (!q) return;
      {
        std::lock_guard lock(q->mutex);
        q->answers.push_back(Answer{key, ask_id, n, a.ok, std::move(a.allowed)});
      }
      q->wake.notify_one();
    };
    auto ch = channels_.find(*b.channel);
    if (ch == channels_.end()) return done(access::AuthorizeAnswer{});
    decider_.authorize(app_, *b.channel, ch->second, key, std::move(b.ids), std::move(b.viewers),
                       generation, std::move(done));
  };
  AuthorizeBatches batches(options_.authorize_batch, item.pending.size(), lane.asked, send);
  for (uint32_t index = 0; index < item.pending.size(); ++index) {
    const Pending& p = item.pending[index];
    for (uint32_t i = 0; i < p.access.allowed.size() && i < 32; ++i) {
      if (p.access.missing & (1u << i))
        batches.add(AskedDecision{index, i}, p.target->channels[i], *p.target->viewer);
    }
  }
  batches.finish();
}

void Dispatcher::apply(const Answer& answer) {
  auto it = lanes_.find(answer.key);
  if (it == lanes_.end() || it->second.ask_id != answer.ask_id || it->second.asking == 0) return;
  Lane& lane = it->second;
  Item& item = lane.items.front();
  for (const AskedDecision& a : lane.asked.at(answer.batch)) {
    Pending& p = item.pending[a.follower];
    const uint32_t bit = 1u << a.channel;
    if (!(p.access.missing & bit)) continue;
    if (answer.ok) {
      p.access.allowed[a.channel].second = answer.allowed.count(p.target->viewer->id) > 0;
    } else {
      p.access.broken = true;  // nothing is skipped: the tab reconnects and resumes (1011)
    }
    p.access.missing &= ~bit;
  }
  if (--lane.asking > 0) return hand_off_answered(item, lane.asked[answer.batch]);
  lane.asked.clear();
  run_lane(answer.key);
}

void Dispatcher::expire(std::chrono::steady_clock::time_point now) {
  std::vector<std::string> expired;
  for (auto& [key, lane] : lanes_) {
    if (lane.asking == 0 || lane.deadline > now) continue;
    log::warn("authorize timed out", {{"app", app_}, {"key", key}});
    for (auto& p : lane.items.front().pending) {
      if (p.access.missing) p.access.broken = true;
      p.access.missing = 0;
    }
    lane.asking = 0;
    lane.ask_id = 0;  // a late answer is ignored
    lane.asked.clear();
    expired.push_back(key);
  }
  for (const auto& key : expired) run_lane(key);
}

void Dispatcher::deliver(Item& item, Pending& p, bool early) {
  if (std::exchange(p.handed, true)) return;
  const auto& u = item.update;
  // Before any reader is looked at: a reader that rejoins live meanwhile finds it handed off in
  // the window, or receives it live (HandOffs).
  if (!item.out) hand_offs_.handed(u->position);
  // The frame's cursor never passes an update of another key still waiting for its authorize():
  // a tab that resumes from it receives that one (and this one again, at least once). Computed at
  // the first hand-off and kept: lanes only move forward, so it stays safe.
  const auto clamp = [&] {
    CursorClamp c(early);
    for (const auto& [key, lane] : lanes_) {
      if (key != u->key && !lane.items.empty()) c.below(lane.items.front().update->position);
    }
    return c;
  };
  round_.part_of(p.target->reader)
      .push_back(reader_frame(u, std::move(p.access), clamp, identity_, item.out));
}

void Dispatcher::hand_off_answered(Item& item, const std::vector<AskedDecision>& asked) {
  for (const AskedDecision& a : asked) {
    Pending& p = item.pending[a.follower];
    if (p.access.missing == 0) deliver(item, p, true);
  }
}

void Dispatcher::hand_off(Item& item) {
  const auto& u = item.update;
  if (item.pending.empty()) {
    hand_offs_.handed(u->position);
    return;
  }
  for (auto& p : item.pending) deliver(item, p, false);
  if (u->created_at_us > 0) {
    const auto now_us = std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
    round_.handed_after(static_cast<double>(now_us - u->created_at_us) / 1e6);
  }
}

uint64_t Dispatcher::handed_through() const {
  uint64_t through = taken_through_;
  for (const auto& [key, lane] : lanes_) {
    if (!lane.items.empty()) through = std::min(through, lane.items.front().update->position - 1);
  }
  return through;
}

}  // namespace outlive::fanout
