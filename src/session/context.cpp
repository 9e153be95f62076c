#include "session/context.hpp"

#include <chrono>
#include <thread>

#include "metrics/metrics.hpp"
#include "session/session.hpp"
#include "topic/cursor.hpp"
#include "window/app_window.hpp"
#include "ws/send_batch.hpp"

namespace outlive::session {

namespace {

void register_gauges(metrics::Registry& m, AppRuntime& rt) {
  const metrics::Labels app{{"app", rt.id}};
  rt.frames_sent = &m.counter("outlive_frames_sent_total", "Update frames sent to sockets", app);
  rt.subscriptions_started =
      &m.counter("outlive_subscriptions_started_total", "Subscriptions started or ended", app);
  rt.subscriptions_ended =
      &m.counter("outlive_subscriptions_ended_total", "Subscriptions started or ended", app);
  auto g = rt.gauges;
  m.gauge("outlive_sockets", "Open websocket sockets", app,
          [g] { return double(g->sockets.load()); });
  m.gauge("outlive_subscriptions", "Subscriptions, live or replaying from a cursor",
          {{"app", rt.id}, {"state", "live"}},
          [g] { return double(g->subscriptions.load() - g->replaying.load()); });
  m.gauge("outlive_subscriptions", "Subscriptions, live or replaying from a cursor",
          {{"app", rt.id}, {"state", "replaying"}}, [g] { return double(g->replaying.load()); });
}

}  // namespace

Context::Context(const config::Config& c, Services s, Settings st)
    : config(c),
      services(std::move(s)),
      settings(st),
      connection_settings([&st] {
        ws::ConnectionSettings c;
        c.ping_interval = st.ping_interval;
        c.idle_timeout = st.idle_timeout;
        c.stall_timeout = st.stall_timeout;
        c.max_waiting_messages = st.max_waiting_messages;
        // Above what delivery itself queues (live, or catching up), so only the replies to the
        // tab's own messages pause reading (SPEC 5.7 rev 3).
        c.read_pause_bytes = st.send_buffer_bytes + st.replay_send_buffer_bytes;
        return c;
      }()),
      io(st.io_threads),
      decisions(st.decision_lifetime, st.max_decisions),
      decider(
          *services.pool, decisions, st.max_keys,
          [m = services.metrics](const std::string& app, double seconds) {
            m->counter("outlive_authorize_calls_total", "authorize() calls", {{"app", app}})++;
            m->observe("outlive_authorize_seconds", "authorize() latency", {{"app", app}}, seconds);
          }),
      admission(c.auth.session_cookie, st.opens_per_second, st.max_sockets_per_viewer,
                st.ipv6_limit_prefix,
                c.auth.jwt ? std::optional<std::string>(c.auth.jwt->cookie) : std::nullopt,
                c.auth.hook.has_value()),
      hook_headers(c.auth.hook ? c.auth.hook->forward_headers : std::vector<std::string>{}),
      proxies(c.trusted_proxies),
      collection_refreshes(st.collection_refreshes_at_once) {
  decisions_probe->decisions = &decisions;
  for (const auto& [id, app] : config.apps) {
    AppRuntime rt;
    rt.id = id;
    rt.config = &app;
    rt.origins = {app.allowed_origins.begin(), app.allowed_origins.end()};
    for (const auto& [name, ch] : app.channels)
      rt.channels.emplace(name, ChannelRuntime{&ch, schema::Validator(ch.scope)});
    register_gauges(metrics(), rt);
    apps.emplace(id, std::move(rt));
  }
  if (services.metrics) {
    credential_rechecks =
        &services.metrics->counter("outlive_credential_rechecks_total",
                                   "Credentials of open sockets checked again (SPEC: every 60 s)");
    recheck_batches = &services.metrics->counter(
        "outlive_credential_recheck_batches_total",
        "Pool tasks that re-checked the credentials of sockets falling due together");
    services.metrics->gauge("outlive_access_decisions", "Access decisions cached (SPEC 5.5 rev 2)",
                            {}, [p = decisions_probe] {
                              std::lock_guard lock(p->mutex);
                              return p->decisions ? double(p->decisions->size()) : 0.0;
                            });
  }
}

Context::~Context() {
  std::lock_guard lock(decisions_probe->mutex);
  decisions_probe->decisions = nullptr;
}

void Context::on_reader_threads(std::vector<std::shared_ptr<fanout::Reader>>&& readers,
                                const std::function<void(fanout::Reader&)>& work) {
  std::vector<std::vector<std::shared_ptr<fanout::Reader>>> per_thread(io.size());
  for (auto& r : readers) {
    const size_t i = static_cast<Session&>(*r).io_index();
    if (per_thread[i].empty()) per_thread[i].reserve(readers.size() / io.size() + 1);
    per_thread[i].push_back(std::move(r));
  }
  for (size_t i = 0; i < per_thread.size(); ++i) {
    if (per_thread[i].empty()) continue;
    boost::asio::post(io.at(i), [batch = std::move(per_thread[i]), work] {
      // Every socket's writes of this hand-off leave in one submission at its end.
      ws::SendBatch::Scope writes;
      for (const auto& r : batch) {
        // One socket's failure costs that socket only: the rest of the hand-off still runs.
        try {
          work(*r);
        } catch (const std::exception& e) {
          static_cast<Session&>(*r).serving_failed(e.what());
        }
        writes.flush_if_full();
      }
    });
  }
}

void Context::take(std::vector<std::shared_ptr<fanout::Reader>>&& readers) {
  on_reader_threads(std::move(readers), [](fanout::Reader& r) { r.take(); });
}

void Context::progress(std::vector<std::shared_ptr<fanout::Reader>>&& readers,
                       fanout::ProgressTick tick) {
  if (stopping) return;
  on_reader_threads(std::move(readers),
                    [tick = std::move(tick)](fanout::Reader& r) { r.progress(tick); });
}

void Context::on_round(const std::string& app, const std::vector<double>& delays) {
  if (delays.empty()) return;
  // Looked up once a round, not once an update: the lookup takes the registry's lock.
  auto& histogram =
      metrics().histogram("outlive_commit_to_send_seconds",
                          "From commit to handing the update to its sockets", {{"app", app}});
  for (double d : delays) histogram.observe(d);
}

void Context::on_progress(const std::string& app, size_t visited) {
  metrics().counter(
      "outlive_progress_visits_total",
      "Sockets the once-a-second progress tick visited (not settled at the app's hand-off)",
      {{"app", app}}) += visited;
}

void Context::on_disconnect(const std::string& app, const window::Disconnect& disconnect) {
  disconnects.record(app, disconnect.viewer, disconnect.at_ms);
  metrics().counter("outlive_disconnects_total",
                    "events.disconnect calls read from the app's topic (SPEC 2.6)",
                    {{"app", app}})++;
}

void Context::disconnect(std::vector<std::shared_ptr<fanout::Reader>>&& readers,
                         const std::string& reason) {
  if (stopping) return;
  on_reader_threads(std::move(readers), [reason](fanout::Reader& r) { r.disconnect(reason); });
}

void Context::count_close(uint16_t code) {
  metrics().counter("outlive_socket_closes_total", "Sockets closed, by close code",
                    {{"code", std::to_string(code)}})++;
}

std::vector<std::shared_ptr<fanout::Reader>> Context::readers() const {
  std::vector<std::shared_ptr<fanout::Reader>> out;
  for (const auto& [id, rt] : apps) {
    if (!rt.delivery) continue;
    auto app = rt.delivery->hub().readers();
    out.insert(out.end(), std::make_move_iterator(app.begin()), std::make_move_iterator(app.end()));
  }
  return out;
}

size_t Context::reader_count() const {
  size_t n = 0;
  for (const auto& [id, rt] : apps) {
    if (rt.delivery) n += rt.delivery->hub().reader_count();
  }
  return n;
}

void Context::close_sockets(std::chrono::milliseconds grace) {
  const auto close_all = [this] {
    for (auto& r : readers()) r->shut_down();
  };
  close_all();
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < deadline && reader_count() > 0) {
    close_all();  // also the ones that opened since
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void Context::add_unserved(std::weak_ptr<Session> session) {
  std::lock_guard lock(unserved_mutex);
  if (unserved.size() >= 2 * unserved_pruned_at + 64) {
    std::erase_if(unserved, [](const std::weak_ptr<Session>& s) { return s.expired(); });
    unserved_pruned_at = unserved.size();
  }
  unserved.push_back(std::move(session));
}

void Context::shut_down() {
  collection_refreshes.stop();  // before: a job refused its post starts the next one
  forbid_worker_posts();
  for (auto& r : readers()) static_cast<Session&>(*r).force_close();
  std::vector<std::weak_ptr<Session>> left;
  {
    std::lock_guard lock(unserved_mutex);
    left.swap(unserved);
  }
  for (auto& weak : left) {
    if (auto s = weak.lock()) s->force_close();
  }
  // Whatever is still pending after that (an idle keep-alive HTTP read, a handshake) holds a
  // session that holds the context: destroying the handlers breaks that cycle.
  io.drain_and_shut_down(std::chrono::seconds(2));
}

std::string Context::cursor_at(const std::string& app, uint64_t position) const {
  auto* w = window_of(app);
  topic::TopicIdentity identity = w ? w->identity() : topic::TopicIdentity{app, 0};
  return topic::Cursor::at(identity, position).encode();
}

void Context::start_feeds() {
  for (auto& [id, app] : apps) {
    FeedSource& source = app.feed;
    source.app = app.id;
    if (auto* w = window_of(app.id)) source.window = &w->window();
    source.identity = app.delivery->identity();
    source.hand_offs = &app.delivery->hand_offs();
    source.decisions = &decisions;
    source.max_mailbox = settings.max_mailbox;
    source.progress_after_updates = settings.progress_after_updates;
    source.progress_quiet = settings.progress_quiet;
    source.send_buffer_bytes = settings.send_buffer_bytes;
    source.replay_send_buffer_bytes = settings.replay_send_buffer_bytes;
  }
}

}  // namespace outlive::session
