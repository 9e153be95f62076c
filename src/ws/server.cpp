// Boost.Beast lives in this translation unit only (it is heavy to compile).
#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include "ws/server.hpp"

#include <sys/socket.h>
#include <sys/uio.h>

#include <array>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/container/small_vector.hpp>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "access/decisions.hpp"
#include "auth/auth.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "db/pool.hpp"
#include "metrics/metrics.hpp"
#include "schema/validator.hpp"
#include "topic/cursor.hpp"
#include "window/app_window.hpp"
#include "window/window.hpp"
#include "ws/framing.hpp"
#include "ws/limits.hpp"
#include "ws/protocol.hpp"

namespace outlive::ws {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = net::ip::tcp;
using json = nlohmann::json;

namespace {

enum CloseCode : uint16_t {
  kPolicy = 1008,
  kTooBig = 1009,
  kInternal = 1011,
  kRestart = 1012,
  kTryAgain = 1013,
};

// A websocket frame to send, already framed: the header, then this socket's own bytes, then bytes
// shared with other sockets (an update's data, serialised once). Written with writev as it is.
struct Frame {
  FrameHeader header;
  std::string own;
  std::shared_ptr<const std::string> head;    // an update head this socket reuses
  std::shared_ptr<const std::string> shared;  // the update's key, cursor and data
  bool replay = false;  // counted against the replay's buffer (512 KiB), not the live one

  static Frame text(std::string text) {
    Frame f;
    f.header = frame_header(Opcode::text, text.size());
    f.own = std::move(text);
    return f;
  }
  static Frame update(std::shared_ptr<const std::string> head,
                      std::shared_ptr<const std::string> shared) {
    Frame f;
    f.header = frame_header(Opcode::text, head->size() + shared->size());
    f.head = std::move(head);
    f.shared = std::move(shared);
    return f;
  }
  static Frame control(Opcode opcode, std::string payload) {
    Frame f;
    f.header = frame_header(opcode, payload.size());
    f.own = std::move(payload);
    return f;
  }
  bool is(Opcode opcode) const { return (header.bytes[0] & 0x0F) == static_cast<uint8_t>(opcode); }
  size_t size() const {
    return header.size + own.size() + (head ? head->size() : 0) + (shared ? shared->size() : 0);
  }
};

// An update as the dispatcher hands it out: built once, shared by every socket that follows its
// key (one reference count per socket instead of three).
struct OutgoingUpdate {
  window::UpdatePtr update;
  std::shared_ptr<const std::string> tail;  // key, cursor and data; null for updates without data
  std::string cursor;
};

// The viewer's access to the update's key, per channel it follows the key through (usually one).
using ChannelAccess = boost::container::small_vector<std::pair<std::string, bool>, 2>;

// An update handed to one socket.
struct Delivery {
  std::shared_ptr<const OutgoingUpdate> out;
  ChannelAccess allowed;
  bool broken = false;  // authorize failed for this viewer: close 1011 instead
};

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

struct AppRuntime {
  std::string id;
  const config::App* config;
  std::map<std::string, ChannelRuntime> channels;
  std::set<std::string> origins;
  std::shared_ptr<AppGauges> gauges = std::make_shared<AppGauges>();
  std::atomic<uint64_t>* frames_sent = nullptr;
  std::atomic<uint64_t>* authorize_calls = nullptr;
};

// Runs a configured keys()/authorize() query with typed parameters: the SPEC's queries use
// $1->>'warehouse' and $1::uuid, so Postgres must know $1 is jsonb (keys) or text (authorize).
// Each pool connection prepares a statement once per query.
pqxx::result run_typed(pqxx::connection& conn, const std::string& sql, const char* types,
                       const std::string& a, const std::string& b, const char* cast_a) {
  thread_local std::pair<int, std::set<size_t>> prepared;  // (backend pid, query hashes)
  if (prepared.first != conn.backendpid()) prepared = {conn.backendpid(), {}};
  const size_t hash = std::hash<std::string>{}(std::string(types) + sql);
  const std::string name = "outlive_q" + std::to_string(hash);
  pqxx::nontransaction tx(conn);
  if (prepared.second.insert(hash).second) {
    tx.exec("PREPARE " + name + "(" + types + ") AS " + sql);
  }
  return tx.exec("EXECUTE " + name + "(" + tx.quote(a) + "::" + cast_a + ", " + tx.quote(b) +
                 "::jsonb)");
}

std::string client_address(const tcp::socket& socket, const http::request<http::string_body>& req) {
  beast::error_code ec;
  const auto remote = socket.remote_endpoint(ec);
  std::string address = ec ? "unknown" : remote.address().to_string();
  // Behind the gateway (on loopback) the client is the last X-Forwarded-For hop it added.
  if (!ec && remote.address().is_loopback()) {
    const auto forwarded = req["X-Forwarded-For"];
    if (!forwarded.empty()) {
      const auto comma = forwarded.rfind(',');
      std::string last(comma == beast::string_view::npos ? forwarded : forwarded.substr(comma + 1));
      last.erase(0, last.find_first_not_of(' '));
      if (!last.empty()) address = last;
    }
  }
  return address;
}

}  // namespace

class WsSession;

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  Impl(const config::Config& c, Services s, Settings st)
      : config(c),
        services(std::move(s)),
        settings(st),
        ioc(st.io_threads),
        acceptor(ioc),
        open_limiter(st.opens_per_second),
        socket_counter(st.max_sockets_per_viewer),
        progress_timer(ioc),
        decisions(st.decision_lifetime) {
    for (const auto& [id, app] : config.apps) {
      auto d = std::make_unique<Dispatch>();
      d->app = id;
      dispatch.emplace(id, std::move(d));
      AppRuntime rt{id, &app, {}, {app.allowed_origins.begin(), app.allowed_origins.end()}};
      for (const auto& [name, ch] : app.channels)
        rt.channels.emplace(name, ChannelRuntime{&ch, schema::Validator(ch.scope)});
      register_gauges(rt);
      apps.emplace(id, std::move(rt));
    }
  }

  const config::Config config;
  Services services;
  const Settings settings;
  // shutdown() is protected in io_context; stop() needs it to destroy handlers that never ran.
  struct IoContext : net::io_context {
    using net::io_context::io_context;
    using net::io_context::shutdown;
  };
  IoContext ioc;
  tcp::acceptor acceptor;
  std::vector<std::thread> threads;
  std::atomic<bool> stopping{false};
  OpenRateLimiter open_limiter;
  SocketCounter socket_counter;
  std::map<std::string, AppRuntime> apps;
  net::steady_timer progress_timer;

  // Fan-out registry: which sessions follow which key, and how far each app's updates have been
  // handed to sessions (subscriptions start there, so nothing falls between a sub and the live
  // feed).
  std::mutex hub_mutex;
  struct Follower {
    std::weak_ptr<WsSession> session;
    std::string viewer_id;
    std::string viewer_json;
    std::map<std::string, int>
        channels;  // channel -> subscriptions of the session following the key
  };
  std::unordered_map<std::string, std::unordered_map<WsSession*, Follower>> followers;
  // registered_through: new subscriptions start after it (set when an update's followers are
  // looked up). posted_through: every update up to it is on its way to its sockets (progress).
  std::unordered_map<std::string, uint64_t> registered_through;
  std::unordered_map<std::string, uint64_t> posted_through;
  struct SessionRef {
    std::weak_ptr<WsSession> session;
    std::string app;
  };
  std::unordered_map<WsSession*, SessionRef> sessions;

  // Access at delivery (SPEC 5.5): decisions shared by all sockets; one dispatcher thread per app
  // hands updates to sockets in topic order, asking authorize() first for viewers without a
  // decision.
  access::Decisions decisions;
  struct Dispatch {
    std::string app;
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<window::UpdatePtr> queue;
    bool stop = false;
    std::thread thread;
    std::atomic<bool> checking_access{false};  // an access update is being applied
    std::atomic<uint64_t> last_access_position{0};
    // Collections run keys() again after access updates (debounced) and every minute.
    std::atomic<bool> refresh_running{false};
    std::atomic<bool> refresh_again{false};
  };
  std::map<std::string, std::unique_ptr<Dispatch>> dispatch;
  net::steady_timer collection_timer{ioc};

  void dispatch_loop(Dispatch& d);
  void refresh_collections(const std::string& app);
  void tick_collections();

  // A cached decision is per (key, app, channel, viewer id): two apps may use the same key and
  // channel names.
  static std::string decision_id(const std::string& app, const std::string& channel,
                                 const std::string& viewer_id) {
    std::string id;
    decision_id_into(id, app, channel, viewer_id);
    return id;
  }
  static void decision_id_into(std::string& out, const std::string& app, const std::string& channel,
                               const std::string& viewer_id) {
    out.assign(app).append(1, '\x1f').append(channel).append(1, '\x1f').append(viewer_id);
  }

  static std::string hub_key(const std::string& app, const std::string& key) {
    return app + '\0' + key;
  }

