#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include "jwt/jwks_fetch.hpp"

#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>

#include "common/error.hpp"

namespace outlive::jwt {

namespace {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Deadline = std::chrono::steady_clock::time_point;
using error_code = boost::system::error_code;

constexpr size_t kMaxBody = 1024 * 1024;

[[noreturn]] void fail(const std::string& url, const std::string& why) {
  throw Error(Errc::internal, "jwks: GET " + url + ": " + why);
}

[[noreturn]] void timed_out(const std::string& url, const char* during) {
  throw Error(Errc::timeout, "jwks: GET " + url + ": no answer within the timeout (" + during + ")");
}

// Runs one asynchronous step to its end or to `deadline`. `start` starts the operation with a
// completion that sets `done`; on the deadline `cancel` is called and the step is waited out (its
// handler still refers to this frame), then the fetch fails as a timeout.
template <class Start, class Cancel>
error_code step(net::io_context& ioc, Deadline deadline, const std::string& url, const char* during,
                Start start, Cancel cancel) {
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
    timed_out(url, during);
  }
  return result;
}

template <class Stream>
Fetched exchange(net::io_context& ioc, Stream& stream, tcp::socket& socket, const Url& u,
                 const std::string& url, Deadline deadline) {
  http::request<http::empty_body> request{http::verb::get, u.target, 11};
  const bool default_port = u.port == (u.tls ? "443" : "80");
  const bool ipv6 = u.host.find(':') != std::string::npos;
  const std::string host = ipv6 ? "[" + u.host + "]" : u.host;
  request.set(http::field::host, default_port ? host : host + ":" + u.port);
  request.set(http::field::user_agent, "outlive");
  request.set(http::field::accept, "application/json");
  request.set(http::field::connection, "close");
  auto close = [&] {
    error_code ignored;
    socket.close(ignored);
  };
  error_code ec = step(
      ioc, deadline, url, "sending the request",
      [&](auto done) { http::async_write(stream, request, [done](error_code e, size_t) { done(e); }); },
      close);
  if (ec) fail(url, "sending the request: " + ec.message());

  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(kMaxBody);
  ec = step(
      ioc, deadline, url, "reading the response",
      [&](auto done) {
        http::async_read(stream, buffer, parser, [done](error_code e, size_t) { done(e); });
      },
      close);
  if (ec == http::error::body_limit) fail(url, "the response is larger than 1 MiB");
  if (ec) fail(url, "reading the response: " + ec.message());
  auto& response = parser.get();
  if (response.result() != http::status::ok) {
    fail(url, "status " + std::to_string(response.result_int()) + " (200 expected)");
  }
  Fetched out;
  out.body = std::move(response.body());
  if (const auto it = response.find(http::field::cache_control); it != response.end()) {
    out.max_age = max_age_of(it->value());
  }
  return out;
}

bool is_ip_literal(const std::string& host) {
  error_code ec;
  net::ip::make_address(host, ec);
  return !ec;
}

}  // namespace

Url parse_url(const std::string& url) {
  auto bad = [&](const std::string& why) -> Url {
    throw Error(Errc::invalid_input, "jwks_url " + url + ": " + why);
  };
  Url u;
  std::string_view rest = url;
  if (rest.rfind("https://", 0) == 0) {
    u.tls = true;
    rest.remove_prefix(8);
  } else if (rest.rfind("http://", 0) == 0) {
    rest.remove_prefix(7);
  } else {
    return bad("not an http:// or https:// URL");
  }
  if (rest.find('#') != std::string_view::npos) return bad("a URL with a fragment");
  const size_t slash = rest.find_first_of("/?");
  std::string_view authority = rest.substr(0, slash);
  u.target = slash == std::string_view::npos ? "/" : std::string(rest.substr(slash));
  if (u.target[0] == '?') u.target = "/" + u.target;
  if (authority.find('@') != std::string_view::npos) return bad("user info in the URL");
  if (!authority.empty() && authority[0] == '[') {
    const size_t end = authority.find(']');
    if (end == std::string_view::npos) return bad("an unclosed IPv6 literal");
    u.host = std::string(authority.substr(1, end - 1));
    authority.remove_prefix(end + 1);
    if (!authority.empty() && authority[0] != ':') return bad("bytes after the IPv6 literal");
    if (!authority.empty()) u.port = std::string(authority.substr(1));
  } else {
    const size_t colon = authority.find(':');
    u.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) u.port = std::string(authority.substr(colon + 1));
  }
  if (u.host.empty()) return bad("no host");
  for (const char c : u.target) {
    if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f) return bad("a space or control byte in the path");
  }
  if (u.port.empty()) {
    u.port = u.tls ? "443" : "80";
  } else if (u.port.size() > 5 || !std::all_of(u.port.begin(), u.port.end(), ::isdigit) ||
             std::stoi(u.port) == 0 || std::stoi(u.port) > 65535) {
    return bad("the port is not a number from 1 to 65535");
  }
  return u;
}

