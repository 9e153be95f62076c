// Delivery to one socket: live from the dispatcher's rounds, or caught up from the window.
//
// Live: the dispatcher hands the socket its part of each round through the mailbox; one handler is
// posted while it is empty, so rounds that pile up while the io threads are behind leave in one
// system call. A socket whose send buffer (256 KiB) or mailbox is full leaves live delivery: the
// dispatcher skips it from then on, and the socket reads what it has not been sent from the window,
// in topic order, up to 512 KiB waiting, as the tab reads (SPEC 5.7). It takes only updates the
// dispatcher has started to hand off (fanout::HandOffs), deciding access itself; an
// update of a key not handed off yet blocks that key for this pass and will arrive live. When the
// pass reaches the window's end the socket turns live again under the mailbox lock and makes one
// more pass: whatever was handed off between the two is sent by the pass, whatever after it arrives
// live; positions per key drop what both bring.
#include "session/feed.hpp"

#include "fanout/frame.hpp"
#include "tab/protocol.hpp"

namespace outlive::session {

namespace {
constexpr size_t kScanBatch = 64;
}

namespace {
const FeedSource kUnbound{};  // no window: an unbound feed sends nothing
}  // namespace

Feed::Feed(FeedSink& sink, FeedOwner& owner, Subscriptions& subs)
    : sink_(sink), owner_(owner), subs_(subs), source_(&kUnbound) {}

bool Feed::offer(std::vector<fanout::Delivery>&& deliveries, uint64_t through) {
  std::lock_guard lock(mailbox_mutex_);
  if (!live_) return false;  // catching up: these are in the window
  if (mailbox_.size() + deliveries.size() > source_->max_mailbox) {
    // The socket is behind: it reads the rest from the window (bounded, nothing queues here).
    live_ = false;
    mailbox_.clear();
    owner_.unsettle();
  } else if (mailbox_.empty()) {
    mailbox_ = std::move(deliveries);
  } else {
    for (auto& d : deliveries) mailbox_.push_back(std::move(d));
  }
  mailbox_through_ = std::max(mailbox_through_, through);
  return !std::exchange(mailbox_posted_, true);
}

void Feed::take_mailbox() {
  std::vector<fanout::Delivery> batch;
  bool live;
  uint64_t through;
  {
    std::lock_guard lock(mailbox_mutex_);
    batch.swap(mailbox_);
    mailbox_posted_ = false;
    live = live_;
    through = std::exchange(mailbox_through_, 0);
  }
  if (sink_.closing() || !owner_.viewer()) return;
  if (!live && !catching_up_) start_catch_up(subs_.lowest_position());
  if (catching_up_) return pump();
  frames_in_batch_ = 0;
  sink_.cork();
  for (const auto& d : batch) {
    if (d.lost_through > 0) {
      resync_lost(d.lost_through);
      continue;
    }
    if (d.broken) {
      sink_.close(ws::kInternal, "access check failed");  // the tab resumes from its cursor
      break;
    }
    if (sink_.queued_bytes() >= source_->send_buffer_bytes) {
      start_catch_up(subs_.lowest_position());
      break;
    }
    deliver(d);
  }
  if (frames_in_batch_ > 0) owner_.count_frames(frames_in_batch_);
  sink_.uncork();
  if (catching_up_) return pump();
  settle_live(through);
}

void Feed::deliver(const fanout::Delivery& d) { deliver(*d.out, d.allowed); }

void Feed::deliver(const fanout::OutgoingUpdate& out, const fanout::ChannelAccess& allowed) {
  const window::Update& u = *out.update;
  if (u.position > end_after_.load(std::memory_order_acquire)) return;  // a disconnect ends it
  // Scratch of the io thread, not of the socket: an idle socket keeps none of it.
  thread_local Effect effect_;
  effect_.clear();
  subs_.apply(u, out.cursor, allowed, effect_);
  if (!effect_.applied) return;
  for (auto& f : effect_.frames) sink_.send(ws::Frame::text(std::move(f)));
  for (const auto& [channel, key] : effect_.dropped) owner_.unfollow(channel, key);
  for (const auto& id : effect_.ended) owner_.end_subscription(id);
  if (!effect_.update_ids.empty() && out.tail) {
    // The head changes only with the socket's subscriptions: built once for a set of ids.
    if (effect_.update_ids != head_ids_ || !head_) {
      head_ids_ = effect_.update_ids;
      head_ = std::make_shared<const std::string>(tab::frames::update_head(head_ids_));
    }
    sink_.send(ws::Frame::update(head_, out.tail));
    ++frames_in_batch_;
  }
  // An update only filters refused tells the tab nothing: its position reaches the tab in a
  // progress frame, which the cursor moved here would hold back (and settle the socket past it).
  if (effect_.filtered && effect_.update_ids.empty() && effect_.frames.empty()) return;
  advance_cursor(u.position);
  if (out.tail && effect_.update_ids.size() == subs_.size()) {
    oldest_cursor_position_ = std::max(oldest_cursor_position_, out.cursor_position);
  }
}

void Feed::start_catch_up(uint64_t from) {
  {
    std::lock_guard lock(mailbox_mutex_);
    live_ = false;
    mailbox_.clear();
    owner_.unsettle();
  }
  if (!catching_up_) {
    catching_up_ = true;
    scan_ = from;
    blocked_ = {};
    owner_.catch_up_started();
  } else {
    scan_ = std::min(scan_, from);
  }
  owner_.feed_changed();
}

void Feed::stop() {
  {
    std::lock_guard lock(mailbox_mutex_);
    live_ = false;
    mailbox_.clear();
  }
  catching_up_ = false;
  if (hand_off_timer_) hand_off_timer_->cancel();
}

void Feed::wait_for_hand_off() {
  if (waiting_hand_off_) return;
  waiting_hand_off_ = true;
  // Made the first time it is needed: most sockets never wait for a hand-off (idle memory).
  if (!hand_off_timer_)
    hand_off_timer_ = std::make_unique<boost::asio::steady_timer>(owner_.feed_executor());
  hand_off_timer_->expires_after(std::chrono::milliseconds(5));
  hand_off_timer_->async_wait([this, keep = owner_.keep_alive()](boost::system::error_code ec) {
    waiting_hand_off_ = false;
    if (!ec) pump();
  });
}

void Feed::on_room() {
  if (catching_up_ && sink_.queued_bytes() < source_->replay_send_buffer_bytes / 2) pump();
}

// Not re-entered: a write that completes inside a pass (uncork, or 64 KiB queued while corked)
// makes room and asks for a pass, which runs after this one instead of inside it.
void Feed::pump() {
  if (pumping_) {
    pump_again_ = true;
    return;
  }
  pumping_ = true;
  do {
    pump_again_ = false;
    if (!catching_up_ || sink_.closing() || awaiting_decision_) break;
    frames_in_batch_ = 0;
    sink_.cork();
    if (scan()) rejoin();
    if (frames_in_batch_ > 0) owner_.count_frames(frames_in_batch_);
    sink_.uncork();
  } while (pump_again_);
  pumping_ = false;
  if (!catching_up_) owner_.feed_changed();
}

bool Feed::scan() {
  const window::Window* w = source_->window;
  if (!w) return true;
  const size_t limit = source_->replay_send_buffer_bytes;
  for (;;) {
    if (sink_.closing()) return false;
    if (sink_.queued_bytes() >= limit) return false;
    auto batch = w->since(scan_, kScanBatch);
    if (!batch) {
      // Decided once everything queued before it has left: a `resync` queued behind a full
      // buffer would name a head the window has moved past by the time the tab reads it, and the
      // tab would reload twice (issue 47). on_room() asks again at each write as the queue empties.
      if (sink_.queued_bytes() > 0) return false;
      resync_behind();
      continue;
    }
    if (batch->empty()) return true;
    for (const auto& u : *batch) {
      if (sink_.queued_bytes() >= limit || sink_.closing()) return false;
      if (subs_.wants(*u) && !is_blocked(u->key)) {
        if (!source_->hand_offs->handed_off(u->position)) {
          if (u->position <= window_only_through_) {
            wait_for_hand_off();  // it will not come live to this socket
            return false;
          }
          blocked_.emplace_back(u->key, u->position);
        } else {
          fanout::Access access;
          if (!decide(*u, access)) return false;
          // As live: the cursor never passes an update of a key this pass has not sent yet.
          const auto clamp = [&] {
            fanout::CursorClamp c;
            for (const auto& [key, position] : blocked_) c.below(position);
            return c;
          };
          // This reader's alone: built on the stack, not shared (no allocation per frame).
          deliver(fanout::reader_frame_value(u, clamp, source_->identity), access.allowed);
        }
      }
      scan_ = u->position;
    }
  }
}

bool Feed::decide(const window::Update& u, fanout::Access& access) {
  const fanout::DecisionLookup lookup{
      *source_->decisions, source_->app, access::Decisions::Clock::now(), false, nullptr,
      answered_.get()};
  const auto channels = subs_.channels_of(u.key);
  const size_t missing = fanout::read_access(lookup, u.key, channels, owner_.viewer()->id, access);
  if (missing != fanout::kNoneMissing) {
    ask_decision(u.key, channels[missing]);
    return false;
  }
  answered_.reset();
  return true;
}

// The pass reached the window's end: live again, then one more pass for what was handed off in
// between. If that pass cannot finish (buffer full, a decision missing) the socket stays behind.
bool Feed::rejoin() {
  {
    std::lock_guard lock(mailbox_mutex_);
    live_ = true;
  }
  for (const auto& [key, position] : blocked_) scan_ = std::min(scan_, position - 1);
  blocked_ = {};
  if (!scan()) {
    std::lock_guard lock(mailbox_mutex_);
    live_ = false;
    mailbox_.clear();
    catching_up_ = true;  // still behind: the next pass goes on from here
    return false;
  }
  catching_up_ = false;
  blocked_ = {};
  return true;
}

// The socket's position fell out of the window: the subscriptions behind it reload and are live
// from the head; the pass goes on from the lowest position left.
void Feed::resync_behind() {
  const uint64_t oldest = source_->window->oldest_replayable();
  const uint64_t head = source_->window->head();
  resync_short_of(oldest, head);
  for (auto it = blocked_.begin(); it != blocked_.end();) {
    it = it->second <= oldest ? blocked_.erase(it) : std::next(it);
  }
  scan_ = std::max(subs_.empty() ? head : subs_.lowest_position(), oldest);
}

// The topic lost positions up to `through` before the replica read them: what they held cannot
// be sent, so every subscription short of them reloads and is live from there.
void Feed::resync_lost(uint64_t through) { resync_short_of(through, through); }

// Every subscription short of `position` is told `resync` (reason window) with a cursor at
// `resume` and goes on from there; the socket stays open.
void Feed::resync_short_of(uint64_t position, uint64_t resume) {
  const std::string cursor = cursor_at(resume);
  for (const auto& id : subs_.behind(position)) {
    sink_.send(ws::Frame::text(tab::frames::resync(id, cursor, "window")));
    subs_.bring_to(id, resume);
  }
  advance_cursor(resume);
}

void Feed::ask_decision(const std::string& key, const std::string& channel) {
  awaiting_decision_ = true;
  owner_.ask_decision(key, channel, [this, key, channel](bool allowed) {
    awaiting_decision_ = false;
    answered_ = std::make_unique<fanout::Answered>(fanout::Answered{key, channel, allowed});
    pump();
  });
}

// --- progress ---------------------------------------------------------------------------------

// Everything of the app up to `position` has been handed off, so offered to this socket. Its
// mailbox is taken first: what waits there (a round offered before the tick, whose handler runs
// after this one) is delivered before the positions move. Then a socket still live has received
// all of it and brings every key it follows there; a socket catching up is only as far as its
// pass, and one that just left live delivery (its mailbox overflowed) starts its pass from where
// it is.
void Feed::on_progress(const fanout::ProgressTick& tick) {
  const uint64_t position = tick.position;
  if (sink_.closing() || subs_.empty()) return;
  // Even with no round posted: for a socket catching up this is also a pass once a second. With
  // it taken only when a round was posted, 5 of 300 sockets of the progress-burst test (replay:)
  // once stopped for good on a loaded machine, so some wake-up of the pass can still go missing.
  take_mailbox();
  if (sink_.closing()) return;
  bool live;
  {
    std::lock_guard lock(mailbox_mutex_);
    live = live_;
  }
  if (!catching_up_ && !live) return;  // overflowed meanwhile: the posted take_mailbox() goes on
  // A reader marked to end (an events.disconnect) never hears of a position past its end: the
  // updates after it were dropped, and a tab resuming from such a cursor would skip them.
  const uint64_t end = end_after_.load(std::memory_order_acquire);
  const uint64_t safe = std::min(catching_up_ ? safe_position() : position, end);
  // Only when needed (SPEC 5.3 says at most once a second): once the oldest cursor the tab holds
  // is progress_after_updates behind, so it never leaves the window, or after progress_quiet.
  // Never behind a cursor the tab was told.
  const auto now = std::chrono::steady_clock::now();
  const bool due = safe - oldest_cursor_position_ >= source_->progress_after_updates ||
                   (now - quiet_since_ >= source_->progress_quiet && safe > last_cursor_position_);
  // Counted in the ticks' own times, a second apart: with the io thread's time, a tick handled a
  // few ms earlier after its predecessor than the dispatcher issued it was skipped, and a socket
  // heard progress every other second (a burst of 1.5 s could pass without one).
  if (safe > oldest_cursor_position_ && safe >= last_cursor_position_ && due &&
      tick.at - last_progress_at_ >= std::chrono::seconds(1)) {
    last_progress_at_ = tick.at;
    quiet_since_ = now;
    advance_cursor(safe);
    oldest_cursor_position_ = safe;
    // The tick's frame names its position; a socket catching up (or ending) names its own.
    sink_.send(safe == tick.position && tick.frame
                   ? ws::Frame::shared_text(tick.frame)
                   : ws::Frame::text(tab::frames::progress(cursor_at(safe))));
  }
  if (!catching_up_) settle_live(position);  // also brings every subscription to `position`
}

void Feed::settle_live(uint64_t position) {
  if (position == 0 || catching_up_ || sink_.closing()) return;
  subs_.bring_all_to(position);
  if (last_cursor_position_ < position) return;  // the tab hears it from the tick's progress frame
  std::lock_guard lock(mailbox_mutex_);
  if (live_) owner_.settle(position);  // (an overflow since the batch was taken unsettles)
}

uint64_t Feed::safe_position() const {
  uint64_t safe = scan_;
  for (const auto& [key, position] : blocked_) safe = std::min(safe, position - 1);
  return safe;
}

void Feed::advance_cursor(uint64_t position) {
  last_cursor_position_ = std::max(last_cursor_position_, position);
}

void Feed::subscribed_at(uint64_t position) {
  oldest_cursor_position_ =
      subs_.size() <= 1 ? position : std::min(oldest_cursor_position_, position);
  if (subs_.size() <= 1) quiet_since_ = std::chrono::steady_clock::now();
  advance_cursor(position);
}

}  // namespace outlive::session