  metrics::Registry& m() { return *services.metrics; }
  void register_gauges(AppRuntime& rt) {
    const metrics::Labels app{{"app", rt.id}};
    rt.frames_sent =
        &m().counter("outlive_frames_sent_total", "Update frames sent to sockets", app);
    rt.authorize_calls = &m().counter("outlive_authorize_calls_total", "authorize() calls", app);
    auto g = rt.gauges;
    m().gauge("outlive_sockets", "Open websocket sockets", app,
              [g] { return double(g->sockets.load()); });
    m().gauge("outlive_subscriptions", "Subscriptions, live or replaying from a cursor",
              {{"app", rt.id}, {"state", "live"}},
              [g] { return double(g->subscriptions.load() - g->replaying.load()); });
    m().gauge("outlive_subscriptions", "Subscriptions, live or replaying from a cursor",
              {{"app", rt.id}, {"state", "replaying"}},
              [g] { return double(g->replaying.load()); });
  }

  // Database workers hand results back through here: once the server has stopped, a result is
  // dropped on the worker instead of queued on an io_context that no longer runs (the queued
  // handler would hold its session, the session the server, the server the io_context: a leak).
  std::mutex worker_post_mutex;
  bool workers_may_post = true;
  template <class Executor, class Handler>
  void post_from_worker(const Executor& executor, Handler&& handler) {
    std::lock_guard lock(worker_post_mutex);
    if (workers_may_post) net::post(executor, std::forward<Handler>(handler));
  }

  void count_close(uint16_t code) {
    m().counter("outlive_socket_closes_total", "Sockets closed, by close code",
                {{"code", std::to_string(code)}})++;
  }

  void accept();
  void tick_progress();
  std::string cursor_at(const std::string& app, uint64_t position) {
    auto* w = services.window_of ? services.window_of(app) : nullptr;
    topic::TopicIdentity identity = w ? w->identity() : topic::TopicIdentity{app, 0};
    return topic::Cursor::at(identity, position).encode();
  }
};

// ---------------------------------------------------------------------------------------------
// Websocket session

class WsSession : public std::enable_shared_from_this<WsSession> {
 public:
  WsSession(std::shared_ptr<Server::Impl> server, tcp::socket&& socket)
      : server_(std::move(server)),
        executor_(socket.get_executor()),
        handshake_(std::make_unique<websocket::stream<beast::tcp_stream>>(std::move(socket))),
        socket_(executor_),
        check_timer_(executor_),
        recheck_timer_(executor_),
        close_timer_(executor_),
        replay_timer_(executor_),
        window_timer_(executor_) {}

  void run(http::request<http::string_body> req) {
    auto& socket = beast::get_lowest_layer(*handshake_).socket();
    address_ = client_address(socket, req);
    // A small kernel send buffer: a slow reader shows in our bounded queue (and costs little
    // kernel memory per socket) instead of hiding megabytes in the kernel. No Nagle delay: frames
    // that wait are already written together.
    beast::error_code ignored;
    socket.set_option(net::socket_base::send_buffer_size(64 * 1024), ignored);
    socket.set_option(tcp::no_delay(true), ignored);
    // Beast answers the upgrade (and refuses a bad one); the frames after it are ours.
    handshake_->set_option(websocket::stream_base::timeout::suggested(beast::role_type::server));
    handshake_->set_option(websocket::stream_base::decorator(
        [](websocket::response_type& res) { res.set(http::field::server, "outlive"); }));
    req_ = std::move(req);
    handshake_->async_accept(req_,
                             beast::bind_front_handler(&WsSession::on_accept, shared_from_this()));
  }

  // --- called through the session's strand ----------------------------------------------------

  // `allowed` holds the access decision of this socket's viewer for the update's key, per channel.
  void deliver(const OutgoingUpdate& out, const ChannelAccess& allowed) {
    if (closing_ || !viewer_) return;
    const window::UpdatePtr& update = out.update;
    const std::shared_ptr<const std::string>& tail = out.tail;
    const std::string& cursor = out.cursor;
    const std::string& key = update->key;
    std::vector<std::string>& ids = delivery_ids_;  // reused: no allocation per frame
    ids.clear();
    std::vector<std::string> ended;
    bool lost_key = false;
    for (auto& [id, sub] : subscriptions_) {
      if (sub.keys.count(key) == 0 || update->position <= sub.from) continue;
      sub.from = update->position;
      const auto decision = std::find_if(allowed.begin(), allowed.end(),
                                         [&](const auto& a) { return a.first == sub.channel; });
      if (decision == allowed.end() || !decision->second) {
        // Lost access: a single-key subscription ends, a collection drops the key and reloads.
        lost_key = true;
        if (sub.collection) {
          sub.keys.erase(key);
          enqueue(Frame::text(frames::resync(id, cursor, "access")));
        } else {
          enqueue(Frame::text(frames::revoked(id)));
          ended.push_back(id);
        }
        continue;
      }
      if (update->kind == window::Kind::resync) {
        enqueue(Frame::text(frames::resync(id, cursor, "oversized")));
      } else if (update->kind == window::Kind::data && tail) {
        ids.push_back(id);
      }
    }
    for (const auto& id : ended) {
      if (replay_ && replay_->id == id) replay_->frames.clear();  // a replay in progress stops
      end_subscription(id);
    }
    // A replay that stopped has nothing left to wait for (its timer must not close the socket).
    if (replay_ && replay_->frames.empty()) fill_replay();
    if (lost_key) unfollow_if_unused(key);
    if (!ids.empty()) {
      // The head changes only with the socket's subscriptions: build it once for a set of ids.
      if (ids != head_ids_ || !head_) {
        head_ids_ = ids;
        head_ = std::make_shared<const std::string>(frames::update_head(ids));
      }
      enqueue(Frame::update(head_, tail));
      ++frames_in_batch_;
    }
    advance_cursor(update->position);
  }

  // Updates for this socket in topic order: their frames are queued first and written together.
  void deliver_batch(const std::vector<Delivery>& batch) {
    corked_ = true;
    frames_in_batch_ = 0;
    for (const auto& d : batch) {
      if (d.broken) {
        // Nothing is skipped: the tab reconnects and resumes from its cursor.
        close_with(kInternal, "access check failed");
        break;
      }
      deliver(*d.out, d.allowed);
    }
    if (frames_in_batch_ > 0) *app_rt_->frames_sent += frames_in_batch_;
    corked_ = false;
    do_write();
  }

  // The dispatcher hands this socket its part of each round through a mailbox (any thread). A
  // handler is posted only when the mailbox was empty: when the io threads fall behind, the rounds
  // that arrive meanwhile wait in the mailbox and the one handler takes them all, so their frames
  // leave in one system call, and no socket waits for a later round to write.
  // Returns true when the caller must post take_mailbox().
  bool add_to_mailbox(std::vector<Delivery>&& deliveries) {
    std::lock_guard lock(mailbox_mutex_);
    const bool was_empty = mailbox_.empty();
    if (was_empty) {
      mailbox_ = std::move(deliveries);
    } else {
      for (auto& d : deliveries) mailbox_.push_back(std::move(d));
    }
    return was_empty;
  }

  void take_mailbox() {
    std::vector<Delivery> batch;
    {
      std::lock_guard lock(mailbox_mutex_);
      batch.swap(mailbox_);
    }
    deliver_batch(batch);
  }

  // How far this socket's subscriptions have been brought (any thread): progress skips sockets
  // that are there already.
  uint64_t cursor_position() const { return cursor_mirror_.load(std::memory_order_relaxed); }

  const auth::Viewer& viewer() const { return *viewer_; }
  const std::string& app() const { return app_; }

  // keys() again for this socket's collections (after an access update, and every minute); a
  // collection whose key set changed receives resync (keys_changed). Runs that are asked for while
  // one runs share one more run.
  void refresh_collections() {
    if (closing_ || !viewer_) return;
    if (refreshing_ || checking_) {
      refresh_pending_ = true;
      return;
    }
    std::vector<std::tuple<std::string, std::string, std::string>> todo;  // id, channel, scope
    for (const auto& [id, sub] : subscriptions_) {
      if (sub.collection) todo.emplace_back(id, sub.channel, sub.scope);
    }
    if (todo.empty()) return;
    refreshing_ = true;
    const std::string viewer = viewer_->to_json().dump();
    const std::string viewer_id = viewer_->id;
    auto* decisions = &server_->decisions;
    const AppRuntime* app = app_rt_;
    const size_t max_keys = server_->settings.max_keys;
    check(
        [todo, viewer, viewer_id, decisions, app, max_keys](pqxx::connection& conn) {
          json result = json::object();
          for (const auto& [id, channel, scope] : todo) {
            const auto* ch = app->channels.at(channel).config;
            result[id] = allowed_keys(conn, *ch, channel, scope, viewer, viewer_id, *decisions,
                                      max_keys, app->id);
          }
          return result;
        },
        [this](const json& result) {
          refreshing_ = false;
          for (const auto& [id, keys_json] : result.items()) {
            auto it = subscriptions_.find(id);
            if (it == subscriptions_.end()) continue;
            auto keys = keys_json["keys"].get<std::set<std::string>>();
            if (keys == it->second.keys) continue;
            const auto old_keys = it->second.keys;
            follow(keys, it->second.channel);
            it->second.keys = std::move(keys);
            for (const auto& k : old_keys) {
              if (it->second.keys.count(k) == 0) unfollow(k, it->second.channel);
            }
            enqueue(Frame::text(
                frames::resync(id, server_->cursor_at(app_, it->second.from), "keys_changed")));
          }
          if (std::exchange(refresh_pending_, false)) refresh_collections();
          process_next();
        });
  }

