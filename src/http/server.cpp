// The HTTP side of the replica (SPEC 5.7, 6): the listener, routes, health and metrics, and the
// websocket upgrade. Boost.Beast lives in this translation unit only (it is heavy to compile);
// after the upgrade a socket belongs to session::Session, which writes and reads frames itself.
#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include "http/server.hpp"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <thread>

#include "common/log.hpp"
#include "db/pool.hpp"
#include "http/routes.hpp"
#include "metrics/metrics.hpp"
#include "session/context.hpp"
#include "session/session.hpp"
#include "session/ws_transport.hpp"
#include "sse/framing.hpp"
#include "sse/stream.hpp"
#include "window/app_window.hpp"

namespace outlive::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;  // Beast's, inside outlive::http
namespace websocket = beast::websocket;
using tcp = net::ip::tcp;
using json = nlohmann::json;
using routes::error_body;
using routes::Route;

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  explicit Impl(std::shared_ptr<session::Context> c)
      : context(std::move(c)), acceptor(context->io.at(0)), admission_timer(context->io.at(0)) {}

  std::shared_ptr<session::Context> context;
  tcp::acceptor acceptor;
  // server.admin_listen: /metrics, /healthz, /readyz there and nowhere else (SPEC 6 rev 3).
  tcp::acceptor admin_acceptor{context->io.at(0)};
  net::steady_timer admission_timer;

  net::steady_timer accept_timer{context->io.at(0)};
  std::chrono::milliseconds accept_backoff{0};
  std::chrono::steady_clock::time_point last_accept_warning{};
  static constexpr int kMaxUnupgradedPerAddress = 64;

  void accept();
  void accept_admin();
  void on_accept_error(const beast::error_code& ec);
  void admit(tcp::socket socket, bool admin = false);
  void tick_admission();
};

// ---------------------------------------------------------------------------------------------
// What admission is asked about a tab's request, a websocket upgrade or an SSE stream alike.

admission::OpenRequest open_request(const session::Context& context,
                                    const http::request<http::string_body>& req, std::string app,
                                    const tcp::socket& socket) {
  admission::OpenRequest request;
  beast::error_code ec;
  const auto remote = socket.remote_endpoint(ec);
  request.app = std::move(app);
  request.cookie = std::string(req[http::field::cookie]);
  request.authorization = std::string(req[http::field::authorization]);
  request.origin = std::string(req[http::field::origin]);
  for (const auto& name : context.hook_headers) {
    // (repeated headers joined as RFC 9110 allows, the cookie header with "; " as RFC 6265 asks)
    std::string value;
    for (auto [it, end] = req.equal_range(name); it != end; ++it) {
      if (!value.empty()) value += name == "cookie" ? "; " : ", ";
      value += std::string(it->value());
    }
    if (!value.empty()) request.hook_headers.emplace_back(name, std::move(value));
  }
  request.address = ec ? "unknown"
                       : context.proxies.client_address(remote.address().to_string(),
                                                        routes::forwarded_for(req));
  return request;
}

// Counted when the request is read, in the order requests arrive (the tab sends its next one
// after our answer).
std::variant<auth::Credential, admission::Refusal> verdict_of(
    session::Context& context, const admission::OpenRequest& request,
    std::chrono::steady_clock::time_point opened_at) {
  if (auto rt = context.apps.find(request.app); rt != context.apps.end()) {
    return context.admission.before_lookup(request, rt->second.origins, opened_at);
  }
  return admission::Refusal{"unknown_app", "no app \"" + request.app + "\" on this replica", 1008};
}

// A small kernel send buffer: a slow reader shows in our bounded queue (and costs little kernel
// memory per socket) instead of hiding megabytes in the kernel. No Nagle delay: frames that wait
// are already written together.
void tune_for_frames(tcp::socket& socket) {
  beast::error_code ignored;
  socket.set_option(net::socket_base::send_buffer_size(64 * 1024), ignored);
  socket.set_option(tcp::no_delay(true), ignored);
}

// ---------------------------------------------------------------------------------------------
// The upgrade: Beast answers it (and refuses a bad one); the frames after it are the session's.

class Upgrade : public std::enable_shared_from_this<Upgrade> {
 public:
  Upgrade(std::shared_ptr<session::Context> context, tcp::socket&& socket,
          session::ConnectionSlot slot)
      : context_(std::move(context)), stream_(std::move(socket)), slot_(std::move(slot)) {}

