// Delivery to one socket: live from the dispatcher's rounds, or caught up from the window.
//
// Live: the dispatcher hands the socket its part of each round through the mailbox; one handler is
// posted while it is empty, so rounds that pile up while the io threads are behind leave in one
// system call. A socket whose send buffer (256 KiB) or mailbox is full leaves live delivery: the
// dispatcher skips it from then on, and the socket reads what it has not been sent from the window,
// in topic order, up to 512 KiB waiting, as the tab reads (SPEC 5.7). It takes only updates the
// dispatcher has handed off (their decisions are made; window::Update::handed_off); an update of a
// key not handed off yet blocks that key for this pass and will arrive live. When the pass reaches
// the window's end the socket turns live again under the mailbox lock and makes one more pass:
// whatever was handed off between the two is sent by the pass, whatever after it arrives live;
// positions per key drop what both bring.
#include <pqxx/pqxx>

#include "common/log.hpp"
#include "db/pool.hpp"
#include "metrics/metrics.hpp"
#include "session/session.hpp"
#include "window/app_window.hpp"

namespace outlive::session {

namespace net = boost::asio;
using json = nlohmann::json;

namespace {
constexpr size_t kScanBatch = 64;
}

void Session::offer(std::vector<fanout::Delivery>&& deliveries) {
  bool post = false;
  {
    std::lock_guard lock(mailbox_mutex_);
    if (!live_) return;  // catching up: these are in the window
    if (mailbox_.size() + deliveries.size() > context_->settings.max_mailbox) {
      // The socket is behind: it reads the rest from the window (bounded, nothing queues here).
      live_ = false;
      mailbox_.clear();
    } else if (mailbox_.empty()) {
      mailbox_ = std::move(deliveries);
    } else {
      for (auto& d : deliveries) mailbox_.push_back(std::move(d));
    }
    if (!mailbox_posted_) post = mailbox_posted_ = true;
  }
  if (post) net::post(executor(), [s = self()] { s->take_mailbox(); });
}

void Session::take_mailbox() {
  std::vector<fanout::Delivery> batch;
  bool live;
  {
    std::lock_guard lock(mailbox_mutex_);
    batch.swap(mailbox_);
    mailbox_posted_ = false;
    live = live_;
  }
  if (closing() || !viewer_) return;
  if (!live && !catching_up_) start_catch_up(subs_.lowest_position());
  if (catching_up_) return pump();
  frames_in_batch_ = 0;
  cork();
  for (const auto& d : batch) {
    if (d.broken) {
      close_with(ws::kInternal, "access check failed");  // the tab resumes from its cursor
      break;
    }
    if (queued_bytes() >= context_->settings.send_buffer_bytes) {
      start_catch_up(subs_.lowest_position());
      break;
    }
    deliver(*d.out->update, d.out->cursor, d.out->tail, d.allowed);
  }
  if (frames_in_batch_ > 0) *app_->frames_sent += frames_in_batch_;
  uncork();
  if (catching_up_) pump();
}

void Session::deliver(const window::Update& u, const std::string& cursor,
                      const std::shared_ptr<const std::string>& tail,
                      const fanout::ChannelAccess& allowed) {
  effect_.clear();
  subs_.apply(u, cursor, allowed, effect_);
  if (!effect_.applied) return;
  for (auto& f : effect_.frames) send_text(std::move(f));
  for (const auto& [channel, key] : effect_.dropped)
    context_->hub.unfollow(request_.app, key, channel, this);
  for (const auto& id : effect_.ended) end_subscription(id);
  if (!effect_.update_ids.empty() && tail) {
    // The head changes only with the socket's subscriptions: built once for a set of ids.
    if (effect_.update_ids != head_ids_ || !head_) {
      head_ids_ = effect_.update_ids;
      head_ = std::make_shared<const std::string>(ws::frames::update_head(head_ids_));
    }
    send(ws::Frame::update(head_, tail));
    ++frames_in_batch_;
  }
  advance_cursor(u.position);
}

void Session::start_catch_up(uint64_t from) {
  {
    std::lock_guard lock(mailbox_mutex_);
    live_ = false;
    mailbox_.clear();
  }
  if (!catching_up_) {
    catching_up_ = true;
    scan_ = from;
    blocked_.clear();
    context_->metrics().counter("outlive_catch_ups_total",
                                "Sockets that left live delivery to catch up from the window",
                                {{"app", request_.app}})++;
  } else {
    scan_ = std::min(scan_, from);
  }
  sync_gauges();
}

void Session::on_room() {
  if (catching_up_ && queued_bytes() < context_->settings.replay_send_buffer_bytes / 2) pump();
}

// Not re-entered: a write that completes inside a pass (uncork, or 64 KiB queued while corked)
// makes room and asks for a pass, which runs after this one instead of inside it.
void Session::pump() {
  if (pumping_) {
    pump_again_ = true;
    return;
  }
  pumping_ = true;
  do {
    pump_again_ = false;
    if (!catching_up_ || closing() || awaiting_decision_) break;
    frames_in_batch_ = 0;
    cork();
    if (scan()) rejoin();
    if (frames_in_batch_ > 0) *app_->frames_sent += frames_in_batch_;
    uncork();
  } while (pump_again_);
  pumping_ = false;
  if (!catching_up_) sync_gauges();
}

bool Session::scan() {
  auto* w = context_->window_of(request_.app);
  if (!w) return true;
  const size_t limit = context_->settings.replay_send_buffer_bytes;
  std::string id;
  for (;;) {
    if (closing()) return false;
    if (queued_bytes() >= limit) return false;
    auto batch = w->window().since(scan_, kScanBatch);
    if (!batch) {
      resync_behind();
      continue;
    }
    if (batch->empty()) return true;
    for (const auto& u : *batch) {
      if (queued_bytes() >= limit || closing()) return false;
      if (subs_.wants(*u) && !blocked_.count(u->key)) {
        if (!u->handed_off()) {
          blocked_.emplace(u->key, u->position);
        } else {
          fanout::ChannelAccess allowed;
          const auto now = access::Decisions::Clock::now();
          for (const auto& channel : subs_.channels_of(u->key)) {
            std::optional<bool> decision;
            if (answered_ && std::get<0>(*answered_) == u->key &&
                std::get<1>(*answered_) == channel) {
              decision = std::get<2>(*answered_);
            } else {
              access::Decider::decision_id_into(id, request_.app, channel, viewer_->id);
              decision = context_->decisions.get(u->key, id, now);
            }
            if (!decision) {
              ask_decision(u->key, channel);
              return false;
            }
            allowed.emplace_back(channel, *decision);
          }
          answered_.reset();
          // As live: the cursor never passes an update of a key this pass has not sent yet.
          uint64_t at = u->position;
          for (const auto& [key, position] : blocked_) at = std::min(at, position - 1);
          const std::string cursor = context_->cursor_at(request_.app, at);
          std::shared_ptr<const std::string> tail;
          if (u->kind == window::Kind::data && u->data_json) {
            tail = at == u->position ? u->frame_tail() : nullptr;
            if (!tail) {
              tail = std::make_shared<const std::string>(
                  ws::frames::update_tail(u->key, cursor, *u->data_json));
              if (at == u->position) u->set_frame_tail(tail);
            }
          }
          deliver(*u, cursor, tail, allowed);
        }
      }
      scan_ = u->position;
    }
  }
}

// The pass reached the window's end: live again, then one more pass for what was handed off in
// between. If that pass cannot finish (buffer full, a decision missing) the socket stays behind.
bool Session::rejoin() {
  {
    std::lock_guard lock(mailbox_mutex_);
    live_ = true;
  }
  for (const auto& [key, position] : blocked_) scan_ = std::min(scan_, position - 1);
  blocked_.clear();
  if (!scan()) {
    std::lock_guard lock(mailbox_mutex_);
    live_ = false;
    mailbox_.clear();
    catching_up_ = true;  // still behind: the next pass goes on from here
    return false;
  }
  catching_up_ = false;
  blocked_.clear();
  return true;
}

// The socket's position fell out of the window: the subscriptions behind it reload (resync
// window) and are live from the head again; the socket stays open.
void Session::resync_behind() {
  auto* w = context_->window_of(request_.app);
  const uint64_t oldest = w->window().oldest_replayable();
  const uint64_t head = w->window().head();
  const std::string cursor = context_->cursor_at(request_.app, head);
  for (const auto& id : subs_.behind(oldest)) {
    send_text(ws::frames::resync(id, cursor, "window"));
    subs_.bring_to(id, head);
  }
  for (auto it = blocked_.begin(); it != blocked_.end();) {
    it = it->second <= oldest ? blocked_.erase(it) : std::next(it);
  }
  advance_cursor(head);
  scan_ = std::max(subs_.empty() ? head : subs_.lowest_position(), oldest);
}

void Session::ask_decision(const std::string& key, const std::string& channel) {
  awaiting_decision_ = true;
  const auto* ch = app_->channels.at(channel).config;
  const uint64_t generation = context_->decisions.generation(key);
  auto s = self();
  check(
      [s, key, channel, ch, generation](pqxx::connection& conn) {
        const auto answer = s->context_->decider.authorize_now(
            conn, s->request_.app, channel, *ch, key, {s->viewer_->id}, "[" + s->viewer_json_ + "]",
            generation);
        if (!answer.ok) throw std::runtime_error(answer.error);
        return json(answer.allowed.count(s->viewer_->id) > 0);
      },
      [s, key, channel](const json& allowed) {
        s->awaiting_decision_ = false;
        s->answered_.emplace(key, channel, allowed.get<bool>());
        s->pump();
      });
}

// --- progress ---------------------------------------------------------------------------------

void Session::progress(uint64_t position) {
  net::post(executor(), [s = self(), position] { s->on_progress(position); });
}

// Everything of the app up to `position` has been handed off. A live socket has received all of
// it (its mailbox came first), so every key it follows is there; a socket catching up is only as
// far as its pass.
void Session::on_progress(uint64_t position) {
  if (closing() || subs_.empty()) return;
  if (!catching_up_) {
    for (const auto& [id, sub] : subs_.all()) subs_.bring_to(id, position);
  }
  const uint64_t safe = catching_up_ ? safe_position() : position;
  if (safe <= last_cursor_position_) return;
  // At most once a second, even when a tick reaches us late and the next one on time.
  const auto now = std::chrono::steady_clock::now();
  if (now - last_progress_at_ < std::chrono::seconds(1)) return;
  last_progress_at_ = now;
  advance_cursor(safe);
  send_text(ws::frames::progress(context_->cursor_at(request_.app, safe)));
}

uint64_t Session::safe_position() const {
  uint64_t safe = scan_;
  for (const auto& [key, position] : blocked_) safe = std::min(safe, position - 1);
  return safe;
}

void Session::advance_cursor(uint64_t position) {
  last_cursor_position_ = std::max(last_cursor_position_, position);
  cursor_mirror_.store(last_cursor_position_, std::memory_order_relaxed);
}

}  // namespace outlive::session