  void progress(uint64_t position) {
    if (closing_ || subscriptions_.empty() || position <= last_cursor_position_) return;
    // At most once a second, even when a tick reaches us late and the next one on time.
    const auto now = std::chrono::steady_clock::now();
    if (now - last_progress_at_ < std::chrono::seconds(1)) return;
    last_progress_at_ = now;
    advance_cursor(position);
    for (auto& [id, sub] : subscriptions_) sub.from = std::max(sub.from, position);
    enqueue(Frame::text(frames::progress(server_->cursor_at(app_, position))));
  }

  void shutdown(uint16_t code, const std::string& reason) { close_with(code, reason); }

  // After the io threads stopped: drop the connection so every pending handler completes and
  // releases the session (and the server it holds).
  void force_close() {
    closing_ = true;
    check_timer_.cancel();
    recheck_timer_.cancel();
    close_timer_.cancel();
    replay_timer_.cancel();
    window_timer_.cancel();
    beast::error_code ignored;
    socket_.close(ignored);
  }

  // The session's strand: every member below runs on it.
  net::any_io_executor executor() { return executor_; }

  void progress_from(const std::unordered_map<std::string, uint64_t>& delivered_through) {
    if (auto it = delivered_through.find(app_); it != delivered_through.end()) progress(it->second);
  }

  ~WsSession() {
    if (counted_viewer_) server_->socket_counter.remove(viewer_->id);
    finished_ = true;
    sync_gauges();
  }

 private:
  struct Subscription {
    std::string channel;
    std::set<std::string> keys;
    uint64_t from = 0;  // the last position this subscription has been brought to
    bool collection = false;
    std::string scope;  // JSON text, for keys() again
  };

  void on_accept(beast::error_code ec) {
    if (ec) return;
    socket_ = handshake_->next_layer().release_socket();
    handshake_.reset();
    socket_.non_blocking(true, ec);
    if (ec) return;
    server_->m().counter("outlive_sockets_opened_total", "Websocket sockets accepted")++;
    app_ = app_from_target();
    {
      std::lock_guard lock(server_->hub_mutex);
      server_->sessions[this] = Server::Impl::SessionRef{weak_from_this(), app_};
    }
    do_read();  // also notices the peer's close while we check who it is
    if (auto app = server_->apps.find(app_); app != server_->apps.end()) app_rt_ = &app->second;
    sync_gauges();
    if (server_->stopping) return close_with(kRestart, "replica stopping");
    if (!app_rt_) return refuse("unknown_app", "no app \"" + app_ + "\" on this replica");
    const auto credential =
        auth::credential_from(req_[http::field::cookie], req_[http::field::authorization],
                              server_->config.auth.session_cookie);
    const bool by_cookie = credential && credential->kind == auth::CredentialKind::session_cookie;
    opened_at_ = std::chrono::steady_clock::now();
    if (!by_cookie && !server_->open_limiter.allow("addr:" + address_, opened_at_)) {
      return refuse_retry("rate_limited", "too many sockets opened from this address");
    }
    if (!credential) return refuse("unauthorized", "no credential");
    const auto origin = std::string(req_[http::field::origin]);
    if (by_cookie && !origin.empty() && app_rt_->origins.count(origin) == 0) {
      return refuse("forbidden_origin",
                    "origin " + origin + " may not open sockets of \"" + app_ + "\"");
    }
    credential_ = *credential;
    check([this](pqxx::connection& conn) { return json(resolve(conn)); },
          [this, by_cookie](const json& viewer) {
            if (viewer.is_null())
              return refuse("unauthorized", "unknown, expired or revoked credential");
            viewer_ = viewer_from(viewer);
            // Counted at the time the socket opened, whenever its check finished.
            if (by_cookie &&
                !server_->open_limiter.allow("person:" + viewer_->access_subject, opened_at_)) {
              return refuse_retry("rate_limited", "too many sockets opened by this person");
            }
            if (!server_->socket_counter.try_add(viewer_->id)) {
              return refuse_retry("too_many_sockets",
                                  "this viewer has too many sockets on this replica");
            }
            counted_viewer_ = true;
            schedule_recheck();
            ready_ = true;
            process_next();
          });
  }

  // --- credential -----------------------------------------------------------------------------

  json resolve(pqxx::connection& conn) {
    const auto v = server_->services.authenticator->resolve(conn, credential_);
    if (!v) return nullptr;
    return json{{"id", v->id},
                {"actor", v->actor},
                {"accessSubject", v->access_subject},
                {"scopes", v->scopes ? json(*v->scopes) : json(nullptr)},
                {"appSession", v->app_session}};
  }

  static auth::Viewer viewer_from(const json& j) {
    auth::Viewer v;
    v.id = j["id"];
    v.actor = j["actor"];
    v.access_subject = j["accessSubject"];
    if (!j["scopes"].is_null()) v.scopes = j["scopes"].get<std::vector<std::string>>();
    v.app_session = j["appSession"];
    return v;
  }

