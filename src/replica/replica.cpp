#include "replica/replica.hpp"

#include <malloc.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <optional>
#include <thread>

#include "auth/auth.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "common/socket_slot.hpp"
#include "common/thread_failures.hpp"
#include "common/thread_name.hpp"
#include "db/kept_connection.hpp"
#include "db/pool.hpp"
#include "fanout/app_delivery.hpp"
#include "hooks/auth_hook.hpp"
#include "hooks/replica_hooks.hpp"
#include "http/server.hpp"
#include "jwt/verifier.hpp"
#include "metrics/metrics.hpp"
#include "metrics/process.hpp"
#include "outbox/disconnects.hpp"
#include "outbox/gauges.hpp"
#include "outbox/migrate.hpp"
#include "publisher/publisher.hpp"
#include "schema/validator.hpp"
#include "session/context.hpp"
#include "topic/client.hpp"
#include "window/app_window.hpp"
#include "ws/send_batch.hpp"

namespace outlive::replica {

namespace {

publisher::Options publisher_options(const config::Config& c) {
  publisher::Options o;
  o.replica = c.replica;
  o.apps = c.app_ids();
  o.lease = c.publisher.lease;
  o.poll_interval = c.publisher.poll;
  o.publish_timeout = c.publisher.publish_timeout;
  o.batches_in_flight = c.publisher.batches_in_flight;
  o.backoff_base = c.publisher.backoff_base;
  o.backoff_cap = c.publisher.backoff_cap;
  o.waiting_threshold = c.publisher.waiting_threshold;
  o.waiting_log_interval = c.publisher.waiting_log_interval;
  return o;
}

// Adds the code channels to the configuration's apps: from there on they are channels like the
// SQL ones, and the decider tells them apart (config::Channel::code).
void add_code_channels(config::Config& c, std::vector<CodeChannel> channels) {
  for (auto& ch : channels) {
    const std::string where = "code channel \"" + ch.name + "\" of app \"" + ch.app + "\"";
    auto app = c.apps.find(ch.app);
    if (app == c.apps.end()) {
      throw Error(Errc::invalid_input,
                  where + ": the configuration does not list app \"" + ch.app + "\"");
    }
    if (ch.name.empty()) throw Error(Errc::invalid_input, where + ": the name is empty");
    if (app->second.channels.count(ch.name)) {
      throw Error(Errc::invalid_input, where + ": the configuration declares it already");
    }
    if (!ch.keys || !ch.authorize) {
      throw Error(Errc::invalid_input, where + ": keys and authorize are both required");
    }
    config::Channel channel;
    channel.collection = ch.collection;
    channel.scope = ch.scope;
    try {
      schema::Validator check(ch.scope);
    } catch (const std::exception& e) {
      throw Error(Errc::invalid_input,
                  where + ": the scope is not a usable JSON Schema: " + e.what());
    }
    const std::string name = ch.name;
    channel.code = std::make_shared<const CodeChannel>(std::move(ch));
    app->second.channels.emplace(name, std::move(channel));
  }
}

// An app's auth.hook as the sockets see it (session::Services): its answers as the credential
// queries' resolutions, so session/ knows nothing of hooks.
session::Services::HookCheck hook_check(hooks::AuthHook* hook) {
  if (hook == nullptr) return nullptr;
  return [hook](const std::string& credential, std::function<void(const auth::Resolution&)> done) {
    hook->check(credential, [done = std::move(done)](hooks::CredentialAnswer a) {
      auth::Resolution r;
      r.failure = std::move(a.failure);
      r.refused = std::move(a.refused);
      r.expires_in_s = a.expires_in_s;
      if (r.failure.empty() && !a.viewer.is_null()) {
        auth::Viewer v;
        v.id = a.viewer["id"];
        v.actor = a.viewer["actor"];
        v.access_subject = a.viewer["accessSubject"];
        if (!a.viewer["scopes"].is_null()) {
          v.scopes = a.viewer["scopes"].get<std::vector<std::string>>();
        }
        r.viewer = std::move(v);
      }
      done(r);
    });
  };
}

}  // namespace

struct Replica::Impl {
  config::Config config;
  metrics::Registry metrics;
  std::shared_ptr<metrics::ProcessMetrics> process_metrics;
  std::unique_ptr<topic::Client> nats;
  std::unique_ptr<db::Pool> pool;
  std::unique_ptr<auth::Authenticator> authenticator;
  std::unique_ptr<jwt::Verifier> jwt;  // with auth.jwt
  std::unique_ptr<hooks::ReplicaHooks> hooks;  // the app's hooks: channels, credentials
  // What the sockets share; each app's delivery, fed by its window (so declared before the
  // windows, which are destroyed first).
  std::shared_ptr<session::Context> context;
  std::map<std::string, std::unique_ptr<fanout::AppDelivery>> deliveries;
  std::map<std::string, std::unique_ptr<window::AppWindow>> windows;
  std::unique_ptr<http::Server> server;
  std::unique_ptr<publisher::Publisher> publisher;
  bool stopped = false;
  void stop_serving();