  // `early`: what was read behind the request (a client that did not wait for the 101); the
  // session parses it before anything it reads, once it serves the socket.
  void run(http::request<http::string_body> req, std::string app, std::string early) {
    early_ = std::move(early);
    auto& socket = beast::get_lowest_layer(stream_).socket();
    request_ = open_request(*context_, req, std::move(app), socket);
    tune_for_frames(socket);
    stream_.set_option(websocket::stream_base::timeout::suggested(beast::role_type::server));
    stream_.set_option(websocket::stream_base::decorator(
        [](websocket::response_type& res) { res.set(http::field::server, "outlive"); }));
    // Counted now, in the order requests arrive (the tab sends its next one after our answer).
    const auto opened_at = std::chrono::steady_clock::now();
    auto verdict = verdict_of(*context_, request_, opened_at);
    req_ = std::move(req);
    stream_.async_accept(req_, [self = shared_from_this(), verdict = std::move(verdict),
                                opened_at](beast::error_code ec) mutable {
      if (ec) return;
      auto transport = std::make_shared<session::WsTransport>(
          self->stream_.next_layer().release_socket(), self->context_->connection_settings);
      auto s = std::make_shared<session::Session>(self->context_, std::move(transport),
                                                  std::move(self->request_), std::move(verdict),
                                                  opened_at);
      s->hold(std::move(self->slot_));
      s->start(std::move(self->early_));  // after the 101 is written: never parsed before it
    });
  }

 private:
  std::shared_ptr<session::Context> context_;
  websocket::stream<beast::tcp_stream> stream_;
  http::request<http::string_body> req_;
  std::string early_;
  admission::OpenRequest request_;
  session::ConnectionSlot slot_;  // counts towards server.max_connections while the socket lives
};

// ---------------------------------------------------------------------------------------------
// Plain HTTP: routing, health, metrics, cursor

