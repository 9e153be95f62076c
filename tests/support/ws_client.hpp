#pragma once
// A real websocket client for the tests (Boost.Beast, synchronous API with deadlines).
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace outlive::testing {

struct Received {
  bool closed = false;
  int close_code = 0;  // when closed
  bool timed_out = false;
  std::string text;  // a text frame
  nlohmann::json json() const { return nlohmann::json::parse(text); }
};

class WsClient {
 public:
  // Connects from `local_address` to 127.0.0.1:port (a small `receive_buffer` makes a slow reader)
  // and upgrades `target` with the given extra headers
  // ({"Cookie", "session=..."}, {"Origin", "..."}). Throws when the upgrade fails.
  WsClient(int port, const std::string& target,
           const std::vector<std::pair<std::string, std::string>>& headers = {},
           const std::string& local_address = "127.0.0.1", int receive_buffer = 0);
  ~WsClient();
  WsClient(WsClient&&) noexcept;
  WsClient& operator=(WsClient&&) noexcept;

  void send(const std::string& text);
  void send_binary(const std::string& bytes);
  // The next frame, a close, or timed_out after `timeout`.
  Received next(std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // The next frame if one arrives within `timeout` (0: only what is there already); otherwise
  // timed_out with the read left pending, the socket still usable: the next poll() or next()
  // goes on with it. Pings are answered while it runs. For a thread that reads many sockets
  // without blocking on one that has nothing coming.
  Received poll(std::chrono::milliseconds timeout);
  // The socket, to wait for with poll(2) once poll() has drained what was read already.
  int native_handle();
  // Reads until a frame of this type (skipping progress frames and others); fails on close/timeout.
  nlohmann::json next_of_type(const std::string& type,
                              std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // Reads until the socket closes; returns the close code (0 on timeout).
  int wait_closed(std::chrono::milliseconds timeout = std::chrono::seconds(15));
  void close();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// A plain HTTP GET; returns status and body.
std::pair<int, std::string> http_get(int port, const std::string& target);

}  // namespace outlive::testing
