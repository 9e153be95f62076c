#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include "support/hook_server.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <condition_variable>
#include <ctime>
#include <list>
#include <mutex>
#include <thread>

namespace outlive::testing {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

struct HookServer::Impl {
  std::string secret;
  Handler handler;
  net::io_context ioc;
  std::unique_ptr<net::ssl::context> tls;  // https when set
  tcp::acceptor acceptor{ioc};
  int port = 0;
  std::thread accept_thread;

  mutable std::mutex mutex;
  mutable std::condition_variable changed;
  bool stopped = false;
  int connections = 0;
  int requests = 0;
  int bad_signatures = 0;
  std::list<std::shared_ptr<tcp::socket>> open;
  std::list<std::thread> threads;

  void serve(const std::shared_ptr<tcp::socket>& socket) {
    if (!tls) return serve_on(*socket, socket);
    net::ssl::stream<tcp::socket&> stream(*socket, *tls);
    boost::system::error_code ec;
    stream.handshake(net::ssl::stream_base::server, ec);
    if (!ec) serve_on(stream, socket);
  }

  template <class Stream>
  void serve_on(Stream& stream, const std::shared_ptr<tcp::socket>& socket) {
    beast::flat_buffer buffer;
    for (;;) {
      http::request<http::string_body> req;
      boost::system::error_code ec;
      http::read(stream, buffer, req, ec);
      if (ec) return;
      Request r{std::string(req.target()), req.body(), std::string(req["Outlive-Signature"])};
      {
        std::lock_guard lock(mutex);
        ++requests;
      }
      changed.notify_all();
      Answer a;
      const std::string why = check_signature(r.signature, r.body, secret);
      if (!why.empty()) {
        std::lock_guard lock(mutex);
        ++bad_signatures;
        a.status = 401;
        a.body = nlohmann_free_error(why);
      } else {
        a = handler(r);
      }
      if (a.hang) {
        std::unique_lock lock(mutex);
        changed.wait(lock, [&] { return stopped; });
        return;
      }
      if (a.close) {
        socket->shutdown(tcp::socket::shutdown_both, ec);
        return;
      }
      if (a.delay.count() > 0) {
        std::unique_lock lock(mutex);
        if (changed.wait_for(lock, a.delay, [&] { return stopped; })) return;
      }
      http::response<http::string_body> res{static_cast<http::status>(a.status), req.version()};
      res.set(http::field::content_type, "application/json");
      res.keep_alive(req.keep_alive());
      res.body() = a.body;
      res.prepare_payload();
      http::write(stream, res, ec);
      if (ec || !req.keep_alive()) return;
    }
  }

  static std::string nlohmann_free_error(const std::string& why) {
    std::string out = "{\"error\":\"";
    for (char c : why) out += (c == '"' || c == '\\') ? ' ' : c;
    return out + "\"}";
  }
};

HookServer::HookServer(std::string secret, Handler handler, std::string tls_cert, std::string tls_key)
    : impl_(std::make_unique<Impl>()) {
  if (!tls_cert.empty()) {
    impl_->tls = std::make_unique<net::ssl::context>(net::ssl::context::tls_server);
    impl_->tls->use_certificate_chain_file(tls_cert);
    impl_->tls->use_private_key_file(tls_key, net::ssl::context::pem);
  }
  impl_->secret = std::move(secret);
  impl_->handler = std::move(handler);
  const tcp::endpoint at(net::ip::make_address("127.0.0.1"), 0);
  impl_->acceptor.open(at.protocol());
  impl_->acceptor.set_option(tcp::acceptor::reuse_address(true));
  impl_->acceptor.bind(at);
  impl_->acceptor.listen();
  impl_->port = impl_->acceptor.local_endpoint().port();
  impl_->accept_thread = std::thread([impl = impl_.get()] {
    for (;;) {
      auto socket = std::make_shared<tcp::socket>(impl->ioc);
      boost::system::error_code ec;
      impl->acceptor.accept(*socket, ec);
      std::lock_guard lock(impl->mutex);
      if (ec || impl->stopped) return;
      ++impl->connections;
      impl->open.push_back(socket);
      impl->threads.emplace_back([impl, socket] { impl->serve(socket); });
    }
  });
}

HookServer::~HookServer() { stop(); }

std::string HookServer::url(const std::string& path) const {
  return (impl_->tls ? "https://127.0.0.1:" : "http://127.0.0.1:") + std::to_string(impl_->port) + path;
}

int HookServer::port() const { return impl_->port; }

int HookServer::connections() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->connections;
}

int HookServer::requests() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->requests;
}

int HookServer::bad_signatures() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->bad_signatures;
}

bool HookServer::wait_for_requests(int n, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(impl_->mutex);
  return impl_->changed.wait_for(lock, timeout, [&] { return impl_->requests >= n; });
}

void HookServer::stop() {
  std::list<std::thread> threads;
  {
    std::lock_guard lock(impl_->mutex);
    if (impl_->stopped) return;
    impl_->stopped = true;
    boost::system::error_code ignored;
    // shutdown() wakes the blocked accept(); the sockets' reads end with an error.
    impl_->acceptor.cancel(ignored);
    ::shutdown(impl_->acceptor.native_handle(), SHUT_RDWR);
    for (auto& s : impl_->open) s->shutdown(tcp::socket::shutdown_both, ignored);
  }
  impl_->changed.notify_all();
  if (impl_->accept_thread.joinable()) impl_->accept_thread.join();
  {
    std::lock_guard lock(impl_->mutex);
    threads.swap(impl_->threads);
  }
  for (auto& t : threads) t.join();
}

std::string HookServer::check_signature(const std::string& header, const std::string& body,
                                        const std::string& secret) {
  if (header.empty()) return "missing Outlive-Signature";
  const size_t t_at = header.find("t=");
  const size_t v_at = header.find(",v1=");
  if (t_at != 0 || v_at == std::string::npos) return "malformed Outlive-Signature";
  const std::string t = header.substr(2, v_at - 2);
  const std::string v1 = header.substr(v_at + 4);
  long long sent = 0;
  try {
    sent = std::stoll(t);
  } catch (...) {
    return "t is not a number";
  }
  if (std::llabs(static_cast<long long>(std::time(nullptr)) - sent) > 300) return "t is too old";
  const std::string text = t + "." + body;
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(text.data()), text.size(), mac, &length);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string expected;
  for (unsigned int i = 0; i < length; ++i) {
    expected += kHex[mac[i] >> 4];
    expected += kHex[mac[i] & 0xf];
  }
  if (expected.size() != v1.size() || CRYPTO_memcmp(expected.data(), v1.data(), v1.size()) != 0) {
    return "the signature does not match";
  }
  return {};
}

}  // namespace outlive::testing