// Before the upgrade (SPEC 5.7 rev 2): 16 KiB of request line and headers (431), 10 s for a
// complete request (408 once a byte arrived), a malformed request is 400; each of those answers
// closes the connection.
class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  // `admin`: a connection to server.admin_listen, which serves only the operations routes.
  HttpSession(std::shared_ptr<session::Context> context, tcp::socket&& socket,
              session::ConnectionSlot slot, std::shared_ptr<void> unupgraded, bool admin)
      : context_(std::move(context)),
        stream_(std::move(socket)),
        timer_(stream_.get_executor()),
        slot_(std::move(slot)),
        unupgraded_(std::move(unupgraded)),
        admin_(admin) {}

  void run() {
    net::dispatch(stream_.get_executor(),
                  beast::bind_front_handler(&HttpSession::do_read, shared_from_this()));
  }

 private:
  void do_read() {
    parser_.emplace();
    parser_->header_limit(16 * 1024);
    parser_->body_limit(64 * 1024);
    timed_out_ = false;
    // Our own timer, not the stream's: the stream's closes the socket, and a 408 must still go out.
    timer_.expires_after(context_->settings.request_timeout);
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec) return;
      self->timed_out_ = true;
      beast::error_code ignored;
      self->stream_.socket().cancel(ignored);
    });
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&HttpSession::on_read, shared_from_this()));
  }

  // An answer that ends the connection: written, then the connection is closed.
  void refuse(http::status status, const std::string& body) {
    auto res = std::make_shared<http::response<http::string_body>>(status, 11);
    res->set(http::field::server, "outlive");
    res->set(http::field::content_type, "text/plain");
    res->set(http::field::connection, "close");
    res->body() = body;
    res->prepare_payload();
    timer_.expires_after(std::chrono::seconds(5));  // a peer that reads nothing is not waited for
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec) return;
      beast::error_code ignored;
      self->stream_.socket().close(ignored);
    });
    http::async_write(stream_, *res,
                      [self = shared_from_this(), res](beast::error_code, std::size_t) {
                        beast::error_code ignored;
                        self->timer_.cancel();
                        self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
                        self->stream_.socket().close(ignored);
                      });
  }

  void on_read(beast::error_code ec, std::size_t) {
    timer_.cancel();
    if (ec == http::error::end_of_stream || ec == net::error::eof) return;
    if (timed_out_) {
      // A request started and not finished in time is answered; a silent connection is not.
      if (parser_->got_some() || buffer_.size() > 0)
        return refuse(http::status::request_timeout, "request timeout\n");
      return;
    }
    if (ec == http::error::header_limit) {
      return refuse(http::status::request_header_fields_too_large, "request headers too large\n");
    }
    if (ec == http::error::body_limit)
      return refuse(http::status::payload_too_large, "too large\n");
    if (ec) {
      if (ec.category() == http::make_error_code(http::error::bad_target).category())
        return refuse(http::status::bad_request, "malformed request\n");
      return;
    }
    auto req = parser_->release();
    auto [route, app] = routes::route(std::string_view(req.target().data(), req.target().size()),
                                      req.method() == http::verb::get, websocket::is_upgrade(req),
                                      req.method() == http::verb::post);
    // With an admin listener the operations routes are its alone, and it serves nothing else.
    const bool operations =
        route == Route::healthz || route == Route::readyz || route == Route::metrics;
    const bool separate = !context_->config.server.admin_listen.empty();
    if ((admin_ && !operations) || (!admin_ && separate && operations)) route = Route::not_found;
    switch (route) {
      case Route::upgrade: {
        unupgraded_.reset();
        // The parser may have read past the request: those bytes are the tab's first frames.
        std::string early = beast::buffers_to_string(buffer_.data());
        buffer_.consume(buffer_.size());
        std::make_shared<Upgrade>(context_, stream_.release_socket(), std::move(slot_))
            ->run(std::move(req), std::move(app), std::move(early));
        return;
      }
      case Route::sse:
        return serve_sse(req, app);
      case Route::method_not_allowed:
        return respond(req, http::status::method_not_allowed, "text/plain", "GET only\n");
      case Route::healthz:
        return respond(req, http::status::ok, "text/plain", "ok\n");
      case Route::readyz: {
        const bool ready =
            context_->services.ready && context_->services.ready() && !context_->stopping;
        return respond(req, ready ? http::status::ok : http::status::service_unavailable,
                       "text/plain", ready ? "ready\n" : "not ready\n");
      }
      case Route::metrics:
        return respond(req, http::status::ok, "text/plain; version=0.0.4",
                       context_->metrics().render());
      case Route::cursor:
        return serve_cursor(req, app);
      case Route::not_found:
        break;
    }
    respond(req, http::status::not_found, "text/plain", "not found\n");
  }

  // SPEC 5.9: the subscriptions of the request (a GET's `subs`, a POST's body) are the tab's
  // first messages to a session served over an sse::Stream, admitted as a websocket would be.
  // What cannot be a stream at all is a 400 here; the session answers the rest (a refusal before
  // the 200 becomes its HTTP status).
  void serve_sse(const http::request<http::string_body>& req, const std::string& app) {
    sse::Subs subs;
    std::string token;
    if (req.method() == http::verb::post) {
      auto body = sse::parse_body(req.body());
      if (auto* e = std::get_if<sse::SubsError>(&body)) {
        return respond(req, http::status::bad_request, "application/json",
                       error_body("invalid_message", e->message));
      }
      subs = std::move(std::get<sse::Body>(body).subs);
      token = std::move(std::get<sse::Body>(body).token);
    } else {
      auto parsed = sse::parse_subs(sse::query_value(
          std::string_view(req.target().data(), req.target().size()), "subs"));
      if (auto* e = std::get_if<sse::SubsError>(&parsed)) {
        return respond(req, http::status::bad_request, "application/json",
                       error_body("invalid_message", e->message));
      }
      subs = std::get<sse::Subs>(std::move(parsed));
    }
    unupgraded_.reset();
    auto& socket = stream_.socket();
    auto request = open_request(*context_, req, app, socket);
    // The body's token is the request's credential, as an Authorization header would carry it
    // (a JWT, an API key or an OAuth token), for a fetch that cannot rely on cookies.
    if (!token.empty()) request.authorization = "Bearer " + token;
    tune_for_frames(socket);
    const auto opened_at = std::chrono::steady_clock::now();
    auto verdict = verdict_of(*context_, request, opened_at);
    // A stream cannot send an auth message later: without a credential now it has none.
    if (auto* c = std::get_if<auth::Credential>(&verdict);
        c && c->kind == auth::CredentialKind::pending) {
      verdict = admission::Refusal{
          "unauthorized", "no credential: a cookie, or a POST with the token in its body", 1008};
    }
    sse::StreamSettings settings;
    settings.keep_alive = context_->settings.sse_keep_alive;
    settings.max_duration = context_->settings.sse_max_duration;
    settings.stall_timeout = context_->settings.stall_timeout;
    auto transport =
        std::make_shared<sse::Stream>(stream_.release_socket(), settings, std::move(subs));
    auto s = std::make_shared<session::Session>(context_, std::move(transport), std::move(request),
                                                std::move(verdict), opened_at);
    s->hold(std::move(slot_));
    s->start();
  }

  // From the app's window, not from NATS or the pool (SPEC 5.7 rev 3): a flood of cursor requests,
  // or a NATS that stalls, must not take the pool's workers from the access checks. The window's
  // head is at or behind the topic's, so a tab resuming from it gets every later update (at most
  // a few it already has).
  void serve_cursor(const http::request<http::string_body>& req, const std::string& app) {
    if (context_->apps.count(app) == 0) {
      return respond(req, http::status::not_found, "application/json",
                     error_body("unknown_app", "no app \"" + app + "\""));
    }
    auto* window = context_->window_of(app);
    if (!window || !window->ready()) {
      return respond(req, http::status::service_unavailable, "application/json",
                     error_body("internal", "the topic of \"" + app + "\" is not read yet"));
    }
    respond(req, http::status::ok, "application/json",
            json{{"cursor", context_->cursor_at(app, window->window().head())}}.dump());
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

  std::shared_ptr<session::Context> context_;
  beast::tcp_stream stream_;
  net::steady_timer timer_;
  bool timed_out_ = false;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  session::ConnectionSlot slot_;      // server.max_connections
  std::shared_ptr<void> unupgraded_;  // the peer's connections not upgraded yet
  const bool admin_;
};