  void schedule_recheck() {
    recheck_timer_.expires_after(server_->settings.recheck_interval);
    recheck_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || self->closing_) return;
      self->check([self](pqxx::connection& conn) { return json(self->resolve(conn)); },
                  [self](const json& viewer) {
                    if (viewer.is_null() || viewer["id"] != self->viewer_->id) {
                      return self->refuse("unauthorized", "the credential expired or was revoked");
                    }
                    self->schedule_recheck();
                    self->process_next();
                  });
    });
  }

  // Runs `work` on a database worker; `then` runs on our strand with its result. A check that
  // throws or takes longer than the deadline closes the socket with 1011: nothing is skipped, the
  // tab reconnects and resumes from its cursor. One check at a time per socket.
  void check(std::function<json(pqxx::connection&)> work, std::function<void(const json&)> then) {
    checking_ = true;
    const uint64_t ticket = ++check_ticket_;
    check_timer_.expires_after(server_->settings.check_timeout);
    check_timer_.async_wait([self = shared_from_this(), ticket](beast::error_code ec) {
      if (ec || ticket != self->check_ticket_ || !self->checking_) return;
      self->checking_ = false;
      log::warn("access check timed out", {{"app", self->app_}});
      self->close_with(kInternal, "access check timed out");
    });
    auto self = shared_from_this();
    server_->services.pool->post(
        [self, ticket, work = std::move(work), then = std::move(then)](pqxx::connection& conn) {
          json result;
          std::string failure;
          try {
            result = work(conn);
          } catch (const std::exception& e) {
            failure = e.what();
          }
          self->server_->post_from_worker(
              self->executor_, [self, ticket, result = std::move(result), failure, then] {
                if (ticket != self->check_ticket_ || !self->checking_ || self->closing_) return;
                self->checking_ = false;
                self->check_timer_.cancel();
                if (!failure.empty()) {
                  log::error("access check failed", {{"app", self->app_}, {"error", failure}});
                  return self->close_with(kInternal, "access check failed");
                }
                then(result);
              });
        });
  }

  // --- reading --------------------------------------------------------------------------------

  // Waits for bytes, then reads what the kernel has into a buffer shared by the sockets of this
  // thread: an idle socket holds no read buffer of its own.
  void do_read() {
    if (reading_ || finished_) return;
    reading_ = true;
    socket_.async_wait(tcp::socket::wait_read,
                       beast::bind_front_handler(&WsSession::on_readable, shared_from_this()));
  }

  void on_readable(beast::error_code ec) {
    reading_ = false;
    if (ec || finished_) return finish();
    thread_local std::array<char, 64 * 1024> chunk;
    const size_t n = socket_.read_some(net::buffer(chunk), ec);
    if (ec == net::error::would_block || ec == net::error::try_again) return do_read();
    if (ec) return finish();  // the peer went away without a close frame
    reader_.feed(chunk.data(), n);
    take_incoming();
    process_next();
  }

  // Takes the messages and control frames read so far. At most 24 messages wait; beyond that the
  // socket is not read until there is room (the rest stays in the kernel, or in reader_).
  void take_incoming() {
    const auto room = [this] {
      return closing_ || static_cast<int>(inbox_.size()) < server_->settings.max_waiting_messages;
    };
    while (room() && !finished_) {
      auto in = reader_.next();
      if (!in) break;
      switch (in->kind) {
        case Incoming::Kind::text:
          if (!closing_) inbox_.push_back(std::move(in->payload));
          break;
        case Incoming::Kind::binary:
          // Answered in order with invalid_message.
          if (!closing_) inbox_.push_back(std::nullopt);
          break;
        case Incoming::Kind::ping:
          send_control(Opcode::pong, std::move(in->payload));
          break;
        case Incoming::Kind::pong:
          break;
        case Incoming::Kind::close:
          return on_peer_close(in->code);
        case Incoming::Kind::failure:
          // The bytes that follow cannot be trusted: close without waiting for an answer.
          log::info("websocket protocol error", {{"app", app_}, {"error", in->payload}});
          failed_ = true;
          drop_queue();  // the close goes out next (a frame partly written is finished first)
          return close_with(in->code, in->payload);
      }
    }
    if (room()) do_read();
  }

  void process_next() {
    if (!ready_ || checking_ || closing_ || replay_ || waiting_for_window_ || inbox_.empty())
      return;
    auto message = std::move(inbox_.front());
    inbox_.pop_front();
    if (!reading_) take_incoming();
    if (closing_) return;  // the tab closed, or broke the protocol, meanwhile
    if (!message) {
      send_error("invalid_message", "binary frames are not accepted; send JSON text", std::nullopt);
      return process_next();
    }
    auto parsed = parse_client_message(*message);
    if (auto* err = std::get_if<ProtocolError>(&parsed)) {
      send_error(err->code, err->message, err->id);
      return process_next();
    }
    if (auto* unsub = std::get_if<UnsubMessage>(&parsed)) {
      handle_unsub(*unsub);
      return process_next();
    }
    handle_sub(std::get<SubMessage>(parsed));
    if (!checking_ && !replay_) process_next();
  }

  void handle_unsub(const UnsubMessage& m) {
    if (subscriptions_.count(m.id) == 0)
      return send_error("not_found", "no subscription \"" + m.id + "\"", m.id);
    end_subscription(m.id);
  }

  void end_subscription(const std::string& id) {
    auto it = subscriptions_.find(id);
    if (it == subscriptions_.end()) return;
    const Subscription sub = std::move(it->second);
    subscriptions_.erase(it);
    for (const auto& k : sub.keys) unfollow(k, sub.channel);
    update_subscription_gauge(-1);
  }

  void handle_sub(SubMessage m) {
    if (subscriptions_.count(m.id) != 0)
      return send_error("duplicate_id", "subscription id in use", m.id);
    if (static_cast<int>(subscriptions_.size()) >= server_->settings.max_subscriptions) {
      return send_error("too_many_subscriptions",
                        "at most " + std::to_string(server_->settings.max_subscriptions) +
                            " subscriptions per socket",
                        m.id);
    }
    auto ch = app_rt_->channels.find(m.channel);
    if (ch == app_rt_->channels.end())
      return send_error("unknown_channel", "no channel \"" + m.channel + "\"", m.id);
    if (auto failure = ch->second.scope.check(m.scope)) {
      send_error("invalid_scope", "scope does not match the channel: " + *failure, m.id);
      return close_with(kPolicy, "invalid scope");
    }
    if (wait_for_window(m)) return;
    const config::Channel* channel = ch->second.config;
    const std::string channel_name = m.channel;
    const std::string scope = m.scope.dump();
    const std::string viewer = viewer_->to_json().dump();
    const std::string viewer_id = viewer_->id;
    auto* decisions = &server_->decisions;
    const size_t max_keys = server_->settings.max_keys;
    const std::string app = app_;
    check(
        [=](pqxx::connection& conn) {
          return allowed_keys(conn, *channel, channel_name, scope, viewer, viewer_id, *decisions,
                              max_keys, app);
        },
        [this, m, collection = channel->collection, scope](const json& result) {
          const auto& keys = result["keys"];
          // keys() null, or a single-key resource the viewer may not read: not_found, the socket
          // stays.
          if (!collection && keys.empty()) {
            if (decided_before_access_update(result["generations"])) return retry_sub(m);
            return send_error("not_found", "nothing to follow for this scope", m.id);
          }
          if (!start_subscription(m, keys.get<std::set<std::string>>(), collection, scope,
                                  result["generations"])) {
            return retry_sub(m);
          }
          sync_gauges();
          if (!replay_) process_next();
        });
  }

  // A cursor ahead of this replica's window is usually one from a replica that read the topic a
  // moment earlier (a tab that failed over): wait a little for the window to catch up instead of
  // answering resync. Only a cursor still beyond the head after the wait gets resync/topic.
  // Returns true while waiting; the sub is handled again when the window moved or time is up.
  bool wait_for_window(const SubMessage& m) {
    auto* window = server_->services.window_of ? server_->services.window_of(app_) : nullptr;
    const auto cursor = m.cursor && window ? topic::Cursor::decode(*m.cursor) : std::nullopt;
    if (!cursor || !cursor->belongs_to(window->identity()) ||
        cursor->position <= window->window().head()) {
      window_wait_.reset();
      return false;
    }
    const auto now = std::chrono::steady_clock::now();
    if (!window_wait_ || window_wait_->first != m.id) {
      window_wait_.emplace(m.id, now + server_->settings.window_catch_up_wait);
    }
    if (now >= window_wait_->second) {
      window_wait_.reset();
      return false;
    }
    waiting_for_window_ = true;
    window_timer_.expires_after(std::chrono::milliseconds(20));
    window_timer_.async_wait([self = shared_from_this(), m](beast::error_code ec) {
      self->waiting_for_window_ = false;
      if (ec || self->closing_) return;
      self->retry_sub(m);
    });
    return true;
  }

  // keys(scope, viewer), at most max_keys, keeping those the viewer may read (cached decisions).
  // Runs on a database worker.
  static json allowed_keys(pqxx::connection& conn, const config::Channel& channel,
                           const std::string& channel_name, const std::string& scope,
                           const std::string& viewer, const std::string& viewer_id,
                           access::Decisions& decisions, size_t max_keys, const std::string& app) {
    const auto rows = run_typed(conn, channel.keys_sql, "jsonb, jsonb", scope, viewer, "jsonb");
    std::vector<std::string> keys;
    for (const auto& r : rows) {
      if (r[0].is_null()) continue;
      if (keys.size() >= max_keys) {
        log::warn(
            "a subscription follows only its first keys",
            {{"app", app}, {"channel", channel_name}, {"limit", max_keys}, {"keys", rows.size()}});
        break;
      }
      keys.push_back(r[0].as<std::string>());
    }
    json allowed = json::array();
    json generations = json::object();
    const std::string viewers = "[" + viewer + "]";
    const std::string decision_id = Server::Impl::decision_id(app, channel_name, viewer_id);
    for (const auto& k : keys) {
      const auto now = access::Decisions::Clock::now();
      const uint64_t generation = decisions.generation(k);
      auto decision = decisions.get(k, decision_id, now);
      if (!decision) {
        decision =
            !run_typed(conn, channel.authorize_sql, "text, jsonb", k, viewers, "text").empty();
        decisions.put_if_current(k, decision_id, *decision, now, generation);
      }
      if (*decision) allowed.push_back(k);
      generations[k] = generation;
    }
    return json{{"keys", allowed}, {"generations", generations}};
  }

  // True when an access update of one of `keys` was read since their decisions were made.
  bool decided_before_access_update(const json& generations) const {
    for (const auto& [key, generation] : generations.items()) {
      if (server_->decisions.generation(key) != generation.get<uint64_t>()) return true;
    }
    return false;
  }

  // An access update of the sub's keys was read while its check ran: check again (the answer
  // may be from before it).
  void retry_sub(const SubMessage& m) {
    json again{{"type", "sub"}, {"id", m.id}, {"channel", m.channel}, {"scope", m.scope}};
    if (m.cursor) again["cursor"] = *m.cursor;
    inbox_.push_front(again.dump());
    process_next();
  }

  // Returns false (and follows nothing) when the decisions behind `keys` predate an access update.
  bool start_subscription(const SubMessage& m, std::set<std::string> keys, bool collection,
                          const std::string& scope, const json& generations) {
    auto* window = server_->services.window_of ? server_->services.window_of(app_) : nullptr;
    const uint64_t from = follow(keys, m.channel);
    // Registered first, then compared: an access update read after this includes us in its
    // re-check; one read before it shows in the generation.
    if (decided_before_access_update(generations)) {
      for (const auto& k : keys) unfollow(k, m.channel);
      return false;
    }
    Subscription sub{m.channel, std::move(keys), from, collection, scope};
    update_subscription_gauge(+1);
    // Gauges first: the frame may reach the tab before this handler returns.
    if (!m.cursor) {
      subscriptions_.emplace(m.id, sub);
      sync_gauges();
      advance_cursor(from);
      enqueue(Frame::text(frames::subscribed(m.id, server_->cursor_at(app_, from))));
      return true;
    }
    auto resync = [&](std::string_view reason) {
      subscriptions_.emplace(m.id, sub);
      sync_gauges();
      advance_cursor(from);  // a progress frame never goes back behind this cursor
      enqueue(Frame::text(frames::resync(m.id, server_->cursor_at(app_, from), reason)));
    };
    const auto cursor = topic::Cursor::decode(*m.cursor);
    const bool same_topic = window && cursor && cursor->belongs_to(window->identity());
    if (!same_topic || cursor->position > window->window().head()) return resync("topic"), true;
    auto missed = window->window().since(cursor->position);
    if (!missed) return resync("window"), true;
    // An answer from before an access update must release nothing published after it (SPEC 5.6).
    const auto& dispatch = *server_->dispatch.at(app_);
    if (dispatch.checking_access) return resync("access"), true;
    if (collection && cursor->position < dispatch.last_access_position)
      return resync("access"), true;
    // Live delivery of this subscription continues after `from`; the replay brings (cursor, from].
    // It holds the window's own updates and builds each frame only as it enters the send queue,
    // so a replaying tab costs at most its send buffer, not a copy of what it missed.
    Replay replay{m.id, {}};
    for (const auto& u : *missed) {
      if (u->position > from) break;
      if (sub.keys.count(u->key) == 0) continue;
      if (u->kind == window::Kind::resync || (u->kind == window::Kind::data && u->data_json)) {
        replay.frames.push_back(u);
      }
    }
    sub.from = std::max(from, cursor->position);
    advance_cursor(sub.from);
    subscriptions_.emplace(m.id, sub);
    sync_gauges();
    enqueue(Frame::text(frames::subscribed(m.id, *m.cursor)));
    if (replay.frames.empty()) return true;
    replay_ = std::move(replay);
    sync_gauges();
    pump_replay();
    return true;
  }

  // A replay fills the send buffer up to 512 KiB and continues as the tab reads; it may wait for
  // room 10 s in total. Frames that arrive meanwhile wait in a second buffer of at most 256 KiB,
  // sent after the replay (SPEC 5.7).
  void pump_replay() {
    fill_replay();
    do_write();
  }

  // Queues what fits of the replay; ends the replay once all of it is queued.
  void fill_replay() {
    if (!replay_ || closing_) return;
    const size_t limit = server_->settings.replay_send_buffer_bytes;
    while (!replay_->frames.empty()) {
      const auto& u = replay_->frames.front();
      // An estimate good enough to decide whether it fits before building it.
      const size_t estimate = (u->data_json ? u->data_json->size() : 0) + u->key.size() + 128;
      if (!queue_.empty() && queued_bytes_ + estimate > limit) break;
      const std::string cursor = server_->cursor_at(app_, u->position);
      Frame frame =
          u->kind == window::Kind::resync
              ? Frame::text(frames::resync(replay_->id, cursor, "oversized"))
              : Frame::update(
                    std::make_shared<const std::string>(frames::update_head({replay_->id})),
                    std::make_shared<const std::string>(
                        frames::update_tail(u->key, cursor, *u->data_json)));
      frame.replay = true;
      queued_bytes_ += frame.size();
      replay_bytes_queued_ += frame.size();
      queue_.push_back(std::move(frame));
      replay_->frames.pop_front();
    }
    if (replay_->frames.empty()) {
      replay_.reset();
      sync_gauges();
      replay_timer_.cancel();
      auto held = std::move(held_);
      held_.clear();
      held_bytes_ = 0;
      for (auto& f : held) enqueue(std::move(f));
      // Messages that waited for the replay are handled once this handler is done.
      net::post(executor_, [self = shared_from_this()] { self->process_next(); });
      return;
    }
    if (!replay_->waiting) {
      replay_->waiting = true;
      replay_->waiting_since = std::chrono::steady_clock::now();
      replay_timer_.expires_after(server_->settings.replay_wait - replay_->waited);
      replay_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
        if (ec || !self->replay_ || !self->replay_->waiting) return;
        log::info("replay waited too long for a slow reader", {{"app", self->app_}});
        self->close_with(kTryAgain, "slow reader during replay");
      });
    }
  }

  // The tab read some of the replay: its wait for room stops counting.
  void replay_made_room() {
    if (!replay_ || !replay_->waiting) return;
    replay_->waited += std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - replay_->waiting_since);
    replay_->waiting = false;
    replay_timer_.cancel();
  }

  // Registers this socket as a follower of `keys` for `channel`; returns the position live
  // delivery starts after.
  uint64_t follow(const std::set<std::string>& keys, const std::string& channel) {
    std::lock_guard lock(server_->hub_mutex);
    const std::string viewer_json = viewer_->to_json().dump();
    for (const auto& k : keys) {
      auto& f = server_->followers[Server::Impl::hub_key(app_, k)][this];
      if (f.session.expired())
        f = Server::Impl::Follower{weak_from_this(), viewer_->id, viewer_json, {}};
      f.channels[channel]++;
    }
    return server_->registered_through[app_];
  }

  void unfollow(const std::string& key, const std::string& channel) {
    std::lock_guard lock(server_->hub_mutex);
    auto it = server_->followers.find(Server::Impl::hub_key(app_, key));
    if (it == server_->followers.end()) return;
    auto f = it->second.find(this);
    if (f == it->second.end()) return;
    if (--f->second.channels[channel] <= 0) f->second.channels.erase(channel);
    if (f->second.channels.empty()) it->second.erase(f);
    if (it->second.empty()) server_->followers.erase(it);
  }

  void unfollow_if_unused(const std::string& key) {
    // follow() counts per channel; a key dropped by deliver() is released for its channels.
    std::map<std::string, int> still;
    for (const auto& [id, sub] : subscriptions_) {
      if (sub.keys.count(key)) still[sub.channel]++;
    }
    std::lock_guard lock(server_->hub_mutex);
    auto it = server_->followers.find(Server::Impl::hub_key(app_, key));
    if (it == server_->followers.end()) return;
    auto f = it->second.find(this);
    if (f == it->second.end()) return;
    f->second.channels = still;
    if (still.empty()) it->second.erase(f);
    if (it->second.empty()) server_->followers.erase(it);
  }

  void advance_cursor(uint64_t position) {
    last_cursor_position_ = std::max(last_cursor_position_, position);
    cursor_mirror_.store(last_cursor_position_, std::memory_order_relaxed);
  }

  void update_subscription_gauge(int delta) {
    server_->m().counter(
        delta > 0 ? "outlive_subscriptions_started_total" : "outlive_subscriptions_ended_total",
        "Subscriptions started or ended", {{"app", app_}})++;
    sync_gauges();
  }

  // --- writing --------------------------------------------------------------------------------

  void send_error(const std::string& code, const std::string& message,
                  const std::optional<std::string>& id) {
    enqueue(Frame::text(frames::error(code, message, id)));
  }

  // Refused: error frame, then close 1008 so clients stop instead of retrying.
  void refuse(const std::string& code, const std::string& message) {
    send_error(code, message, std::nullopt);
    close_with(kPolicy, code);
  }
  // Refused for now: error frame, then close 1013 (back off and come back).
  void refuse_retry(const std::string& code, const std::string& message) {
    send_error(code, message, std::nullopt);
    close_with(kTryAgain, code);
  }

  void enqueue(Frame frame) {
    if (closing_) return;
    if (replay_) {
      if (held_bytes_ + frame.size() > server_->settings.send_buffer_bytes) {
        log::info("slow reader closed during replay", {{"app", app_}});
        return close_with(kTryAgain, "slow reader");
      }
      held_bytes_ += frame.size();
      held_.push_back(std::move(frame));
      return;
    }
    const size_t limit = server_->settings.send_buffer_bytes + replay_bytes_queued_;
    if (queued_bytes_ + frame.size() > limit && !queue_.empty()) {
      // A slow reader: drop what waits (the tab resumes from its cursor) and close with 1013.
      // A frame partly written stays: the rest of its bytes must follow.
      drop_queue();
      log::info("slow reader closed", {{"app", app_}, {"limit_bytes", limit}});
      return close_with(kTryAgain, "slow reader");
    }
    queued_bytes_ += frame.size();
    queue_.push_back(std::move(frame));
    do_write();
  }

  // Drops every queued frame except one partly written.
  void drop_queue() {
    while (queue_.size() > (front_written_ > 0 ? 1u : 0u)) queue_.pop_back();
    queued_bytes_ = queue_.empty() ? 0 : queue_.front().size();
    replay_bytes_queued_ = !queue_.empty() && queue_.front().replay ? queued_bytes_ : 0;
  }

  // A pong, or our answer to the peer's close: not counted against the send buffer.
  void send_control(Opcode opcode, std::string payload) {
    if (close_queued_ || finished_) return;
    if (opcode == Opcode::close) close_queued_ = true;
    if (opcode == Opcode::pong) {
      // One pong waits at most, answering the latest ping (RFC 6455 5.5.3): a tab that pings and
      // never reads cannot grow the queue.
      for (auto it = queue_.rbegin(); it != queue_.rend(); ++it) {
        const bool started = it == std::prev(queue_.rend()) && front_written_ > 0;
        if (!it->is(Opcode::pong) || started) continue;
        queued_bytes_ -= it->size();
        *it = Frame::control(Opcode::pong, std::move(payload));
        queued_bytes_ += it->size();
        return;
      }
    }
    Frame f = Frame::control(opcode, std::move(payload));
    queued_bytes_ += f.size();
    queue_.push_back(std::move(f));
    do_write();
  }

  // Writes the queue with one writev per batch of frames, on this strand, without waiting: what
  // the kernel takes now is written now; when its buffer is full we wait until it has room. So
  // frames that queue while the socket is busy leave together, in one system call.
  void do_write() {
    // While a batch is being queued, writing waits for its end, unless 64 KiB wait already: the
    // kernel's buffer takes its share before ours counts towards the slow-reader limit.
    if (corked_ && queued_bytes_ < kCorkedBytes) return;
    if (writing_ || in_write_ || finished_) return;
    in_write_ = true;
    for (;;) {
      if (queue_.empty()) fill_replay();
      if (queue_.empty() || finished_) break;
      constexpr size_t kMaxFrames = 64;
      std::array<iovec, kMaxFrames * 4> iov;
      size_t parts = 0;
      size_t offered = 0;
      size_t skip = front_written_;
      size_t frames = 0;
      for (const Frame& f : queue_) {
        if (frames++ == kMaxFrames) break;
        const std::string_view pieces[4] = {
            f.header.view(), f.own, f.head ? std::string_view(*f.head) : std::string_view(),
            f.shared ? std::string_view(*f.shared) : std::string_view()};
        for (auto piece : pieces) {
          if (skip >= piece.size()) {
            skip -= piece.size();
            continue;
          }
          piece.remove_prefix(skip);
          skip = 0;
          iov[parts++] = iovec{const_cast<char*>(piece.data()), piece.size()};
          offered += piece.size();
        }
        if (f.is(Opcode::close)) break;  // nothing follows it
      }
      msghdr msg{};
      msg.msg_iov = iov.data();
      msg.msg_iovlen = parts;
      const ssize_t written = ::sendmsg(socket_.native_handle(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (written < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          wait_writable();
          break;
        }
        finish();  // the peer is gone
        break;
      }
      if (consume(static_cast<size_t>(written))) break;  // the close frame went out
      if (static_cast<size_t>(written) < offered) {
        wait_writable();
        break;
      }
    }
    in_write_ = false;
    if (!writing_ && queue_.empty()) maybe_close();
  }

  // Takes `written` bytes off the front of the queue. True once the close frame is out.
  bool consume(size_t written) {
    bool popped = false;
    while (written > 0 && !queue_.empty()) {
      Frame& f = queue_.front();
      const size_t left = f.size() - front_written_;
      if (written < left) {
        front_written_ += written;
        break;
      }
      written -= left;
      front_written_ = 0;
      queued_bytes_ -= f.size();
      if (f.replay) replay_bytes_queued_ -= f.size();
      const bool close = f.is(Opcode::close);
      queue_.pop_front();
      popped = true;
      if (close) {
        on_close_sent();
        return true;
      }
    }
    if (popped && replay_) {
      replay_made_room();
      fill_replay();
    }
    return false;
  }

  void wait_writable() {
    writing_ = true;
    socket_.async_wait(tcp::socket::wait_write, [self = shared_from_this()](beast::error_code ec) {
      self->writing_ = false;
      if (ec || self->finished_) return self->finish();
      self->do_write();
    });
  }

  void close_with(uint16_t code, const std::string& reason) {
    if (close_code_ || peer_close_) return;
    close_code_ = code;
    close_reason_ = reason;
    begin_closing();
    server_->count_close(code);
    start_close_timer();
    // Frames queued before the close (an error frame) go out first.
    do_write();
    // Then the tab's answer to our close, maybe already read (after a failure nothing is read).
    if (!failed_) take_incoming();
  }

  // The tab closes: answer with its code after the frame being written (nothing else is sent).
  void on_peer_close(uint16_t code) {
    if (close_sent_) return terminate();  // the answer to our close
    if (peer_close_) return;
    peer_close_ = code;
    if (close_queued_) return;  // our close, on its way, answers it
    begin_closing();
    drop_queue();
    start_close_timer();
    do_write();
  }

  // Nothing new starts once the socket closes: no replay, no checks, no waits for the window.
  void begin_closing() {
    closing_ = true;
    replay_.reset();
    sync_gauges();
    replay_timer_.cancel();
    window_timer_.cancel();
    check_timer_.cancel();
    recheck_timer_.cancel();
  }

  // If the peer does not take the close in time (it stopped reading), drop the connection.
  void start_close_timer() {
    close_timer_.expires_after(std::chrono::seconds(10));
    close_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec) return;
      self->terminate();
    });
  }

  void maybe_close() {
    if (!closing_ || writing_ || close_queued_ || !queue_.empty() || finished_) return;
    if (peer_close_) {
      send_control(Opcode::close,
                   *peer_close_ == 1005 ? std::string() : close_payload(*peer_close_, ""));
    } else if (close_code_) {
      send_control(Opcode::close, close_payload(*close_code_, close_reason_));
    }
  }

  void on_close_sent() {
    close_sent_ = true;
    // After answering the tab's close the connection is done; after our own close we wait for
    // the tab's answer (or the close timer).
    if (peer_close_ || failed_) terminate();
  }

  void terminate() {
    beast::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    finish();
  }

  std::string app_from_target() const {
    const std::string target(req_.target());
    const auto path = target.substr(0, target.find('?'));
    return path.substr(5, path.size() - 5 - 5);  // strip "/api/" and "/live"
  }

  // Moves this socket's share of its app's gauges to what it is now (zero once finished).
  void sync_gauges() {
    if (!app_rt_) return;
    auto& g = *app_rt_->gauges;
    const bool open = !finished_;
    const int64_t subs = open ? static_cast<int64_t>(subscriptions_.size()) : 0;
    const int64_t replaying = open && replay_ ? 1 : 0;
    g.sockets += int64_t(open) - int64_t(gauged_open_);
    g.subscriptions += subs - gauged_subscriptions_;
    g.replaying += replaying - gauged_replaying_;
    gauged_open_ = open;
    gauged_subscriptions_ = subs;
    gauged_replaying_ = replaying;
  }

  // The socket is done: leave the fan-out registry.
  void finish() {
    if (finished_) return;
    finished_ = true;
    sync_gauges();
    closing_ = true;
    check_timer_.cancel();
    recheck_timer_.cancel();
    close_timer_.cancel();
    window_timer_.cancel();
    replay_timer_.cancel();
    beast::error_code ignored;
    socket_.close(ignored);  // pending waits end
    std::lock_guard lock(server_->hub_mutex);
    server_->sessions.erase(this);
    for (const auto& [id, sub] : subscriptions_) {
      for (const auto& k : sub.keys) {
        auto it = server_->followers.find(Server::Impl::hub_key(app_, k));
        if (it == server_->followers.end()) continue;
        it->second.erase(this);
        if (it->second.empty()) server_->followers.erase(it);
      }
    }
  }

  std::shared_ptr<Server::Impl> server_;
  net::any_io_executor executor_;  // the session's strand
  // Until the upgrade is answered; then the socket moves to socket_.
  std::unique_ptr<websocket::stream<beast::tcp_stream>> handshake_;
  tcp::socket socket_;
  http::request<http::string_body> req_;
  FrameReader reader_{kMaxMessageBytes};
  net::steady_timer check_timer_;
  net::steady_timer recheck_timer_;
  net::steady_timer close_timer_;
  net::steady_timer replay_timer_;
  net::steady_timer window_timer_;
  bool waiting_for_window_ = false;
  std::vector<std::string> delivery_ids_;
  std::vector<std::string> head_ids_;  // the ids `head_` lists
  std::shared_ptr<const std::string> head_;
  std::optional<std::pair<std::string, std::chrono::steady_clock::time_point>>
      window_wait_;  // sub id, deadline
  std::string address_;
  std::chrono::steady_clock::time_point opened_at_{};
  std::string app_;
  const AppRuntime* app_rt_ = nullptr;
  auth::Credential credential_{auth::CredentialKind::bearer, ""};
  std::optional<auth::Viewer> viewer_;
  bool counted_viewer_ = false;
  bool ready_ = false;
  bool reading_ = false;
  bool checking_ = false;
  uint64_t check_ticket_ = 0;
  std::deque<std::optional<std::string>> inbox_;
  std::map<std::string, Subscription> subscriptions_;
  uint64_t last_cursor_position_ = 0;
  std::atomic<uint64_t> cursor_mirror_{0};  // last_cursor_position_, for other threads
  std::mutex mailbox_mutex_;
  std::vector<Delivery> mailbox_;  // rounds handed over and not yet taken, in topic order
  uint64_t frames_in_batch_ = 0;
  std::deque<Frame> queue_;
  size_t queued_bytes_ = 0;
  size_t front_written_ = 0;  // bytes of queue_.front() already written
  bool writing_ = false;      // waiting until the socket takes more
  bool in_write_ = false;
  bool corked_ = false;  // handing over a batch of updates: written together after it
  static constexpr size_t kCorkedBytes = 64 * 1024;
  struct Replay {
    std::string id;
    std::deque<window::UpdatePtr> frames;  // still to send, in order
    bool waiting = false;
    std::chrono::steady_clock::time_point waiting_since{};
    std::chrono::milliseconds waited{0};
  };
  std::optional<Replay> replay_;
  size_t replay_bytes_queued_ = 0;
  std::deque<Frame> held_;
  size_t held_bytes_ = 0;
  std::chrono::steady_clock::time_point last_progress_at_{};
  bool refreshing_ = false;
  bool refresh_pending_ = false;
  bool closing_ = false;
  bool close_queued_ = false;
  bool close_sent_ = false;
  std::optional<uint16_t> peer_close_;  // the tab closed with this code
  bool failed_ = false;                 // the tab broke the protocol or the message size limit
  bool finished_ = false;
  bool gauged_open_ = false;
  int64_t gauged_subscriptions_ = 0;
  int64_t gauged_replaying_ = 0;
  std::optional<uint16_t> close_code_;
  std::string close_reason_;
};

