#pragma once
// What every socket of a replica shares (the "shared state" of Beast's chat example): the apps
// and their channels, each app's delivery with its hub of followers (made by the replica), the one
// access decider, admission, the database pool and the io threads the sockets run on.
#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include <atomic>
#include <boost/asio.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

#include "access/decider.hpp"
#include "access/decisions.hpp"
#include "admission/admission.hpp"
#include "admission/proxies.hpp"
#include "common/throttle.hpp"
#include "config/config.hpp"
#include "fanout/app_delivery.hpp"
#include "schema/validator.hpp"
#include "session/disconnects.hpp"
#include "session/feed.hpp"
#include "session/rechecks.hpp"
#include "session/settings.hpp"
#include "ws/connection.hpp"
#include "ws/io_threads.hpp"

namespace outlive::session {

class Session;

struct ChannelRuntime {
  const config::Channel* config;
  schema::Validator scope;
};

// Read by /metrics; shared with the registry so a scrape after the server is gone reads zeros.
struct AppGauges {
  std::atomic<int64_t> sockets{0};
  std::atomic<int64_t> subscriptions{0};
  std::atomic<int64_t> replaying{0};
};

// One socket's share of its app's gauges: move_to() moves it to what the socket is now, release()
// gives it back (a socket finished, or destroyed without finishing).
struct GaugeShare {
  bool open = false;
  int32_t subscriptions = 0;  // at most 16 each
  int32_t replaying = 0;

  void move_to(AppGauges& g, bool now_open, int64_t now_subscriptions, int64_t now_replaying) {
    g.sockets += int64_t(now_open) - int64_t(open);
    g.subscriptions += now_subscriptions - subscriptions;
    g.replaying += now_replaying - replaying;
    open = now_open;
    subscriptions = static_cast<int32_t>(now_subscriptions);
    replaying = static_cast<int32_t>(now_replaying);
  }
  void release(AppGauges& g) { move_to(g, false, 0, 0); }
};

struct AppRuntime {
  std::string id;
  const config::App* config = nullptr;
  std::map<std::string, ChannelRuntime> channels;
  std::set<std::string> origins;
  std::shared_ptr<AppGauges> gauges = std::make_shared<AppGauges>();
  std::atomic<uint64_t>* frames_sent = nullptr;
  // Looked up once: a revocation ends thousands of subscriptions in one round.
  std::atomic<uint64_t>* subscriptions_started = nullptr;
  std::atomic<uint64_t>* subscriptions_ended = nullptr;
  fanout::AppDelivery* delivery = nullptr;  // the replica's, set before the server starts
  FeedSource feed;  // what its sockets' feeds read: Context::start_feeds, before the server starts
};

// A client connection's place in server.max_connections (Context::connections), given back when
// it is destroyed. Its holder holds the context too. (A shared_ptr with a deleter cost a control
// block per socket.)
class ConnectionSlot {
 public:
  ConnectionSlot() = default;
  explicit ConnectionSlot(std::atomic<int64_t>& count) : count_(&count) { ++count; }
  ConnectionSlot(ConnectionSlot&& other) noexcept : count_(std::exchange(other.count_, nullptr)) {}
  ConnectionSlot& operator=(ConnectionSlot&& other) noexcept {
    if (this != &other) {
      release();
      count_ = std::exchange(other.count_, nullptr);
    }
    return *this;
  }
  ~ConnectionSlot() { release(); }

 private:
  void release() {
    if (count_) --*count_;
    count_ = nullptr;
  }
  std::atomic<int64_t>* count_ = nullptr;
};

struct Context final : fanout::DeliveryHost {
  Context(const config::Config& config, Services services, Settings settings);
  ~Context();