// ---------------------------------------------------------------------------------------------

void Server::Impl::accept() {
  acceptor.async_accept(context->io.at(context->io.next()),
                        [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
                          if (ec == net::error::operation_aborted || !self->acceptor.is_open())
                            return;
                          if (ec) return self->on_accept_error(ec);
                          self->accept_backoff = std::chrono::milliseconds(0);
                          self->admit(std::move(socket));
                          self->accept();
                        });
}

void Server::Impl::accept_admin() {
  admin_acceptor.async_accept(
      context->io.at(0), [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
        if (ec == net::error::operation_aborted || !self->admin_acceptor.is_open()) return;
        if (!ec) self->admit(std::move(socket), true);
        self->accept_admin();  // (out of descriptors: the public listener's backoff covers both)
      });
}

// Out of descriptors (EMFILE/ENFILE): the listen queue keeps the connection while accepting pauses
// (10 ms doubling to 100 ms); one warning per 10 s; open sockets go on being served meanwhile.
void Server::Impl::on_accept_error(const beast::error_code& ec) {
  const bool no_descriptor =
      ec == net::error::no_descriptors || ec.value() == EMFILE || ec.value() == ENFILE;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_accept_warning >= std::chrono::seconds(10)) {
    last_accept_warning = now;
    log::warn("accept failed", {{"error", ec.message()}});
  }
  context->metrics().counter("outlive_accept_errors_total", "accept() failures")++;
  if (!no_descriptor) return accept();
  accept_backoff =
      std::clamp(accept_backoff * 2, std::chrono::milliseconds(10), std::chrono::milliseconds(100));
  accept_timer.expires_after(accept_backoff);
  accept_timer.async_wait([self = shared_from_this()](beast::error_code e) {
    if (!e) self->accept();
  });
}