// ---------------------------------------------------------------------------------------------
// Plain HTTP: routing, health, metrics, cursor

class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(std::shared_ptr<Server::Impl> server, tcp::socket&& socket)
      : server_(std::move(server)), stream_(std::move(socket)) {}

  void run() {
    net::dispatch(stream_.get_executor(),
                  beast::bind_front_handler(&HttpSession::do_read, shared_from_this()));
  }

 private:
  void do_read() {
    parser_.emplace();
    parser_->header_limit(16 * 1024);
    parser_->body_limit(64 * 1024);
    stream_.expires_after(std::chrono::seconds(30));
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&HttpSession::on_read, shared_from_this()));
  }

  void on_read(beast::error_code ec, std::size_t) {
    if (ec) return;
    auto req = parser_->release();
    const std::string target(req.target());
    const std::string path = target.substr(0, target.find('?'));
    if (websocket::is_upgrade(req)) {
      if (path.rfind("/api/", 0) == 0 && path.size() > 10 &&
          path.substr(path.size() - 5) == "/live" && path.find('/', 5) == path.size() - 5) {
        stream_.expires_never();
        std::make_shared<WsSession>(server_, stream_.release_socket())->run(std::move(req));
        return;
      }
      return respond(req, http::status::not_found, "text/plain", "not found\n");
    }
    if (req.method() != http::verb::get)
      return respond(req, http::status::method_not_allowed, "text/plain", "GET only\n");
    if (path == "/healthz") return respond(req, http::status::ok, "text/plain", "ok\n");
    if (path == "/readyz") {
      const bool ready = server_->services.ready && server_->services.ready() && !server_->stopping;
      return respond(req, ready ? http::status::ok : http::status::service_unavailable,
                     "text/plain", ready ? "ready\n" : "not ready\n");
    }
    if (path == "/metrics") {
      return respond(req, http::status::ok, "text/plain; version=0.0.4",
                     server_->services.metrics->render());
    }
    const std::string suffix = "/live/cursor";
    if (path.rfind("/api/", 0) == 0 && path.size() > 5 + suffix.size() &&
        path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0) {
      const std::string app = path.substr(5, path.size() - 5 - suffix.size());
      if (server_->apps.count(app) == 0) {
        return respond(
            req, http::status::not_found, "application/json",
            json{{"error", "unknown_app"}, {"message", "no app \"" + app + "\""}}.dump());
      }
      auto self = shared_from_this();
      auto shared_req = std::make_shared<http::request<http::string_body>>(std::move(req));
      server_->services.pool->post([self, shared_req, app](pqxx::connection&) {
        std::string body;
        http::status status = http::status::ok;
        try {
          body = json{{"cursor", self->server_->services.head_cursor(app)}}.dump();
        } catch (const std::exception& e) {
          status = http::status::service_unavailable;
          body = json{{"error", "internal"}, {"message", e.what()}}.dump();
        }
        self->server_->post_from_worker(
            self->stream_.get_executor(), [self, shared_req, status, body] {
              self->respond(*shared_req, status, "application/json", body);
            });
      });
      return;
    }
    respond(req, http::status::not_found, "text/plain", "not found\n");
  }

  void respond(const http::request<http::string_body>& req, http::status status,
               const std::string& type, std::string body) {
    auto res = std::make_shared<http::response<http::string_body>>(status, req.version());
    res->set(http::field::server, "outlive");
    res->set(http::field::content_type, type);
    res->set(http::field::cache_control, "no-store");
    res->keep_alive(req.keep_alive());
    res->body() = std::move(body);
    res->prepare_payload();
    http::async_write(stream_, *res,
                      [self = shared_from_this(), res](beast::error_code ec, std::size_t) {
                        if (ec) return;
                        if (!res->keep_alive()) {
                          beast::error_code ignored;
                          self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
                          return;
                        }
                        self->do_read();
                      });
  }

  std::shared_ptr<Server::Impl> server_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
};

