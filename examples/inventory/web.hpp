#pragma once
// The demo's HTTP plumbing, with Boost.Beast kept inside web.cpp (the one Beast translation unit of
// the demo): a small blocking HTTP/1.1 server (one thread per connection: the demo's handlers run
// SQL), and the HTTP and websocket clients that `outlive_demo_run --check` drives the gateway with.
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace inventory::web {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;                          // "GET", "POST", ...
  std::string target;                          // path and query
  std::string path;                            // without the query
  std::map<std::string, std::string> headers;  // names in lowercase
  std::string body;
  std::string header(const std::string& lowercase_name) const;
  // The value of cookie `name`, or empty.
  std::string cookie(const std::string& name) const;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  Headers headers;                                    // extra headers (Set-Cookie, ...)
  std::string header(const std::string& name) const;  // case-insensitive, first match
};

using Handler = std::function<Response(const Request&)>;

// Listens on host:port (port 0: any free port) and serves each connection on a thread of its own.
class Server {
 public:
  Server(const std::string& host, int port, Handler handler);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;
  int port() const;
  // Stops accepting (open connections finish their current request).
  void stop();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// One HTTP/1.1 request on a fresh connection to host:port. Throws std::runtime_error on a network
// error or timeout.
Response request(const std::string& host, int port, const std::string& method,
                 const std::string& target, const Headers& headers = {},
                 const std::string& body = {},
                 std::chrono::milliseconds timeout = std::chrono::seconds(10));

// A blocking websocket client with deadlines.
class WebSocket {
 public:
  // Connects to host:port and upgrades `target` with the extra headers (Cookie, Origin, ...).
  // Throws std::runtime_error when the upgrade fails.
  WebSocket(const std::string& host, int port, const std::string& target,
            const Headers& headers = {},
            std::chrono::milliseconds timeout = std::chrono::seconds(10));
  ~WebSocket();
  WebSocket(const WebSocket&) = delete;
  WebSocket& operator=(const WebSocket&) = delete;

  void send(const std::string& text);
  struct Frame {
    bool timed_out = false;
    bool closed = false;
    int close_code = 0;
    std::string text;
  };
  // The next text frame, or closed / timed_out (after a timeout the socket is closed).
  Frame next(std::chrono::milliseconds timeout);
  void close();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace inventory::web