namespace {
// A plain 503 before anything is read: the replica is full, or this address has too many
// connections that are not websockets yet.
void turn_away(tcp::socket& socket) {
  static const std::string answer =
      "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: text/plain\r\n"
      "Content-Length: 12\r\nConnection: close\r\n\r\ntry it later";
  beast::error_code ignored;
  socket.non_blocking(true, ignored);
  ::send(socket.native_handle(), answer.data(), answer.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  socket.shutdown(tcp::socket::shutdown_both, ignored);
  socket.close(ignored);
}
}  // namespace

void Server::Impl::admit(tcp::socket socket, bool admin) {
  auto ctx = context;
  if (ctx->connections.load() >= ctx->config.server.max_connections) {
    ctx->metrics().counter("outlive_connections_refused_total", "Connections turned away (503)",
                           {{"reason", "max_connections"}})++;
    return turn_away(socket);
  }
  beast::error_code ec;
  const auto peer = socket.remote_endpoint(ec);
  const std::string peer_address = ec ? std::string("unknown") : peer.address().to_string();
  std::shared_ptr<void> unupgraded;
  if (!ctx->proxies.trusted(peer_address)) {
    const std::string address = admission::limit_key(peer_address, ctx->settings.ipv6_limit_prefix);
    std::lock_guard lock(ctx->unupgraded_mutex);
    int& n = ctx->unupgraded[address];
    if (n >= kMaxUnupgradedPerAddress) {
      ctx->metrics().counter("outlive_connections_refused_total", "Connections turned away (503)",
                             {{"reason", "address"}})++;
      return turn_away(socket);
    }
    ++n;
    unupgraded = std::shared_ptr<void>(nullptr, [ctx, address](void*) {
      std::lock_guard lock(ctx->unupgraded_mutex);
      auto it = ctx->unupgraded.find(address);
      if (it != ctx->unupgraded.end() && --it->second <= 0) ctx->unupgraded.erase(it);
    });
  }
  session::ConnectionSlot slot(ctx->connections);
  std::make_shared<HttpSession>(ctx, std::move(socket), std::move(slot), std::move(unupgraded),
                                admin)
      ->run();
}

// Once a second: the per-address tables of admission forget the quiet addresses.
void Server::Impl::tick_admission() {
  admission_timer.expires_after(std::chrono::seconds(1));
  admission_timer.async_wait([self = shared_from_this()](beast::error_code ec) {
    if (ec || self->context->stopping) return;
    self->context->admission.forget_quiet(std::chrono::steady_clock::now());
    self->tick_admission();
  });
}

Server::Server(std::shared_ptr<session::Context> context)
    : impl_(std::make_shared<Impl>(std::move(context))) {}
Server::~Server() { stop_accepting(); }

namespace {
// Binds "host:port" (port 0: any free port).
void bind_listener(tcp::acceptor& acceptor, const std::string& listen) {
  const auto colon = listen.rfind(':');
  const auto address = net::ip::make_address(listen.substr(0, colon));
  const auto port = static_cast<unsigned short>(std::stoi(listen.substr(colon + 1)));
  tcp::endpoint endpoint(address, port);
  acceptor.open(endpoint.protocol());
  acceptor.set_option(net::socket_base::reuse_address(true));
  acceptor.bind(endpoint);
  acceptor.listen(net::socket_base::max_listen_connections);
}
}  // namespace

void Server::start() {
  const auto& listen = impl_->context->config.listen;
  bind_listener(impl_->acceptor, listen);
  const auto& admin = impl_->context->config.server.admin_listen;
  if (!admin.empty()) bind_listener(impl_->admin_acceptor, admin);
  impl_->accept();
  if (!admin.empty()) impl_->accept_admin();
  impl_->tick_admission();
  log::info("listening", {{"address", listen}, {"port", this->port()}});
  if (!admin.empty()) {
    log::info("operations routes listening", {{"address", admin}, {"port", admin_port()}});
  }
}

unsigned short Server::port() const { return impl_->acceptor.local_endpoint().port(); }

unsigned short Server::admin_port() const {
  beast::error_code ec;
  const auto endpoint = impl_->admin_acceptor.local_endpoint(ec);
  return ec ? 0 : endpoint.port();
}

void Server::stop_accepting() {
  const auto close = [](Impl& impl) {
    beast::error_code ignored;
    impl.acceptor.close(ignored);
    impl.admin_acceptor.close(ignored);
    impl.admission_timer.cancel();
    impl.accept_timer.cancel();
  };
  // The acceptors and timers belong to the first io thread while it runs.
  if (impl_->context->io.running()) {
    net::post(impl_->context->io.at(0), [impl = impl_, close] { close(*impl); });
  } else {
    close(*impl_);
  }
}

}  // namespace outlive::http