// ---------------------------------------------------------------------------------------------

void Server::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc),
                        [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
                          if (ec) {
                            if (ec == net::error::operation_aborted || !self->acceptor.is_open())
                              return;
                            log::warn("accept failed", {{"error", ec.message()}});
                          } else {
                            std::make_shared<HttpSession>(self, std::move(socket))->run();
                          }
                          self->accept();
                        });
}

// Once a second, tell sockets where the topic is, so an idle subscription's cursor keeps up.
void Server::Impl::tick_progress() {
  progress_timer.expires_after(std::chrono::seconds(1));
  progress_timer.async_wait([self = shared_from_this()](beast::error_code ec) {
    if (ec || self->stopping) return;
    std::vector<std::shared_ptr<WsSession>> targets;
    std::shared_ptr<const std::unordered_map<std::string, uint64_t>> through;
    {
      std::lock_guard lock(self->hub_mutex);
      for (const auto& [raw, ref] : self->sessions) {
        // A socket already brought to where the topic is needs no progress frame.
        auto at = self->posted_through.find(ref.app);
        if (at == self->posted_through.end()) continue;
        auto s = ref.session.lock();
        if (s && s->cursor_position() < at->second) targets.push_back(std::move(s));
      }
      through =
          std::make_shared<const std::unordered_map<std::string, uint64_t>>(self->posted_through);
    }
    // Posted after every delivery up to `through`, so a progress cursor never passes an update
    // still on its way to the socket.
    for (auto& session : targets) {
      net::post(session->executor(), [session, through] { session->progress_from(*through); });
    }
    self->tick_progress();
  });
}

