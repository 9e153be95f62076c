#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include "http_client/link.hpp"

#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <optional>

#include "common/error.hpp"

namespace outlive::http_client {

namespace {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;

// The system CA store (OpenSSL's default paths, SSL_CERT_FILE / SSL_CERT_DIR when set), read
// when a Link first connects over TLS and kept for its reconnects: a few ms per Link, and a
// rotated CA bundle is seen by the next Link without a restart.
std::unique_ptr<ssl::context> system_tls(const std::string& what) {
  auto context = std::make_unique<ssl::context>(ssl::context::tls_client);
  error_code ec;
  context->set_default_verify_paths(ec);
  if (ec) throw Error(Errc::internal, what + ": loading the system CA store: " + ec.message());
  context->set_verify_mode(ssl::verify_peer);
  return context;
}

bool is_ip_literal(const std::string& host) {
  error_code ec;
  net::ip::make_address(host, ec);
  return !ec;
}

}  // namespace

struct Link::Impl {
  Url url;
  std::string what;
  net::io_context ioc;
  std::unique_ptr<ssl::context> tls_context;  // at the first TLS connect
  std::optional<tcp::socket> plain;
  std::optional<ssl::stream<tcp::socket>> tls;
  beast::flat_buffer buffer;

  Impl(Url u, std::string w) : url(std::move(u)), what(std::move(w)) {}

  [[noreturn]] void fail(const std::string& why) { throw Error(Errc::internal, what + ": " + why); }

  tcp::socket& socket() { return tls ? tls->next_layer() : *plain; }
  bool connected() const { return (plain && plain->is_open()) || (tls && tls->next_layer().is_open()); }

  void close() {
    error_code ignored;
    if (plain) plain->close(ignored);
    if (tls) tls->next_layer().close(ignored);
    plain.reset();
    tls.reset();
    buffer.clear();
  }

  // Runs one asynchronous step to its end or to `deadline`. `start` starts the operation with a
  // completion that sets `done`; on the deadline `cancel` is called and the step is waited out
  // (its handler refers to this frame), then the exchange fails as a timeout.
  template <class Start, class Cancel>
  error_code step(Deadline deadline, const char* during, Start start, Cancel cancel) {
    bool done = false;
    error_code result;
    start([&](error_code ec) {
      done = true;
      result = ec;
    });
    ioc.restart();
    ioc.run_until(deadline);
    if (!done) {
      cancel();
      ioc.restart();
      ioc.run();
      close();
      throw Error(Errc::timeout, what + ": no answer within the timeout (" + during + ")");
    }
    return result;
  }

  template <class Start>
  error_code step(Deadline deadline, const char* during, Start start) {
    return step(deadline, during, start, [this] {
      error_code ignored;
      socket().close(ignored);
    });
  }

  void connect(Deadline deadline) {
    close();
    tcp::resolver resolver(ioc);
    tcp::resolver::results_type endpoints;
    // getaddrinfo cannot be interrupted: a resolver that hangs past the deadline is waited out
    // here (an IP literal or a name in /etc/hosts never does).
    error_code ec = step(
        deadline, "resolving the host",
        [&](auto done) {
          resolver.async_resolve(url.host, url.port,
                                 [&, done](error_code e, tcp::resolver::results_type r) {
                                   endpoints = std::move(r);
                                   done(e);
                                 });
        },
        [&] { resolver.cancel(); });
    if (ec) fail("resolving " + url.host + ": " + ec.message());
    if (url.tls) {
      if (!tls_context) tls_context = system_tls(what);
      tls.emplace(ioc, *tls_context);
      SSL* handle = tls->native_handle();
      // The certificate must name the host: its DNS name (with SNI, so a shared front end picks
      // the right certificate), or its address for an IP literal (which RFC 6066 keeps out of SNI).
      const bool ip = is_ip_literal(url.host);
      const int named = ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(handle), url.host.c_str())
                           : SSL_set_tlsext_host_name(handle, url.host.c_str()) == 1 &&
                                 SSL_set1_host(handle, url.host.c_str()) == 1;
      if (named != 1) fail("setting the TLS host name");
    } else {
      plain.emplace(ioc);
    }
    ec = step(deadline, "connecting", [&](auto done) {
      net::async_connect(socket(), endpoints, [done](error_code e, const tcp::endpoint&) { done(e); });
    });
    if (ec) {
      close();
      fail("connecting: " + ec.message());
    }
    socket().set_option(tcp::no_delay(true), ec);
    if (tls) {
      ec = step(deadline, "the TLS handshake",
                [&](auto done) { tls->async_handshake(ssl::stream_base::client, done); });
      if (ec) {
        close();
        fail("the TLS handshake: " + ec.message());
      }
    }
  }

  // One request and its answer on the open connection. `fresh`: nothing was sent on it before, so
  // a failure is the server's, not a kept-alive connection it closed meanwhile.
  template <class Stream>
  std::optional<Response> send(Stream& stream, Request& request, Deadline deadline,
                               size_t body_limit, bool fresh) {
    error_code ec = step(deadline, "sending the request", [&](auto done) {
      http::async_write(stream, request, [done](error_code e, size_t) { done(e); });
    });
    if (ec) {
      close();
      if (!fresh) return std::nullopt;
      fail("sending the request: " + ec.message());
    }
    http::response_parser<http::string_body> parser;
    parser.body_limit(body_limit);
    size_t read = 0;
    ec = step(deadline, "reading the response", [&](auto done) {
      http::async_read(stream, buffer, parser, [done, &read](error_code e, size_t n) {
        read = n;
        done(e);
      });
    });
    if (ec) {
      close();
      if (!fresh && read == 0 && (ec == http::error::end_of_stream || ec == net::error::eof ||
                                  ec == net::error::connection_reset)) {
        return std::nullopt;
      }
      if (ec == http::error::body_limit) {
        fail("the response is larger than " + std::to_string(body_limit) + " bytes");
      }
      fail("reading the response: " + ec.message());
    }
    Response response = parser.release();
    if (!response.keep_alive()) close();
    return response;
  }
};

Link::Link(Url url, std::string what) : impl_(std::make_unique<Impl>(std::move(url), std::move(what))) {}

Link::~Link() { impl_->close(); }

bool Link::connected() const { return impl_->connected(); }

const Url& Link::url() const { return impl_->url; }

Response Link::exchange(Request& request, Deadline deadline, size_t body_limit) {
  auto& s = *impl_;
  request.version(11);
  request.set(http::field::host, s.url.host_header());
  request.set(http::field::user_agent, "outlive");
  request.prepare_payload();
  for (int attempt = 0; attempt < 2; ++attempt) {
    const bool fresh = !s.connected();
    if (fresh) s.connect(deadline);
    std::optional<Response> answer = s.tls ? s.send(*s.tls, request, deadline, body_limit, fresh)
                                           : s.send(*s.plain, request, deadline, body_limit, fresh);
    if (answer) return std::move(*answer);
  }
  s.fail("the connection closed twice before an answer");
}

}  // namespace outlive::http_client
