#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include "support/ws_client.hpp"

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <stdexcept>
#include <vector>

namespace outlive::testing {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = net::ip::tcp;

struct WsClient::Impl {
  net::io_context ioc;
  websocket::stream<tcp::socket> ws{ioc};
  beast::flat_buffer buffer;
  bool closed = false;
  int close_code = 0;
  // A read started by poll() that has not completed yet.
  bool reading = false;
  bool read_done = false;
  beast::error_code read_result;

  void start_read() {
    if (reading) return;
    reading = true;
    read_done = false;
    ws.async_read(buffer, [this](beast::error_code ec, std::size_t) {
      read_done = true;
      read_result = ec;
    });
  }
  // The completed read as a Received (`reading` must be done).
  Received take_read() {
    reading = false;
    Received r;
    if (read_result) {
      closed = true;
      close_code = ws.reason().code;
      r.closed = true;
      r.close_code = close_code;
      return r;
    }
    r.text = beast::buffers_to_string(buffer.data());
    buffer.consume(buffer.size());
    return r;
  }
};

WsClient::WsClient(int port, const std::string& target,
                   const std::vector<std::pair<std::string, std::string>>& headers,
                   const std::string& local_address, int receive_buffer)
    : impl_(std::make_unique<Impl>()) {
  auto& sock = impl_->ws.next_layer();
  sock.open(tcp::v4());
  if (receive_buffer > 0) sock.set_option(net::socket_base::receive_buffer_size(receive_buffer));
  if (local_address != "127.0.0.1")
    sock.bind(tcp::endpoint(net::ip::make_address(local_address), 0));
  sock.connect(
      tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)));
  impl_->ws.set_option(websocket::stream_base::decorator([headers](websocket::request_type& req) {
    // A name given twice is sent as two header lines (as some gateways do with X-Forwarded-For).
    std::vector<std::string> given;
    for (const auto& [k, v] : headers) {
      const bool again = std::any_of(given.begin(), given.end(),
                                     [&](const std::string& g) { return beast::iequals(g, k); });
      if (again)
        req.insert(k, v);
      else
        req.set(k, v);
      given.push_back(k);
    }
  }));
  impl_->ws.read_message_max(64 * 1024 * 1024);
  impl_->ws.handshake("127.0.0.1:" + std::to_string(port), target);
}

WsClient::~WsClient() {
  if (impl_) {
    beast::error_code ec;
    impl_->ws.next_layer().close(ec);
  }
}
WsClient::WsClient(WsClient&&) noexcept = default;
WsClient& WsClient::operator=(WsClient&&) noexcept = default;

void WsClient::send(const std::string& text) {
  impl_->ws.text(true);
  impl_->ws.write(net::buffer(text));
}

void WsClient::send_binary(const std::string& bytes) {
  impl_->ws.binary(true);
  impl_->ws.write(net::buffer(bytes));
}

Received WsClient::next(std::chrono::milliseconds timeout) {
  Received r;
  if (impl_->closed) {
    r.closed = true;
    r.close_code = impl_->close_code;
    return r;
  }
  impl_->start_read();
  impl_->ioc.restart();
  impl_->ioc.run_for(timeout);
  if (!impl_->read_done) {
    // Abandon the read: the stream cannot be used for reading after a cancelled read.
    beast::error_code ignored;
    impl_->ws.next_layer().cancel(ignored);
    impl_->ioc.restart();
    impl_->ioc.run_for(std::chrono::milliseconds(100));
    impl_->reading = false;
    r.timed_out = true;
    impl_->closed = true;
    return r;
  }
  return impl_->take_read();
}

Received WsClient::poll(std::chrono::milliseconds timeout) {
  Received r;
  if (impl_->closed) {
    r.closed = true;
    r.close_code = impl_->close_code;
    return r;
  }
  impl_->start_read();
  impl_->ioc.restart();
  if (timeout.count() <= 0) {
    impl_->ioc.poll();
  } else {
    impl_->ioc.run_for(timeout);
  }
  if (!impl_->read_done) {
    r.timed_out = true;  // still reading: the next call goes on with it
    return r;
  }
  return impl_->take_read();
}

int WsClient::native_handle() { return impl_->ws.next_layer().native_handle(); }

nlohmann::json WsClient::next_of_type(const std::string& type, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) throw std::runtime_error("no " + type + " frame in time");
    auto r = next(left);
    if (r.timed_out) throw std::runtime_error("no " + type + " frame in time");
    if (r.closed)
      throw std::runtime_error("closed with " + std::to_string(r.close_code) + " waiting for " +
                               type);
    auto j = r.json();
    if (j.value("type", "") == type) return j;
  }
}

int WsClient::wait_closed(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return 0;
    auto r = next(left);
    if (r.timed_out) return 0;
    if (r.closed) return r.close_code;
  }
}

void WsClient::close() {
  beast::error_code ec;
  impl_->ws.close(websocket::close_code::normal, ec);
}

std::pair<int, std::string> http_get(int port, const std::string& target) {
  net::io_context ioc;
  beast::tcp_stream stream(ioc);
  stream.connect(
      tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)));
  http::request<http::empty_body> req(http::verb::get, target, 11);
  req.set(http::field::host, "127.0.0.1");
  http::write(stream, req);
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  http::read(stream, buffer, res);
  beast::error_code ec;
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  return {static_cast<int>(res.result_int()), res.body()};
}

}  // namespace outlive::testing