Server::Server(const config::Config& config, Services services, Settings settings)
    : impl_(std::make_shared<Impl>(config, std::move(services), settings)) {}

Server::~Server() { stop(); }

void Server::start() {
  const auto& listen = impl_->config.listen;
  const auto colon = listen.rfind(':');
  const auto address = net::ip::make_address(listen.substr(0, colon));
  const auto port = static_cast<unsigned short>(std::stoi(listen.substr(colon + 1)));
  tcp::endpoint endpoint(address, port);
  impl_->acceptor.open(endpoint.protocol());
  impl_->acceptor.set_option(net::socket_base::reuse_address(true));
  impl_->acceptor.bind(endpoint);
  impl_->acceptor.listen(net::socket_base::max_listen_connections);
  for (auto& [app, d] : impl_->dispatch) {
    d->thread = std::thread([impl = impl_, raw = d.get()] { impl->dispatch_loop(*raw); });
  }
  impl_->accept();
  impl_->tick_progress();
  impl_->tick_collections();
  for (int i = 0; i < impl_->settings.io_threads; ++i)
    impl_->threads.emplace_back([impl = impl_] { impl->ioc.run(); });
  log::info("listening", {{"address", listen}, {"port", this->port()}});
}

unsigned short Server::port() const { return impl_->acceptor.local_endpoint().port(); }

void Server::stop() {
  if (impl_->threads.empty() || impl_->stopping.exchange(true)) return;
  // Close every socket with 1012; sockets that open meanwhile get 1012 too (on_accept).
  auto close_all = [impl = impl_] {
    std::vector<std::shared_ptr<WsSession>> all;
    {
      std::lock_guard lock(impl->hub_mutex);
      for (const auto& [raw, ref] : impl->sessions) {
        if (auto s = ref.session.lock()) all.push_back(std::move(s));
      }
    }
    for (auto& s : all)
      net::post(s->executor(), [s] { s->shutdown(kRestart, "replica stopping"); });
    return all.size();
  };
  close_all();
  const auto deadline = std::chrono::steady_clock::now() + impl_->settings.stop_grace;
  while (std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard lock(impl_->hub_mutex);
      if (impl_->sessions.empty()) break;
    }
    close_all();  // also the ones that opened since
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  net::post(impl_->ioc, [impl = impl_] {
    beast::error_code ignored;
    impl->acceptor.close(ignored);
    impl->progress_timer.cancel();
    impl->collection_timer.cancel();
  });
  impl_->ioc.stop();
  for (auto& t : impl_->threads) {
    if (t.joinable()) t.join();
  }
  impl_->threads.clear();
  for (auto& [app, d] : impl_->dispatch) {
    {
      std::lock_guard lock(d->mutex);
      d->stop = true;
    }
    d->cv.notify_all();
    if (d->thread.joinable()) d->thread.join();
  }
  // Every handler still pending holds its session (and the session holds the server): close what
  // is left and let the handlers finish on this thread.
  std::vector<std::shared_ptr<WsSession>> left;
  {
    std::lock_guard lock(impl_->hub_mutex);
    for (const auto& [raw, ref] : impl_->sessions) {
      if (auto s = ref.session.lock()) left.push_back(std::move(s));
    }
  }
  {
    std::lock_guard lock(impl_->worker_post_mutex);
    impl_->workers_may_post = false;
  }
  for (auto& s : left) s->force_close();
  left.clear();
  beast::error_code ignored;
  impl_->acceptor.close(ignored);
  impl_->progress_timer.cancel();
  impl_->collection_timer.cancel();
  impl_->ioc.restart();
  impl_->ioc.run_for(std::chrono::seconds(2));
  // Whatever is still pending (an idle keep-alive HTTP read, a handshake) holds a session that
  // holds this server: destroying the handlers breaks that cycle.
  impl_->ioc.stop();
  impl_->ioc.shutdown();
}