  // Outbox gauges per app, refreshed in the background so a scrape never waits on SQL. The map is
  // filled before the refresher starts and never changes after.
  struct OutboxGauges {
    std::atomic<int64_t> pending{0};
    std::atomic<double> oldest_age{0};
  };
  std::map<std::string, OutboxGauges> outbox;
  // malloc's view, sampled here rather than per scrape: mallinfo2() walks every free chunk under
  // each arena's lock, up to 26 ms with 5,000 sockets, which on an io thread (where /metrics is
  // served) held back its sockets' frames and, meanwhile, every malloc in the arena walked.
  std::atomic<double> heap_in_use{0}, heap_free{0};
  std::atomic<std::chrono::steady_clock::rep> heap_sampled{0};  // 0: not yet
  static constexpr auto kHeapSampleEvery = std::chrono::seconds(10);
  void sample_heap() {
    const auto now = std::chrono::steady_clock::now().time_since_epoch();
    if (heap_sampled != 0 &&
        now - std::chrono::steady_clock::duration(heap_sampled) < kHeapSampleEvery)
      return;
    const auto m = mallinfo2();
    heap_in_use = double(m.uordblks + m.hblkhd);
    heap_free = double(m.fordblks);
    heap_sampled = now.count();
  }
  double heap_sample_age() const {
    const auto at = heap_sampled.load();
    if (at == 0) return -1;
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch() -
                                         std::chrono::steady_clock::duration(at))
        .count();
  }
  std::thread refresher;
  std::mutex refresher_mutex;
  std::condition_variable refresher_cv;
  bool refresher_stop = false;

  // Readiness (SPEC 6 rev 2): refreshed about once a second in the background, so /readyz answers
  // from memory and never waits on Postgres.
  // Ready while the last successful check is recent: a Postgres that stops answering (a frozen
  // server or a dead peer that sends no reset) blocks the check itself, and must not leave the
  // last verdict standing.
  std::atomic<int64_t> postgres_ok_at{0};  // steady_clock ticks of the last SELECT 1 that answered
  static constexpr std::chrono::seconds kReadinessStale{3};
  bool postgres_ready() const {
    const int64_t at = postgres_ok_at.load();
    return at != 0 &&
           std::chrono::steady_clock::now().time_since_epoch().count() - at <
               std::chrono::duration_cast<std::chrono::steady_clock::duration>(kReadinessStale)
                   .count();
  }
  std::thread readiness;

  // The two background connections, for stop() to cut short a query on a server that does not
  // answer (common/socket_slot.hpp).
  SocketSlot readiness_slot, gauges_slot;

  void refresh_readiness() {
    db::KeptConnection kept(config.database, std::chrono::seconds(1), "outlive-readiness",
                            std::chrono::milliseconds(1000), readiness_slot);
    std::unique_lock lock(refresher_mutex);
    while (!refresher_stop) {
      lock.unlock();
      try {
        kept.ping();
        // Ready only once checks succeed too (issue 47): after an outage the pool's own
        // connections may still be failing; one ping through the pool replaces a dead one.
        if (pool->serving() || pool->healthy())
          postgres_ok_at = std::chrono::steady_clock::now().time_since_epoch().count();
        else
          postgres_ok_at = 0;
      } catch (const std::exception&) {
        kept.drop();
        postgres_ok_at = 0;
      }
      lock.lock();
      refresher_cv.wait_for(lock, std::chrono::seconds(1), [&] { return refresher_stop; });
    }
  }
  bool windows_ready() const {
    for (const auto& [app, w] : windows) {
      if (!w->ready()) return false;
    }
    return true;
  }

  void refresh_outbox_gauges() {
    db::KeptConnection kept(config.database, std::chrono::seconds(2), "outlive-gauges",
                            std::chrono::milliseconds(5000), gauges_slot);
    std::unique_lock lock(refresher_mutex);
    while (!refresher_stop) {
      lock.unlock();
      sample_heap();
      if (process_metrics) process_metrics->sample_open_fds();
      try {
        const auto seen = outbox::backlog_by_app(kept.get());
        for (auto& [app, g] : outbox) {
          const auto it = seen.find(app);
          g.pending = it == seen.end() ? 0 : it->second.pending;
          g.oldest_age = it == seen.end() ? 0.0 : it->second.oldest_age;
        }
      } catch (const std::exception& e) {
        log::warn("outbox metrics refresh failed", {{"error", e.what()}});
        kept.drop();
      }
      lock.lock();
      refresher_cv.wait_for(lock, std::chrono::seconds(5), [&] { return refresher_stop; });
    }
  }
};

