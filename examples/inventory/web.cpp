#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include "web.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <cctype>
#include <iostream>
#include <stdexcept>
#include <thread>

namespace inventory::web {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = net::ip::tcp;

namespace {

std::string lowercase(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace

std::string Request::header(const std::string& lowercase_name) const {
  auto it = headers.find(lowercase_name);
  return it == headers.end() ? std::string() : it->second;
}

std::string Request::cookie(const std::string& name) const {
  const std::string all = header("cookie");
  size_t pos = 0;
  while (pos < all.size()) {
    size_t end = all.find(';', pos);
    if (end == std::string::npos) end = all.size();
    std::string part = all.substr(pos, end - pos);
    part.erase(0, part.find_first_not_of(' '));
    const auto eq = part.find('=');
    if (eq != std::string::npos && part.substr(0, eq) == name) return part.substr(eq + 1);
    pos = end + 1;
  }
  return {};
}

std::string Response::header(const std::string& name) const {
  const std::string wanted = lowercase(name);
  for (const auto& [k, v] : headers) {
    if (lowercase(k) == wanted) return v;
  }
  return {};
}

// ---------------------------------------------------------------------------------------------
// Server

struct Server::Impl {
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  Handler handler;
  std::thread accept_thread;
  std::atomic<bool> stopping{false};
  int port = 0;
};

namespace {

void serve_connection(std::shared_ptr<Server::Impl> impl, tcp::socket socket) {
  beast::flat_buffer buffer;
  for (;;) {
    // An idle keep-alive connection (the gateway keeps a few) is dropped after a minute.
    if (buffer.size() == 0) {
      pollfd pfd{socket.native_handle(), POLLIN, 0};
      if (::poll(&pfd, 1, 60000) <= 0) break;
    }
    beast::error_code ec;
    http::request_parser<http::string_body> parser;
    parser.header_limit(16 * 1024);
    parser.body_limit(1024 * 1024);
    http::read(socket, buffer, parser, ec);
    if (ec) break;
    auto beast_req = parser.release();
    Request req;
    req.method = std::string(beast_req.method_string());
    req.target = std::string(beast_req.target());
    req.path = req.target.substr(0, req.target.find('?'));
    for (const auto& field : beast_req) {
      req.headers[lowercase(std::string(field.name_string()))] = std::string(field.value());
    }
    req.body = std::move(beast_req.body());
    Response res;
    try {
      res = impl->handler(req);
    } catch (const std::exception& e) {
      res = Response{500, "application/json", std::string("{\"error\":\"internal\"}"), {}};
      std::cerr << "inventory_demo: " << req.method << " " << req.path << ": " << e.what() << "\n";
    }
    http::response<http::string_body> out{static_cast<http::status>(res.status),
                                          beast_req.version()};
    out.set(http::field::server, "inventory-demo");
    out.set(http::field::content_type, res.content_type);
    out.set(http::field::cache_control, "no-store");
    for (const auto& [k, v] : res.headers) out.insert(k, v);
    out.keep_alive(beast_req.keep_alive() && !impl->stopping);
    out.body() = std::move(res.body);
    out.prepare_payload();
    http::write(socket, out, ec);
    if (ec || !out.keep_alive()) break;
  }
  beast::error_code ignored;
  socket.shutdown(tcp::socket::shutdown_both, ignored);
  socket.close(ignored);
}

}  // namespace

Server::Server(const std::string& host, int port, Handler handler)
    : impl_(std::make_shared<Impl>()) {
  impl_->handler = std::move(handler);
  const tcp::endpoint endpoint(net::ip::make_address(host), static_cast<unsigned short>(port));
  impl_->acceptor.open(endpoint.protocol());
  impl_->acceptor.set_option(net::socket_base::reuse_address(true));
  impl_->acceptor.bind(endpoint);
  impl_->acceptor.listen(net::socket_base::max_listen_connections);
  impl_->port = impl_->acceptor.local_endpoint().port();
  impl_->accept_thread = std::thread([impl = impl_] {
    while (!impl->stopping) {
      beast::error_code ec;
      tcp::socket socket(impl->ioc);
      impl->acceptor.accept(socket, ec);
      if (ec) {
        if (impl->stopping) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // e.g. out of descriptors
        continue;
      }
      std::thread(serve_connection, impl, std::move(socket)).detach();
    }
  });
}

int Server::port() const { return impl_->port; }

void Server::stop() {
  if (impl_->stopping.exchange(true)) return;
  // shutdown() wakes the thread blocked in accept(); close after it returned.
  ::shutdown(impl_->acceptor.native_handle(), SHUT_RDWR);
  if (impl_->accept_thread.joinable()) impl_->accept_thread.join();
  beast::error_code ignored;
  impl_->acceptor.close(ignored);
}

Server::~Server() { stop(); }

// ---------------------------------------------------------------------------------------------
// HTTP client

Response request(const std::string& host, int port, const std::string& method,
                 const std::string& target, const Headers& headers, const std::string& body,
                 std::chrono::milliseconds timeout) {
  net::io_context ioc;
  tcp::resolver resolver(ioc);
  const auto endpoints = resolver.resolve(host, std::to_string(port));
  beast::tcp_stream stream(ioc);
  stream.expires_after(timeout);

  http::request<http::string_body> req{http::string_to_verb(method), target, 11};
  req.set(http::field::host, host + ":" + std::to_string(port));
  req.set(http::field::connection, "close");
  for (const auto& [k, v] : headers) req.set(k, v);
  if (!body.empty() && req.find(http::field::content_type) == req.end()) {
    req.set(http::field::content_type, "application/json");
  }
  req.body() = body;
  req.prepare_payload();

  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(16 * 1024 * 1024);
  beast::error_code result;
  std::string step = "connect";
  stream.async_connect(endpoints, [&](beast::error_code ec, const tcp::endpoint&) {
    if (ec) {
      result = ec;
      return;
    }
    step = "write";
    http::async_write(stream, req, [&](beast::error_code ec2, std::size_t) {
      if (ec2) {
        result = ec2;
        return;
      }
      step = "read";
      http::async_read(stream, buffer, parser,
                       [&](beast::error_code ec3, std::size_t) { result = ec3; });
    });
  });
  ioc.run();
  if (result) {
    throw std::runtime_error(method + " http://" + host + ":" + std::to_string(port) + target +
                             ": " + step + ": " + result.message());
  }
  auto res = parser.release();
  Response out;
  out.status = static_cast<int>(res.result_int());
  out.content_type = std::string(res[http::field::content_type]);
  for (const auto& field : res)
    out.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  out.body = std::move(res.body());
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Websocket client

struct WebSocket::Impl {
  net::io_context ioc;
  websocket::stream<beast::tcp_stream> ws{ioc};
  beast::flat_buffer buffer;
  bool closed = false;
  int close_code = 0;

  // Runs the queued operation until `done` or the deadline; false on timeout (the socket is then
  // closed: a cancelled websocket operation leaves the stream unusable).
  bool run_until(const bool& done, std::chrono::milliseconds timeout) {
    ioc.restart();
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done && std::chrono::steady_clock::now() < deadline) {
      ioc.run_one_until(deadline);
    }
    if (done) return true;
    beast::error_code ignored;
    ws.next_layer().socket().cancel(ignored);
    ws.next_layer().socket().close(ignored);
    ioc.restart();
    ioc.run_for(std::chrono::milliseconds(100));
    closed = true;
    return false;
  }
};

WebSocket::WebSocket(const std::string& host, int port, const std::string& target,
                     const Headers& headers, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  tcp::resolver resolver(impl_->ioc);
  const auto endpoints = resolver.resolve(host, std::to_string(port));
  auto& ws = impl_->ws;
  ws.next_layer().expires_after(timeout);
  beast::error_code result;
  bool done = false;
  ws.set_option(websocket::stream_base::decorator([headers](websocket::request_type& req) {
    for (const auto& [k, v] : headers) req.set(k, v);
  }));
  const std::string host_header = host + ":" + std::to_string(port);
  websocket::response_type response;
  ws.next_layer().async_connect(endpoints, [&](beast::error_code ec, const tcp::endpoint&) {
    if (ec) {
      result = ec;
      done = true;
      return;
    }
    ws.async_handshake(response, host_header, target, [&](beast::error_code ec2) {
      result = ec2;
      done = true;
    });
  });
  if (!impl_->run_until(done, timeout + std::chrono::seconds(1))) {
    throw std::runtime_error("websocket " + host_header + target + ": no handshake in time");
  }
  if (result) {
    throw std::runtime_error("websocket " + host_header + target + ": " + result.message() +
                             " (HTTP " + std::to_string(response.result_int()) + ")");
  }
  // From here on the deadlines are ours (next()); the websocket's own idle timeout stays off.
  ws.next_layer().expires_never();
  ws.set_option(websocket::stream_base::timeout::suggested(beast::role_type::client));
  ws.read_message_max(16 * 1024 * 1024);
}

WebSocket::~WebSocket() {
  if (impl_) {
    beast::error_code ignored;
    impl_->ws.next_layer().socket().close(ignored);
  }
}

void WebSocket::send(const std::string& text) {
  impl_->ws.text(true);
  impl_->ws.write(net::buffer(text));
}

WebSocket::Frame WebSocket::next(std::chrono::milliseconds timeout) {
  Frame frame;
  if (impl_->closed) {
    frame.closed = true;
    frame.close_code = impl_->close_code;
    return frame;
  }
  bool done = false;
  beast::error_code result;
  impl_->ws.async_read(impl_->buffer, [&](beast::error_code ec, std::size_t) {
    result = ec;
    done = true;
  });
  if (!impl_->run_until(done, timeout)) {
    frame.timed_out = true;
    return frame;
  }
  if (result) {
    impl_->closed = true;
    impl_->close_code = impl_->ws.reason().code;
    frame.closed = true;
    frame.close_code = impl_->close_code;
    return frame;
  }
  frame.text = beast::buffers_to_string(impl_->buffer.data());
  impl_->buffer.consume(impl_->buffer.size());
  return frame;
}

void WebSocket::close() {
  if (impl_->closed) return;
  bool done = false;
  impl_->ws.async_close(websocket::close_code::normal, [&](beast::error_code) { done = true; });
  impl_->run_until(done, std::chrono::seconds(2));
  impl_->closed = true;
}

}  // namespace inventory::web