std::optional<std::chrono::seconds> max_age_of(std::string_view value) {
  std::optional<std::chrono::seconds> out;
  while (!value.empty()) {
    const size_t comma = value.find(',');
    std::string_view directive = value.substr(0, comma);
    value = comma == std::string_view::npos ? std::string_view() : value.substr(comma + 1);
    while (!directive.empty() && (directive.front() == ' ' || directive.front() == '\t')) directive.remove_prefix(1);
    while (!directive.empty() && (directive.back() == ' ' || directive.back() == '\t')) directive.remove_suffix(1);
    std::string lower(directive);
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    if (lower == "no-cache" || lower == "no-store") return std::chrono::seconds(0);
    if (lower.rfind("max-age=", 0) != 0) continue;
    std::string_view digits = std::string_view(lower).substr(8);
    if (digits.size() >= 2 && digits.front() == '"' && digits.back() == '"') {
      digits = digits.substr(1, digits.size() - 2);
    }
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
    // Anything over a day is clamped by the caller anyway; stop before it overflows.
    int64_t seconds = 0;
    for (const char d : digits) {
      seconds = std::min<int64_t>(seconds * 10 + (d - '0'), 1'000'000'000);
    }
    out = std::chrono::seconds(seconds);
  }
  return out;
}

Fetched fetch_jwks(const std::string& url, std::chrono::milliseconds timeout) {
  const Url u = parse_url(url);
  const Deadline deadline = std::chrono::steady_clock::now() + timeout;
  net::io_context ioc;

  tcp::resolver resolver(ioc);
  tcp::resolver::results_type endpoints;
  // getaddrinfo cannot be interrupted: a resolver that hangs past the deadline is waited out
  // here (an IP literal or a name in /etc/hosts never does).
  error_code ec = step(
      ioc, deadline, url, "resolving the host",
      [&](auto done) {
        resolver.async_resolve(u.host, u.port, [&, done](error_code e, tcp::resolver::results_type r) {
          endpoints = std::move(r);
          done(e);
        });
      },
      [&] { resolver.cancel(); });
  if (ec) fail(url, "resolving " + u.host + ": " + ec.message());

  auto connect = [&](tcp::socket& socket) {
    const error_code e = step(
        ioc, deadline, url, "connecting",
        [&](auto done) {
          net::async_connect(socket, endpoints, [done](error_code e2, const tcp::endpoint&) { done(e2); });
        },
        [&] {
          error_code ignored;
          socket.close(ignored);
        });
    if (e) fail(url, "connecting: " + e.message());
  };

  if (!u.tls) {
    tcp::socket socket(ioc);
    connect(socket);
    return exchange(ioc, socket, socket, u, url, deadline);
  }

  ssl::context context(ssl::context::tls_client);
  context.set_default_verify_paths(ec);
  if (ec) fail(url, "loading the system CA store: " + ec.message());
  context.set_verify_mode(ssl::verify_peer);
  ssl::stream<tcp::socket> stream(ioc, context);
  SSL* handle = stream.native_handle();
  // The certificate must name the host: its DNS name (with SNI, so a shared front end picks the
  // right certificate), or its address for an IP literal (which RFC 6066 keeps out of SNI).
  const bool ip = is_ip_literal(u.host);
  const int named = ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(handle), u.host.c_str())
                       : SSL_set_tlsext_host_name(handle, u.host.c_str()) == 1 &&
                             SSL_set1_host(handle, u.host.c_str()) == 1;
  if (named != 1) fail(url, "setting the TLS host name");
  connect(stream.next_layer());
  ec = step(
      ioc, deadline, url, "the TLS handshake",
      [&](auto done) { stream.async_handshake(ssl::stream_base::client, done); },
      [&] {
        error_code ignored;
        stream.next_layer().close(ignored);
      });
  if (ec) fail(url, "the TLS handshake: " + ec.message());
  return exchange(ioc, stream, stream.next_layer(), u, url, deadline);
}

}  // namespace outlive::jwt