Replica::Replica(config::Config config, std::vector<CodeChannel> channels)
    : impl_(std::make_unique<Impl>()) {
  add_code_channels(config, std::move(channels));
  // Hook channels become code channels calling the app's hooks (SPEC 5.4 rev 4).
  impl_->hooks = std::make_unique<hooks::ReplicaHooks>(config, &impl_->metrics);
  impl_->config = std::move(config);
  auto& c = impl_->config;
  outbox::require_outboxes(c.database, c.app_ids());
  impl_->nats = std::make_unique<topic::Client>(c.nats, "outlive-" + c.replica, c.nats_options);
  topic::StreamSettings settings;
  settings.replicas = c.topic_replicas;
  for (const auto& app : c.app_ids()) {
    const auto state = impl_->nats->ensure_stream(app, settings);
    log::info("topic ready", {{"app", app},
                              {"stream", topic::stream_name_for(app)},
                              {"last_sequence", state.last_sequence},
                              {"replica", c.replica}});
  }
  db::PoolOptions pool_options;
  pool_options.workers = c.server.db_pool_size;
  pool_options.max_waiting = static_cast<size_t>(c.server.db_pool_queue);
  pool_options.backend_heap_prime = static_cast<size_t>(c.server.db_backend_heap_prime);
  impl_->pool = std::make_unique<db::Pool>(c.database, pool_options);
  impl_->authenticator = std::make_unique<auth::Authenticator>(c.auth);
  if (c.auth.jwt) {
    // The key set before the first socket: a replica that cannot verify tokens does not start.
    impl_->jwt = std::make_unique<jwt::Verifier>(*c.auth.jwt, &impl_->metrics);
    impl_->jwt->start();
  }

  session::Services services;
  services.pool = impl_->pool.get();
  services.authenticator = impl_->authenticator.get();
  services.jwt = impl_->jwt.get();
  services.auth_hook_of = [hooks = impl_->hooks.get()](const std::string& app) {
    return hook_check(hooks->auth_hook(app));
  };
  services.metrics = &impl_->metrics;
  services.window_of = [impl = impl_.get()](const std::string& app) -> window::AppWindow* {
    auto it = impl->windows.find(app);
    return it == impl->windows.end() ? nullptr : it->second.get();
  };
  services.ready = [impl = impl_.get()] {
    return impl->postgres_ready() && impl->nats->connected() && impl->windows_ready();
  };
  session::Settings ws_settings;
  ws_settings.recheck_interval = c.auth.recheck;
  ws_settings.decision_lifetime = c.access.decision_lifetime;
  ws_settings.collection_refresh = c.access.collection_refresh;
  // Two per connection: one runs, one waits ready; the pool's queue keeps room for the rest.
  ws_settings.collection_refreshes_at_once = 2 * static_cast<size_t>(c.server.db_pool_size);
  ws_settings.max_decisions = c.access.max_decisions;
  ws_settings.ping_interval = c.server.ping_interval;
  ws_settings.idle_timeout = c.server.idle_timeout;
  ws_settings.sse_keep_alive = c.server.sse_keep_alive;
  ws_settings.progress_after_updates = static_cast<uint64_t>(c.server.progress_after_updates);
  ws_settings.progress_quiet = c.server.progress_quiet;
  ws_settings.sse_max_duration = c.server.sse_max_seconds;
  ws_settings.ipv6_limit_prefix = c.server.ipv6_limit_prefix;
  ws_settings.io_threads =
      c.server.io_threads > 0 ? c.server.io_threads
                              : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (!c.server.io_uring) ws::SendBatch::enable(false);
  impl_->context = std::make_shared<session::Context>(c, services, ws_settings);
  auto& context = *impl_->context;
  if (c.auth.jwt) {
    // Before the topics are read: the disconnects a replica started later must know (SPEC 2.6).
    for (const auto& d : outbox::recent_disconnects(c.database, c.app_ids(), c.auth.jwt->max_lifetime))
      context.disconnects.record(d.app, d.viewer, d.at_ms);
  }
  fanout::DispatcherOptions delivery_options;
  delivery_options.check_timeout = ws_settings.check_timeout;
  delivery_options.max_waiting = ws_settings.dispatcher_max_waiting;
  delivery_options.collection_refresh = ws_settings.collection_refresh;

  for (const auto& app : c.app_ids()) {
    auto& delivery = impl_->deliveries[app];
    delivery = std::make_unique<fanout::AppDelivery>(app, context.config.apps.at(app).channels,
                                                     context.decider, delivery_options, context);
    context.apps.at(app).delivery = delivery.get();
    auto w = std::make_unique<window::AppWindow>(*impl_->nats, app, window::Limits{}, *delivery);
    auto* raw = w.get();
    impl_->windows.emplace(app, std::move(w));
    impl_->metrics.gauge("outlive_window_updates", "Updates in the replica's window",
                         {{"app", app}},
                         [raw] { return static_cast<double>(raw->window().size()); });
    impl_->metrics.gauge("outlive_window_bytes", "Bytes of the replica's window", {{"app", app}},
                         [raw] { return static_cast<double>(raw->window().bytes()); });
    impl_->metrics.counter("outlive_topic_lost_total",
                           "Topic positions gone (retention) before this replica read them; their "
                           "subscribers received resync",
                           {{"app", app}}, [raw] { return static_cast<double>(raw->lost()); });
  }
  for (auto& [app, w] : impl_->windows) w->start();
  for (auto& [app, d] : impl_->deliveries) d->start(impl_->windows.at(app)->identity());
  impl_->context->start_feeds();
  impl_->server = std::make_unique<http::Server>(impl_->context);
  impl_->server->start();
  impl_->context->io.start();

  impl_->publisher =
      std::make_unique<publisher::Publisher>(c.database, *impl_->nats, publisher_options(c));
  auto* stats = &impl_->publisher->stats();
  // Ownership (sql/005, issue 33): what this replica owns, why it lost it, whether it renews.
  auto* pub = impl_->publisher.get();
  std::map<std::string, metrics::Histogram*> commit_to_ack;
  for (const auto& app : c.app_ids()) {
    const metrics::Labels labels{{"app", app}};
    const auto* counts = pub->app_stats(app);
    impl_->metrics.counter("outlive_published_total", "Updates published to the topic", labels,
                           [counts] { return double(counts->published.load()); });
    impl_->metrics.counter("outlive_publish_errors_total",
                           "Failed publishes (each backs its key off)", labels,
                           [counts] { return double(counts->publish_errors.load()); });
    impl_->metrics.counter("outlive_publish_fenced_total",
                           "Updates held when the lease ran out, dropped unpublished (another "
                           "replica publishes them)",
                           labels, [counts] { return double(counts->fenced.load()); });
    impl_->metrics.gauge("outlive_partitions_owned",
                         "Partitions of the app's 64 whose updates this replica publishes now",
                         labels, [pub, app] { return double(pub->partitions_owned(app)); });
    auto* outbox = &impl_->outbox[app];
    impl_->metrics.gauge("outlive_outbox_pending", "Updates of the app waiting in the outbox",
                         labels, [outbox] { return double(outbox->pending.load()); });
    impl_->metrics.gauge("outlive_outbox_oldest_age_seconds",
                         "Age of the app's oldest pending update", labels,
                         [outbox] { return outbox->oldest_age.load(); });
    commit_to_ack[app] = &impl_->metrics.histogram("outlive_commit_to_ack_seconds",
                                                   "From commit to JetStream ack", labels);
  }
  for (const auto& [cause, counter] :
       std::vector<std::pair<std::string, const std::atomic<uint64_t>*>>{
           {"lease", &stats->lost_lease},
           {"database", &stats->lost_database},
           {"nats", &stats->lost_nats}}) {
    impl_->metrics.counter("outlive_ownership_losses_total",
                           "Times this replica lost its partitions: its lease ran out (frozen, or "
                           "Postgres did not answer), its database connection was lost, NATS did "
                           "not answer",
                           {{"cause", cause}}, [counter] { return double(counter->load()); });
  }
  impl_->metrics.counter("outlive_publish_resent_total",
                         "Publishes sent again because NATS reconnected before it answered them "
                         "(same Nats-Msg-Id: the stream keeps one copy)",
                         {}, [stats] { return double(stats->resent.load()); });
  impl_->metrics.gauge("outlive_lease_heartbeat_age_seconds",
                       "Seconds since this replica last renewed its lease (-1: never)", {},
                       [pub] { return pub->heartbeat_age_seconds(); });
  impl_->publisher->on_published([commit_to_ack](const publisher::Published& p) {
    const auto it = commit_to_ack.find(p.app_id);
    if (it != commit_to_ack.end())
      it->second->observe(std::chrono::duration<double>(p.acked_at - p.created_at).count());
  });
  for (const ThreadKind kind : kThreadKinds) {
    impl_->metrics.counter("outlive_thread_failures_total",
                           "Exceptions caught at a thread's top level, by kind of thread; each "
                           "applied that kind's error policy (docs/ARCHITECTURE.md)",
                           {{"thread", std::string(thread_kind_name(kind))}},
                           [kind] { return double(thread_failures(kind)); });
  }
  impl_->process_metrics = metrics::ProcessMetrics::register_on(impl_->metrics);
  impl_->publisher->start();
  impl_->refresher = std::thread([impl = impl_.get()] {
    name_this_thread("outlive-gauges");
    impl->refresh_outbox_gauges();
  });
  impl_->readiness = std::thread([impl = impl_.get()] {
    name_this_thread("outlive-ready");
    impl->refresh_readiness();
  });
  for (const auto& [part, read] : std::vector<std::pair<std::string, std::function<double()>>>{
           {"postgres", [impl = impl_.get()] { return double(impl->postgres_ready()); }},
           {"nats", [impl = impl_.get()] { return double(impl->nats->connected()); }},
           {"windows", [impl = impl_.get()] { return double(impl->windows_ready()); }}}) {
    impl_->metrics.gauge("outlive_ready", "Parts of readiness (1 ready, 0 not)", {{"part", part}},
                         read);
  }
  // RSS alone cannot tell live objects from heap that malloc freed but keeps (fragmentation,
  // per-thread arenas): both figures, so a memory regression can be told apart from retention.
  // (sampled every 10 s by the gauges thread, Impl::sample_heap)
  impl_->metrics.gauge("outlive_heap_bytes",
                       "Heap bytes: in_use allocated, free released by the code but kept by malloc",
                       {{"state", "in_use"}},
                       [impl = impl_.get()] { return impl->heap_in_use.load(); });
  impl_->metrics.gauge("outlive_heap_bytes",
                       "Heap bytes: in_use allocated, free released by the code but kept by malloc",
                       {{"state", "free"}},
                       [impl = impl_.get()] { return impl->heap_free.load(); });
  impl_->metrics.gauge("outlive_heap_sample_age_seconds",
                       "Age of outlive_heap_bytes (sampled every 10 s; -1 before the first)", {},
                       [impl = impl_.get()] { return impl->heap_sample_age(); });
  log::info("replica started", {{"replica", c.replica}, {"apps", c.app_ids()}, {"port", port()}});
}