void Server::deliver(const std::string& app_id, const window::UpdatePtr& update) {
  auto it = impl_->dispatch.find(app_id);
  if (it == impl_->dispatch.end()) return;
  auto& d = *it->second;
  {
    std::lock_guard lock(d.mutex);
    d.queue.push_back(update);
  }
  d.cv.notify_one();
}

// One thread per app: takes updates in topic order, decides access for the viewers that follow
// the key (authorize() in batches of 500 for those without a cached decision; an access update
// first forgets the key's decisions), then hands the update to each socket's strand. Nothing
// published after an access update reaches a socket before its viewer was checked again.
void Server::Impl::dispatch_loop(Dispatch& d) {
  std::optional<pqxx::connection> conn;
  const auto& app = apps.at(d.app);
  // One round: the updates waiting when the dispatcher looks, at most kRoundSize. Each socket
  // receives its part of a round in one handler and writes it together: when updates arrive
  // faster than sockets take them, rounds grow and each socket makes fewer system calls.
  constexpr size_t kRoundSize = 64;
  std::unordered_map<WsSession*, std::pair<std::shared_ptr<WsSession>, std::vector<Delivery>>>
      round;
  std::vector<window::UpdatePtr> updates;
  std::vector<int64_t> created_at_us;
  // Hands the round to the sockets; everything up to `position` is then on its way (progress).
  auto post_round = [&](uint64_t position) {
    for (auto& [raw, entry] : round) {
      if (entry.first->add_to_mailbox(std::move(entry.second))) {
        auto executor = entry.first->executor();
        net::post(executor, [s = std::move(entry.first)] { s->take_mailbox(); });
      }
    }
    round.clear();
    const auto now_us = std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
    for (const auto created : created_at_us) {
      m().observe("outlive_commit_to_send_seconds",
                  "From commit to handing the update to its sockets", {{"app", d.app}},
                  static_cast<double>(now_us - created) / 1e6);
    }
    created_at_us.clear();
    std::lock_guard lock(hub_mutex);
    auto& through = posted_through[d.app];
    through = std::max(through, position);
  };
  for (;;) {
    updates.clear();
    {
      std::unique_lock lock(d.mutex);
      d.cv.wait(lock, [&] { return d.stop || !d.queue.empty(); });
      if (d.stop) return;
      while (!d.queue.empty() && updates.size() < kRoundSize) {
        updates.push_back(std::move(d.queue.front()));
        d.queue.pop_front();
      }
    }
    for (const auto& u : updates) {
      if (u->access) {
        d.checking_access = true;
        decisions.forget(u->key);
        d.last_access_position = u->position;
      }
      struct Target {
        std::shared_ptr<WsSession> session;
        std::string viewer_id;  // only when a decision of this target was missing
        ChannelAccess allowed;
      };
      std::vector<Target> targets;
      // The followers' decisions are read from the cache once, here: a cached decision that
      // expires (or is forgotten) while others are asked must not turn into a denial. Those
      // without one:
      std::map<std::pair<std::string, std::string>, std::string> missing_viewers;  // -> JSON
      const auto now = access::Decisions::Clock::now();
      {
        std::string decision;  // reused for every lookup
        std::lock_guard lock(hub_mutex);
        auto it = followers.find(hub_key(d.app, u->key));
        if (it != followers.end()) {
          targets.reserve(it->second.size());
          for (const auto& [raw, f] : it->second) {
            auto s = f.session.lock();
            if (!s) continue;
            Target t{std::move(s), {}, {}};
            for (const auto& [channel, n] : f.channels) {
              decision_id_into(decision, d.app, channel, f.viewer_id);
              const auto cached = decisions.get(u->key, decision, now);
              t.allowed.emplace_back(channel, cached.value_or(false));
              if (!cached) {
                missing_viewers.try_emplace({channel, f.viewer_id}, f.viewer_json);
                t.viewer_id = f.viewer_id;
              }
            }
            targets.push_back(std::move(t));
          }
        }
        auto& through = registered_through[d.app];
        through = std::max(through, u->position);
      }
      // Per channel: the viewers without a decision, asked together in batches of 500.
      std::map<std::string, std::vector<std::string>> missing;
      for (const auto& [cv, json_text] : missing_viewers) missing[cv.first].push_back(cv.second);
      std::map<std::pair<std::string, std::string>, bool> answers;  // of those asked
      std::set<std::pair<std::string, std::string>> failed;
      std::string decision;
      for (const auto& [channel, ids] : missing) {
        const auto* ch = app.channels.at(channel).config;
        for (const auto& batch : access::batches(ids, 500)) {
          std::string array = "[";
          for (size_t i = 0; i < batch.size(); ++i)
            array += (i ? "," : "") + missing_viewers.at({channel, batch[i]});
          array += "]";
          const auto started = std::chrono::steady_clock::now();
          try {
            if (!conn) {
              conn.emplace(config.database);
              pqxx::nontransaction(*conn).exec("SET statement_timeout = " +
                                               std::to_string(settings.check_timeout.count()));
            }
            const auto rows =
                run_typed(*conn, ch->authorize_sql, "text, jsonb", u->key, array, "text");
            std::set<std::string> yes;
            for (const auto& r : rows) {
              if (!r[0].is_null()) yes.insert(r[0].as<std::string>());
            }
            for (const auto& id : batch) {
              const bool allowed = yes.count(id) > 0;
              answers[{channel, id}] = allowed;
              decision_id_into(decision, d.app, channel, id);
              decisions.put(u->key, decision, allowed, now);
            }
          } catch (const std::exception& e) {
            log::error("authorize failed",
                       {{"app", d.app}, {"channel", channel}, {"error", e.what()}});
            conn.reset();
            for (const auto& id : batch) failed.emplace(channel, id);
          }
          ++*app.authorize_calls;
          m().observe(
              "outlive_authorize_seconds", "authorize() latency", {{"app", d.app}},
              std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
        }
      }
      auto out = std::make_shared<OutgoingUpdate>();
      out->update = u;
      out->cursor = cursor_at(d.app, u->position);
      if (u->kind == window::Kind::data && u->data_json) {
        out->tail = std::make_shared<const std::string>(
            frames::update_tail(u->key, out->cursor, *u->data_json));
      }
      std::shared_ptr<const OutgoingUpdate> shared_out = std::move(out);
      for (auto& t : targets) {
        bool broken = false;
        if (!t.viewer_id.empty()) {
          for (auto& [channel, ok] : t.allowed) {
            const std::pair<std::string, std::string> cv{channel, t.viewer_id};
            if (failed.count(cv)) broken = true;
            if (auto a = answers.find(cv); a != answers.end()) ok = a->second;
          }
        }
        auto& entry = round[t.session.get()];
        if (!entry.first) entry.first = std::move(t.session);
        entry.second.push_back(Delivery{shared_out, std::move(t.allowed), broken});
      }
      if (!targets.empty() && u->created_at_us > 0) created_at_us.push_back(u->created_at_us);
      if (u->access) {
        // The access update's round goes out before collections run keys() again.
        post_round(u->position);
        d.checking_access = false;
        refresh_collections(d.app);
      }
    }
    post_round(updates.back()->position);
  }
}

void Server::Impl::refresh_collections(const std::string& app) {
  std::vector<std::shared_ptr<WsSession>> all;
  {
    std::lock_guard lock(hub_mutex);
    for (const auto& [raw, ref] : sessions) {
      if (auto s = ref.session.lock()) all.push_back(std::move(s));
    }
  }
  for (auto& s : all) {
    net::post(s->executor(), [s, app] {
      if (s->app() == app) s->refresh_collections();
    });
  }
}

void Server::Impl::tick_collections() {
  collection_timer.expires_after(settings.collection_refresh);
  collection_timer.async_wait([self = shared_from_this()](beast::error_code ec) {
    if (ec || self->stopping) return;
    for (const auto& [app, d] : self->dispatch) self->refresh_collections(app);
    self->tick_collections();
  });
}

}  // namespace outlive::ws
