#include "session/session.hpp"
#include <algorithm>

#include "common/jitter.hpp"
#include "common/log.hpp"
#include "db/pool.hpp"
#include "metrics/metrics.hpp"
#include "topic/cursor.hpp"
#include "window/app_window.hpp"

namespace outlive::session {

namespace net = boost::asio;

namespace {
// The `socket` of log lines: counts the upgrades of this replica (a process runs one).
std::atomic<uint64_t> next_socket_id{0};
}  // namespace
using json = nlohmann::json;
using error_code = boost::system::error_code;

Session::Session(std::shared_ptr<Context> context, tcp::socket&& socket,
                 admission::OpenRequest request,
                 std::variant<auth::Credential, admission::Refusal> verdict,
                 std::chrono::steady_clock::time_point opened_at)
    : ws::Connection(std::move(socket), context->connection_settings),
      context_(std::move(context)),
      io_index_(context_->io.index_of(executor())),
      request_{std::move(request.app), std::move(request.address)},
      socket_id_(next_socket_id.fetch_add(1, std::memory_order_relaxed) + 1),
      opened_at_(opened_at) {
  if (auto* credential = std::get_if<auth::Credential>(&verdict)) {
    credential_ = std::move(*credential);
  } else {
    refusal_ =
        std::make_unique<admission::Refusal>(std::get<admission::Refusal>(std::move(verdict)));
  }
}

Session::~Session() {
  // (handlers destroyed at stop finish no session: the hub must not keep a reader it reads. The
  // hub is the app's delivery's, which the replica drops after Server::stop, and that stop has
  // finished every socket in a hub by then, so a later destruction finds registered_ false.)
  if (registered_) app_->delivery->hub().remove_reader(this);
  if (counted_viewer_) context_->admission.release(viewer_->id);
  if (lookup_running_) {
    context_->admission.lookup_ended(request_.address, true, std::chrono::steady_clock::now());
  }
  if (app_) {  // a session destroyed without finishing (handlers destroyed at stop)
    auto& g = *app_->gauges;
    g.sockets -= int64_t(gauged_open_);
    g.subscriptions -= gauged_subscriptions_;
    g.replaying -= gauged_replaying_;
  }
}

void Session::start(std::string early) {
  context_->metrics().counter("outlive_sockets_opened_total", "Websocket sockets accepted")++;
  if (auto app = context_->apps.find(request_.app); app != context_->apps.end()) {
    app_ = &app->second;
    feed_.bind(feed_source());
    // (only a socket of a known app has a hub to join; any other is refused below)
    app_->delivery->hub().add_reader(self());
    registered_ = true;
  }
  // Also notices the peer's close while we check who it is (unless it wrote frames with its
  // request: those wait for the verdict, and the socket is not read meanwhile).
  start_transport(std::move(early));
  sync_gauges();
  if (context_->stopping) return close_with(ws::kRestart, "replica stopping");
  if (!app_) {
    return refuse({"unknown_app", "no app \"" + request_.app + "\" on this replica", ws::kPolicy});
  }
  if (refusal_) return refuse(*std::exchange(refusal_, nullptr));
  begin_lookup();
}

FeedSource Session::feed_source() {
  FeedSource source;
  source.app = request_.app;
  if (auto* w = context_->window_of(request_.app)) source.window = &w->window();
  source.identity = app_->delivery->identity();
  source.hand_offs = &app_->delivery->hand_offs();
  source.decisions = &context_->decisions;
  source.max_mailbox = context_->settings.max_mailbox;
  source.send_buffer_bytes = context_->settings.send_buffer_bytes;
  source.replay_send_buffer_bytes = context_->settings.replay_send_buffer_bytes;
  return source;
}

void Session::Port::unfollow(const std::string& channel, const std::string& key) {
  s_.app_->delivery->hub().unfollow(key, channel, &s_);
}

void Session::Port::catch_up_started() {
  s_.context_->metrics().counter("outlive_catch_ups_total",
                                 "Sockets that left live delivery to catch up from the window",
                                 {{"app", s_.request_.app}})++;
}

// A decision the catch-up misses, through the decider (joined with the other sockets that miss
// one for the same key and channel) under the socket's check deadline.
void Session::Port::ask_decision(const std::string& key, const std::string& channel,
                                 std::function<void(bool allowed)> answered) {
  const auto* ch = s_.app_->channels.at(channel).config;
  const uint64_t generation = s_.context_->decisions.generation(key);
  auto s = s_.self();
  s->check_async(
      [s, key, channel, ch, generation](CheckReply reply) {
        s->context_->decider.authorize_viewer(
            s->request_.app, channel, *ch, key, s->viewer_->id, s->viewer_->json, generation,
            [s, reply](access::AuthorizeAnswer answer) {
              if (!answer.ok)
                return reply(nullptr, answer.error.empty() ? "authorize failed" : answer.error);
              reply(json(answer.allowed.count(s->viewer_->id) > 0), "");
            },
            [s] { return !s->closed_.load(); });
      },
      [answered = std::move(answered)](const json& allowed) { answered(allowed.get<bool>()); });
}

void Session::begin_lookup() {
  if (closing()) return;
  const auto now = std::chrono::steady_clock::now();
  switch (context_->admission.begin_lookup(request_.address, now)) {
    case admission::Admission::Gate::refuse:
      return refuse(
          {"rate_limited", "too many unknown credentials from this address", ws::kTryAgain});
    case admission::Admission::Gate::wait:
      if (now - opened_at_ >= context_->settings.check_timeout) {
        log::limited(log::Level::warn, "credential lookup waited too long", about());
        return close_with(ws::kInternal, "credential lookup timed out");
      }
      return set_deadline(now + std::chrono::milliseconds(5));  // on_deadline: again
    case admission::Admission::Gate::go:
      break;
  }
  lookup_running_ = true;
  check([this](db::Connection& conn) { return resolve(conn); },
        [this](const json& viewer) { on_viewer(viewer); });
}

void Session::on_viewer(const json& viewer) {
  lookup_running_ = false;
  context_->admission.lookup_ended(request_.address, !viewer.is_null(),
                                   std::chrono::steady_clock::now());
  if (viewer.is_null()) {
    return refuse({"unauthorized", "unknown, expired or revoked credential", ws::kPolicy});
  }
  auth::Viewer v;
  v.id = viewer["id"];
  v.actor = viewer["actor"];
  v.access_subject = viewer["accessSubject"];
  if (!viewer["scopes"].is_null()) v.scopes = viewer["scopes"].get<std::vector<std::string>>();
  v.app_session = viewer["appSession"];
  if (auto refusal = context_->admission.after_lookup(v, *credential_, opened_at_)) {
    return refuse(*refusal);
  }
  std::string viewer_json = v.to_json().dump();
  viewer_json.shrink_to_fit();  // dump() grows by doubling; the socket keeps it for its life
  auto kept =
      std::make_shared<fanout::Viewer>(fanout::Viewer{std::move(v.id), std::move(viewer_json)});
  viewer_ = std::move(kept);
  counted_viewer_ = true;
  schedule_recheck();
  ready_ = true;
  parse_early();
  subscribing_.process_next();
}

json Session::resolve(db::Connection& conn) {
  const auto v = context_->services.authenticator->resolve(conn, *credential_);
  if (!v) return nullptr;
  return json{{"id", v->id},
              {"actor", v->actor},
              {"accessSubject", v->access_subject},
              {"scopes", v->scopes ? json(*v->scopes) : json(nullptr)},
              {"appSession", v->app_session}};
}

// Between 90% and 99% of the interval: sockets opened together (a deploy, a reconnect storm) spread
// their re-checks over several seconds instead of posting thousands of lookups to the pool in one
// instant (its queue is bounded: beyond it a check fails 1011), and the deadline wheel's lateness
// (at most 1/32 of the distance, 320 ms) still keeps every re-check within the SPEC's 60 s.
void Session::schedule_recheck() {
  set_deadline(std::chrono::steady_clock::now() +
               jittered(context_->settings.recheck_interval, 0.90, 0.99));
}

void Session::describe(json& fields) const {
  fields["app"] = request_.app;
  fields["peer"] = request_.address;
  fields["socket"] = socket_id_;
}

void Session::on_deadline() {
  if (closing()) return;
  if (!viewer_) return begin_lookup();
  if (recheck_running_) {
    log::limited(log::Level::warn, "access check timed out", about());
    return close_with(ws::kInternal, "access check timed out");
  }
  if (context_->credential_rechecks) ++*context_->credential_rechecks;
  recheck_running_ = true;
  set_deadline(std::chrono::steady_clock::now() + context_->settings.check_timeout);
  context_->rechecks.add(self());
}

void Session::on_recheck(const auth::Resolution& answer) {
  if (closing() || !recheck_running_) return;
  recheck_running_ = false;
  if (!answer.failure.empty()) {
    log::limited(log::Level::error, "access check failed", about({{"error", answer.failure}}));
    return close_with(ws::kInternal, "access check failed");
  }
  if (!answer.viewer || answer.viewer->id != viewer_->id) {
    return refuse({"unauthorized", "the credential expired or was revoked", ws::kPolicy});
  }
  schedule_recheck();
}

void Session::check(std::function<json(db::Connection&)> work,
                    std::function<void(const json&)> then) {
  auto s = self();
  check_async(
      [s, work = std::move(work)](CheckReply reply) {
        std::weak_ptr<Session> weak = s;
        const bool queued = s->context_->services.pool->post(
            [work, reply](db::Connection& conn) {
              json result;
              std::string failure;
              try {
                result = work(conn);
              } catch (const std::exception& e) {
                failure = e.what();
                if (failure.empty()) failure = "check failed";
              }
              reply(std::move(result), std::move(failure));
            },
            [weak] {
              auto alive = weak.lock();
              return alive && !alive->closed_.load();
            });
        if (!queued) reply(nullptr, "the database pool has no room");
      },
      std::move(then));
}

void Session::check_async(std::function<void(CheckReply)> start,
                          std::function<void(const json&)> then) {
  struct State {
    explicit State(net::any_io_executor ex) : deadline(ex) {}
    net::steady_timer deadline;
    bool done = false;
  };
  auto state = std::make_shared<State>(executor());
  auto s = self();
  state->deadline.expires_after(context_->settings.check_timeout);
  state->deadline.async_wait([s, state](error_code ec) {
    if (ec || state->done || s->closing()) return;
    state->done = true;
    log::limited(log::Level::warn, "access check timed out", s->about());
    s->close_with(ws::kInternal, "access check timed out");
  });
  auto finish = [s, state, then = std::move(then)](json result, std::string failure) {
    if (state->done || s->closing()) return;
    state->done = true;
    state->deadline.cancel();
    if (!failure.empty()) {
      log::limited(log::Level::error, "access check failed", s->about({{"error", failure}}));
      return s->close_with(ws::kInternal, "access check failed");
    }
    then(result);
  };
  start([s, finish](json result, std::string failure) {
    s->context_->post_from_worker(s->executor(), [finish, result = std::move(result),
                                                  failure = std::move(failure)]() mutable {
      finish(std::move(result), std::move(failure));
    });
  });
}

void Session::refuse(const admission::Refusal& refusal) {
  send_error(refusal.code, refusal.message, std::nullopt);
  close_with(refusal.close_code, refusal.code);
}

void Session::send_error(const std::string& code, const std::string& message,
                         const std::optional<std::string>& id) {
  send_text(ws::frames::error(code, message, id));
}

void Session::shut_down() {
  net::post(executor(), [s = self()] { s->close_with(ws::kRestart, "replica stopping"); });
}

void Session::on_closing() {
  closed_ = true;
  clear_deadline();
  subscribing_.stop();
  feed_.stop();
  sync_gauges();
}

void Session::on_finished() {
  closed_ = true;
  sync_gauges();
  if (registered_) app_->delivery->hub().remove_reader(this);
  registered_ = false;
}

// Moves this socket's share of its app's gauges to what it is now (zero once finished).
void Session::sync_gauges() {
  if (!app_) return;
  auto& g = *app_->gauges;
  const bool open = !finished();
  const int64_t subs = open ? static_cast<int64_t>(subs_.size()) : 0;
  const int64_t replaying = open && feed_.catching_up() ? subs : 0;
  g.sockets += int64_t(open) - int64_t(gauged_open_);
  g.subscriptions += subs - gauged_subscriptions_;
  g.replaying += replaying - gauged_replaying_;
  gauged_open_ = open;
  gauged_subscriptions_ = static_cast<int32_t>(subs);
  gauged_replaying_ = static_cast<int32_t>(replaying);
}

}  // namespace outlive::session