unsigned short Replica::port() const { return impl_->server->port(); }
unsigned short Replica::admin_port() const { return impl_->server->admin_port(); }

std::string Replica::head_cursor(const std::string& app) const {
  return impl_->nats->head_cursor(app);
}

// SIGTERM (SPEC 6): every socket closes with 1012 within stop_grace, then nothing is accepted, the
// io threads stop, each app's delivery stops (before the drain: a round or a tick posted after it
// would hold its sessions for good), and what is left of the sockets is closed and drained.
void Replica::Impl::stop_serving() {
  auto& ctx = *context;
  if (!ctx.io.running() || ctx.stopping.exchange(true)) return;
  ctx.close_sockets(ctx.settings.stop_grace);
  server->stop_accepting();
  ctx.io.stop_and_join();
  for (auto& [app, delivery] : deliveries) delivery->stop();
  server->stop_accepting();  // what the first io thread did not get to before it stopped
  ctx.shut_down();
}

void Replica::stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->stop_serving();
  impl_->hooks->stop();
  impl_->publisher->stop();
  // All at once: each waits for its reader's pull request (up to 500 ms), and one after another
  // 80 apps took longer than the 10 s a stop may take (issue 33).
  {
    std::vector<std::thread> stopping;
    for (auto& [app, w] : impl_->windows) stopping.emplace_back([w = w.get()] { w->stop(); });
    for (auto& t : stopping) t.join();
  }
  {
    std::lock_guard lock(impl_->refresher_mutex);
    impl_->refresher_stop = true;
  }
  impl_->refresher_cv.notify_all();
  // Their queries answer nothing anyone waits for now; on a server that stopped answering they
  // would never return.
  impl_->readiness_slot.interrupt();
  impl_->gauges_slot.interrupt();
  if (impl_->refresher.joinable()) impl_->refresher.join();
  if (impl_->readiness.joinable()) impl_->readiness.join();
  impl_->pool->stop();
  log::info("replica stopped", {{"replica", impl_->config.replica}});
}

Replica::~Replica() { stop(); }

}  // namespace outlive::replica
