#include "session/session.hpp"

#include "common/jitter.hpp"
#include "common/log.hpp"
#include "common/fault.hpp"
#include "common/thread_failures.hpp"
#include "metrics/metrics.hpp"

namespace outlive::session {

namespace {
// The `socket` of log lines: counts the upgrades of this replica (a process runs one).
std::atomic<uint64_t> next_socket_id{0};
}  // namespace
using json = nlohmann::json;

Session::Session(std::shared_ptr<Context> context, std::shared_ptr<Transport> transport,
                 admission::OpenRequest request,
                 std::variant<auth::Credential, admission::Refusal> verdict,
                 std::chrono::steady_clock::time_point opened_at)
    : context_(std::move(context)),
      transport_(std::move(transport)),
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
  transport_->detach();
  // (handlers destroyed at stop finish no session: the hub must not keep a reader it reads. The
  // hub is the app's delivery's, which the replica drops after its stop (Replica::Impl::
  // stop_serving), and that stop has finished every socket in a hub by then, so a later
  // destruction finds registered_ false.)
  if (registered_) app_->delivery->hub().remove_reader(this);
  if (counted_viewer_) context_->admission.release(viewer_->id);
  if (lookup_running_) {
    context_->admission.lookup_ended(request_.address, true, std::chrono::steady_clock::now());
  }
  // (a session destroyed without finishing: handlers destroyed at stop)
  if (app_) gauged_.release(*app_->gauges);
}

void Session::start(std::string early) {
  context_->metrics().counter("outlive_sockets_opened_total", "Websocket sockets accepted")++;
  if (auto app = context_->apps.find(request_.app); app != context_->apps.end()) {
    app_ = &app->second;
    feed_.bind(app_->feed);
    subscribing_.bind(*app_);
    // (only a socket of a known app has a hub to join; any other is refused below)
    app_->delivery->hub().add_reader(self());
    registered_ = true;
  }
  // Also notices the peer's close while we check who it is (unless it wrote frames with its
  // request: those wait for the verdict, and the socket is not read meanwhile).
  transport_->start(*this, self(), std::move(early));
  sync_gauges();
  if (context_->stopping) return close_with(ws::kRestart, "replica stopping");
  if (!app_) {
    context_->add_unserved(self());
    return refuse({"unknown_app", "no app \"" + request_.app + "\" on this replica", ws::kPolicy});
  }
  if (refusal_) return refuse(*std::exchange(refusal_, nullptr));
  if (credential_->kind == auth::CredentialKind::pending) return await_auth_message();
  begin_lookup();
}

void Session::on_messages() {
  try {
    fault::hit(fault::Site::io);  // (tests only: common/fault.hpp)
    if (token_ == Token::awaited) return take_auth_message();
    subscribing_.process_next();
  } catch (const std::exception& e) {
    serving_failed(e.what());
  }
}

void Session::serving_failed(const std::string& what) {
  count_thread_failure(ThreadKind::io);
  log::limited(log::Level::error, "serving a socket failed; it is closed 1011",
               about({{"error", what}}));
  close_with(ws::kInternal, "internal error");
}

uint64_t Session::Port::follow(const std::set<std::string>& keys, const std::string& channel) {
  return s_.app_->delivery->hub().follow(keys, channel, s_.self(), s_.viewer_);
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
  s->checks_.run_async(
      [s, key, channel, ch, generation](Checks::Reply reply) {
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
  if (auth::is_jwt(credential_->kind)) return verify_token();
  if (auth::is_hook(credential_->kind)) return check_with_hook();
  checks_.run([this](db::Connection& conn) { return resolve(conn); },
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
  admit(std::move(v));
}

// The viewer is known (from the SQL queries or a JWT): counted towards its sockets, then served.
void Session::admit(auth::Viewer v) {
  if (auto refusal = context_->admission.after_lookup(v, *credential_, opened_at_)) {
    return refuse(*refusal);
  }
  std::string viewer_json = v.to_json().dump();
  viewer_json.shrink_to_fit();  // dump() grows by doubling; the socket keeps it for its life
  auto kept =
      std::make_shared<fanout::Viewer>(fanout::Viewer{std::move(v.id), std::move(viewer_json)});
  viewer_ = std::move(kept);
  counted_viewer_ = true;
  set_viewer(viewer_.get());  // from now on an events.disconnect can name it
  transport_->admitted();
  if (auth::is_jwt(credential_->kind)) {
    schedule_expiry();
  } else {
    schedule_recheck();
  }
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
// A hook's expires_in_s, when sooner, is kept as given: the application chose that moment.
void Session::schedule_recheck() {
  auto in = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      jittered(context_->settings.recheck_interval, 0.90, 0.99));
  if (hook_expires_in_s_ > 0) {
    in = std::min<std::chrono::steady_clock::duration>(in, std::chrono::seconds(hook_expires_in_s_));
  }
  set_deadline(std::chrono::steady_clock::now() + in);
}

void Session::describe(json& fields) const {
  fields["app"] = request_.app;
  fields["peer"] = request_.address;
  fields["socket"] = socket_id_;
}

void Session::on_deadline() {
  if (closing()) return;
  if (token_ == Token::awaited) {
    return refuse({"unauthorized", "no credential: send {\"type\":\"auth\",\"token\":...} first",
                   ws::kPolicy});
  }
  if (!viewer_) return begin_lookup();
  if (auth::is_jwt(credential_->kind)) return on_expiry_deadline();
  if (recheck_running_) return check_timed_out();
  if (context_->credential_rechecks) ++*context_->credential_rechecks;
  recheck_running_ = true;
  set_deadline(std::chrono::steady_clock::now() + context_->settings.check_timeout);
  if (auth::is_hook(credential_->kind)) return recheck_with_hook();
  // (aliasing: the re-checks see the port and hold the session)
  context_->rechecks.add(std::shared_ptr<Recheckable>(self(), &port_));
}

void Session::on_recheck(const auth::Resolution& answer) {
  if (closing() || !recheck_running_) return;
  recheck_running_ = false;
  if (!answer.failure.empty()) return check_failed(answer.failure);
  if (!answer.viewer || answer.viewer->id != viewer_->id) {
    return refuse({"unauthorized",
                   answer.refused.empty() ? "the credential expired or was revoked"
                                          : "the application refused the credential: " + answer.refused,
                   ws::kPolicy});
  }
  hook_expires_in_s_ = answer.expires_in_s;
  schedule_recheck();
}

void Session::check_timed_out() {
  log::limited(log::Level::warn, "access check timed out", about());
  close_with(ws::kInternal, "access check timed out");
}

void Session::check_failed(const std::string& error) {
  log::limited(log::Level::error, "access check failed", about({{"error", error}}));
  close_with(ws::kInternal, "access check failed");
}

void Session::refuse(const admission::Refusal& refusal) {
  send_text(tab::frames::error(refusal.code, refusal.message, std::nullopt));
  close_with(refusal.close_code, refusal.code);
}

// An events.disconnect of this viewer (SPEC 2.6 rev 4): what was offered before it goes out,
// nothing after it (end_after), then the refusal.
void Session::disconnect(const std::string& reason) {
  if (closing()) return;
  feed_.take_mailbox();
  refuse({"unauthorized", reason, ws::kPolicy});
}

void Session::shut_down() {
  boost::asio::post(executor(), [s = self()] { s->close_with(ws::kRestart, "replica stopping"); });
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
  const bool open = !finished();
  const int64_t subs = open ? static_cast<int64_t>(subs_.size()) : 0;
  gauged_.move_to(*app_->gauges, open, subs, open && feed_.catching_up() ? subs : 0);
}

}  // namespace outlive::session
