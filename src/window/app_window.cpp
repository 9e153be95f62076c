#include "window/app_window.hpp"

#include <algorithm>
#include <utility>

#include "common/fault.hpp"
#include "common/log.hpp"
#include "common/thread_failures.hpp"

namespace outlive::window {

AppWindow::AppWindow(topic::Client& client, std::string app_id, Limits limits, OnUpdate on_update)
    : client_(client),
      app_id_(std::move(app_id)),
      limits_(limits),
      on_update_(std::move(on_update)),
      window_(limits) {}

AppWindow::AppWindow(topic::Client& client, std::string app_id, Limits limits, Sink& sink)
    : client_(client), app_id_(std::move(app_id)), limits_(limits), sink_(&sink), window_(limits) {}

AppWindow::~AppWindow() { stop(); }

void AppWindow::start() {
  std::lock_guard lock(mutex_);
  if (follower_) return;
  // Just after ensure_stream a 3-node cluster may still time the call out (a TSan-slowed replica
  // exited here in CI): retried as long as the stream's creation would be.
  const topic::StreamState state = client_.stream_state(app_id_, std::chrono::seconds(30));
  identity_ = state.identity;

  // The latest max_updates messages (fewer when the stream holds fewer). An empty stream reports
  // first_sequence = last_sequence + 1 (or 0 and 0 before its first message).
  const uint64_t last = state.last_sequence;
  const uint64_t latest = last >= limits_.max_updates ? last - limits_.max_updates + 1 : 1;
  const uint64_t fill_from = std::max<uint64_t>({state.first_sequence, latest, 1});
  window_.start_at(fill_from - 1);
  ready_at_ = last;
  ready_ = last < fill_from;  // nothing to fill
  if (ready_) ready_changed_.notify_all();

  log::info("Filling the window", {{"app", app_id_}, {"from", fill_from}, {"to", last}});
  follower_ = std::make_unique<topic::Follower>(
      client_, app_id_, fill_from, [this](const topic::StoredMessage& m, int64_t created_at_us) {
        on_message(m, created_at_us);
      });
}

void AppWindow::stop() {
  std::unique_ptr<topic::Follower> follower;
  {
    std::lock_guard lock(mutex_);
    follower = std::move(follower_);
  }
  follower.reset();  // joins the reader thread, outside our lock (on_message may take it)
}

bool AppWindow::wait_ready(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mutex_);
  return ready_changed_.wait_for(lock, timeout, [this] { return ready_.load(); });
}

topic::TopicIdentity AppWindow::identity() const {
  std::lock_guard lock(mutex_);
  return identity_;
}

void AppWindow::mark_ready() {
  {
    std::lock_guard lock(mutex_);  // so that wait_ready() cannot miss it
    ready_ = true;
  }
  ready_changed_.notify_all();
}

// The topic thread's error policy (docs/ARCHITECTURE.md): whatever throws while a message is taken
// in, the delivery never misses its position silently (SPEC 1): the update is handed off, or a gap
// in its place makes its readers resync.
void AppWindow::on_message(const topic::StoredMessage& message, int64_t created_at_us) {
  try {
    take(message, created_at_us);
  } catch (const std::exception& e) {
    failed(message.sequence, e.what());
  } catch (...) {
    failed(message.sequence, "unknown exception");
  }
  if (!ready_.load() && message.sequence >= ready_at_.load()) {
    mark_ready();
    log::info("The window is ready", {{"app", app_id_},
                                      {"head", window_.head()},
                                      {"oldest_replayable", window_.oldest_replayable()},
                                      {"updates", window_.size()},
                                      {"bytes", window_.bytes()}});
  }
}

void AppWindow::failed(uint64_t position, const std::string& what) {
  count_thread_failure(ThreadKind::topic);
  const bool handed = handed_through_ >= position;
  log::limited(log::Level::error, "Taking a topic message in failed",
               {{"app", app_id_},
                {"position", position},
                {"error", what},
                {"readers_resync", !handed && sink_ != nullptr}});
  if (window_.head() < position) {
    // Not in the window: a replay from a cursor before it would skip it, so none replays.
    window_.lose_through(position);
  }
  if (handed || sink_ == nullptr) return;
  try {
    Update gap;
    gap.position = position;
    gap.kind = Kind::gap;
    gap.lost_through = std::max(position, std::exchange(lost_through_, 0));
    sink_->push(std::make_shared<const Update>(std::move(gap)));
    handed_through_ = position;
  } catch (...) {
    // The gap could not be handed either: the next update carries it (its readers resync then).
    lost_through_ = position;
  }
}

void AppWindow::take(const topic::StoredMessage& message, int64_t created_at_us) {
  if (const uint64_t expected = window_.head() + 1; message.sequence > expected) {
    // The follower skips only what the stream no longer holds: its retention (SPEC 4) discarded
    // these while this replica was behind, or they were deleted. Their subscribers must reload.
    lost_ += message.sequence - expected;
    lost_through_ = message.sequence - 1;
    window_.lose_through(lost_through_);
    // Once per 10 s at most: a replica that stays behind loses a little at every fetch.
    const auto now = std::chrono::steady_clock::now();
    if (now - lost_logged_at_ >= std::chrono::seconds(10)) {
      lost_logged_at_ = now;
      log::warn("Topic positions were gone before this replica read them; their subscribers resync",
                {{"app", app_id_},
                 {"from", expected},
                 {"to", message.sequence - 1},
                 {"lost_in_all", lost_.load()}});
    }
  }
  auto parsed = parse_envelope(message.sequence, message.data, created_at_us);
  if (parsed && parsed->kind == Kind::disconnect) {
    // Not an update a tab reads: the window only passes its position; the delivery acts on it.
    parsed->lost_through = std::exchange(lost_through_, 0);
    window_.advance_to(message.sequence);
    auto update = std::make_shared<const Update>(std::move(*parsed));
    if (sink_) sink_->push(update);
    handed_through_ = message.sequence;
  } else if (parsed) {
    parsed->lost_through = std::exchange(lost_through_, 0);
    // (identity_ is written by start() before the follower runs, and not again while it does)
    if (sink_) sink_->prepare(*parsed, identity_);
    auto update = std::make_shared<const Update>(std::move(*parsed));
    window_.append(update);
    fault::hit(fault::Site::topic);  // (tests only: common/fault.hpp)
    if (sink_) sink_->push(update);
    handed_through_ = message.sequence;
    if (on_update_) on_update_(update);
  } else {
    window_.advance_to(message.sequence);
    handed_through_ = message.sequence;  // nothing to hand off
    skipped_++;
    log::warn("Skipped a topic message that is not an outlive envelope",
              {{"app", app_id_}, {"position", message.sequence}, {"msg_id", message.msg_id}});
  }
}

}  // namespace outlive::window