  const config::Config config;
  Services services;
  const Settings settings;
  const ws::ConnectionSettings connection_settings;  // every socket's, from settings
  // The io threads; a socket lives on one of them (Session::io_index()).
  ws::IoThreads io;
  Rechecks rechecks{*this, io.size()};
  std::atomic<bool> stopping{false};
  std::map<std::string, AppRuntime> apps;
  access::Decisions decisions;
  access::Decider decider;
  // Recent events.disconnect calls: JWTs issued before them are refused (SPEC 2.6 rev 4).
  Disconnects disconnects{config.auth.jwt ? config.auth.jwt->max_lifetime : std::chrono::hours(1)};
  admission::Admission admission;
  // auth.hook.forward_headers (lowercase), which the upgrade copies into OpenRequest::hook_headers.
  const std::vector<std::string> hook_headers;
  const admission::TrustedProxies proxies;
  // keys() again for many sockets' collections at once (an access update, the minute's refresh).
  Throttle collection_refreshes;
  // Client connections, upgraded or not (server.max_connections), and per peer address those not
  // upgraded yet (64 each, trusted proxies exempt).
  std::atomic<int64_t> connections{0};
  // outlive_credential_rechecks_total (null without a registry).
  std::atomic<uint64_t>* credential_rechecks = nullptr;
  // outlive_credential_recheck_batches_total: the pool tasks that ran them (Rechecks).
  std::atomic<uint64_t>* recheck_batches = nullptr;
  std::mutex unupgraded_mutex;
  std::unordered_map<std::string, int> unupgraded;

  metrics::Registry& metrics() { return *services.metrics; }
  void count_close(uint16_t code);
  window::AppWindow* window_of(const std::string& app) const {
    return services.window_of ? services.window_of(app) : nullptr;
  }
  std::string cursor_at(const std::string& app, uint64_t position) const;
  // What a socket of `app` is fed from (Feed::bind).
  // Fills every app's FeedSource once its delivery has started (its topic identity is known) and
  // before the server starts: the sockets read it from their io threads without a lock.
  void start_feeds();

  // Runs `work` for each reader on the reader's io thread: one post per thread, not per reader
  // (a round of the fan-out, the progress tick).
  void on_reader_threads(std::vector<std::shared_ptr<fanout::Reader>>&& readers,
                         const std::function<void(fanout::Reader&)>& work);
  // fanout::DeliveryHost, from an app's dispatcher thread.
  void take(std::vector<std::shared_ptr<fanout::Reader>>&& readers) override;
  void progress(std::vector<std::shared_ptr<fanout::Reader>>&& readers,
                fanout::ProgressTick tick) override;
  void on_round(const std::string& app, const std::vector<double>& delays) override;
  void on_progress(const std::string& app, size_t visited) override;
  void on_disconnect(const std::string& app, const window::Disconnect& disconnect) override;
  void disconnect(std::vector<std::shared_ptr<fanout::Reader>>&& readers,
                  const std::string& reason) override;
  // SIGTERM, in the replica's order (Replica::stop): close_sockets(), the listeners closed,
  // io.stop_and_join(), every app's delivery stopped, then shut_down().
  // Every socket closes with 1012, also those that open meanwhile (Session::start), until none is
  // left or `grace` passed.
  void close_sockets(std::chrono::milliseconds grace);
  // After the io threads joined and the deliveries stopped (a round or a tick posted after the
  // drain would hold its sessions for good): closes what is left and lets every pending handler
  // finish on this thread, so no handler keeps a session, and through it this context, alive.
  void shut_down();
  // The readers of every app's hub (a socket joins its app's hub once its app is known).
  std::vector<std::shared_ptr<fanout::Reader>> readers() const;
  size_t reader_count() const;
  // A socket of no app on this replica (refused at start, closing): in no hub, so shut_down()
  // finds it here. Without this, one still closing at the stop held itself through its
  // transport for good (a leak LeakSanitizer found). Any thread.
  void add_unserved(std::weak_ptr<Session> session);

  // Database workers hand results back through here: once the server has stopped, a result is
  // dropped on the worker instead of queued on an io_context that no longer runs (the handler
  // would hold its session, the session this context, the context the io_context: a leak).
  template <class Executor, class Handler>
  void post_from_worker(const Executor& executor, Handler&& handler) {
    std::lock_guard lock(worker_post_mutex);
    if (workers_may_post) boost::asio::post(executor, std::forward<Handler>(handler));
  }
  void forbid_worker_posts() {
    std::lock_guard lock(worker_post_mutex);
    workers_may_post = false;
  }

 private:
  // What the gauge outlive_access_decisions reads; the registry may outlive this context.
  struct DecisionsProbe {
    std::mutex mutex;
    const access::Decisions* decisions = nullptr;
  };
  std::shared_ptr<DecisionsProbe> decisions_probe = std::make_shared<DecisionsProbe>();
  std::mutex worker_post_mutex;
  bool workers_may_post = true;
  std::mutex unserved_mutex;
  std::vector<std::weak_ptr<Session>> unserved;  // pruned of the gone as it grows
  size_t unserved_pruned_at = 0;
};

}  // namespace outlive::session
