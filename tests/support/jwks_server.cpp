#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include "support/jwks_server.hpp"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <condition_variable>
#include <future>
#include <list>
#include <mutex>
#include <thread>

namespace outlive::testing {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

struct JwksServer::Impl {
  net::io_context ioc;
  // The thread runs until the destructor, also after stop() left it nothing to do.
  net::executor_work_guard<net::io_context::executor_type> work = net::make_work_guard(ioc);
  tcp::acceptor acceptor{ioc};
  bool stopped = false;  // on the test's thread
  int port = 0;
  std::thread thread;

  mutable std::mutex mutex;
  mutable std::condition_variable changed;
  std::string body = R"({"keys":[]})";
  std::string cache_control;
  int status = 200;
  bool hang = false;
  int requests = 0;

  struct Connection {
    tcp::socket socket;
    beast::flat_buffer buffer;
    http::request<http::string_body> request;
    http::response<http::string_body> response;
    explicit Connection(tcp::socket s) : socket(std::move(s)) {}
  };
  std::list<std::shared_ptr<Connection>> open;  // on the io thread only

  void accept() {
    acceptor.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
      if (ec) return;  // stopped
      auto c = std::make_shared<Connection>(std::move(socket));
      open.push_back(c);
      read(c);
      accept();
    });
  }

  void read(const std::shared_ptr<Connection>& c) {
    c->request = {};
    http::async_read(c->socket, c->buffer, c->request, [this, c](boost::system::error_code ec, size_t) {
      if (ec) return forget(c);
      bool hanging;
      {
        std::lock_guard lock(mutex);
        ++requests;
        hanging = hang;
        c->response = http::response<http::string_body>(static_cast<http::status>(status), 11);
        c->response.set(http::field::content_type, "application/json");
        if (!cache_control.empty()) c->response.set(http::field::cache_control, cache_control);
        c->response.body() = status == 200 ? body : R"({"error":"test"})";
        c->response.keep_alive(false);
        c->response.prepare_payload();
      }
      changed.notify_all();
      if (hanging) return;  // the socket stays open and unanswered until stop()
      http::async_write(c->socket, c->response, [this, c](boost::system::error_code, size_t) {
        boost::system::error_code ignored;
        c->socket.shutdown(tcp::socket::shutdown_send, ignored);
        forget(c);
      });
    });
  }

  void forget(const std::shared_ptr<Connection>& c) {
    boost::system::error_code ignored;
    c->socket.close(ignored);
    open.remove(c);
  }
};

JwksServer::JwksServer() : impl_(std::make_unique<Impl>()) {
  const tcp::endpoint at(net::ip::make_address("127.0.0.1"), 0);
  impl_->acceptor.open(at.protocol());
  impl_->acceptor.set_option(tcp::acceptor::reuse_address(true));
  impl_->acceptor.bind(at);
  impl_->acceptor.listen();
  impl_->port = impl_->acceptor.local_endpoint().port();
  impl_->accept();
  impl_->thread = std::thread([this] { impl_->ioc.run(); });
}

JwksServer::~JwksServer() {
  stop();
  impl_->work.reset();
  impl_->ioc.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::string JwksServer::url() const {
  return "http://127.0.0.1:" + std::to_string(impl_->port) + "/.well-known/jwks.json";
}

int JwksServer::port() const { return impl_->port; }

void JwksServer::set_document(std::string body, std::string cache_control) {
  std::lock_guard lock(impl_->mutex);
  impl_->body = std::move(body);
  impl_->cache_control = std::move(cache_control);
}

void JwksServer::set_status(int status) {
  std::lock_guard lock(impl_->mutex);
  impl_->status = status;
}

void JwksServer::set_hang(bool hang) {
  std::lock_guard lock(impl_->mutex);
  impl_->hang = hang;
}

int JwksServer::requests() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->requests;
}

bool JwksServer::wait_for_requests(int n, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(impl_->mutex);
  return impl_->changed.wait_for(lock, timeout, [&] { return impl_->requests >= n; });
}

void JwksServer::stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  std::promise<void> closed;
  auto done = closed.get_future();
  net::post(impl_->ioc, [this, &closed] {
    boost::system::error_code ignored;
    impl_->acceptor.close(ignored);
    for (auto& c : impl_->open) c->socket.close(ignored);
    impl_->open.clear();
    closed.set_value();
  });
  if (done.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    throw std::runtime_error("JwksServer::stop: the server's thread did not answer");
  }
}

}  // namespace outlive::testing
