#pragma once
// A Server-Sent Events client for the tests (SPEC 5.9): plain POSIX sockets, a deadline on every
// read. It reads the response's status and headers, then one event (or comment) at a time.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace outlive::testing {

struct SseEvent {
  enum class Kind { event, comment, end, timed_out } kind = Kind::timed_out;
  std::string name;  // `event:` ("" for a plain data event)
  std::string data;  // the data lines joined with "\n", or the comment's text
};

class SseClient {
 public:
  // Sends `method target` with `headers` and `body`, and reads the status line and headers.
  // `receive_buffer` > 0: the socket's SO_RCVBUF, set before it connects (a reader that stalls
  // early).
  SseClient(int port, const std::string& method, const std::string& target,
            const std::vector<std::pair<std::string, std::string>>& headers = {},
            const std::string& body = "",
            std::chrono::milliseconds timeout = std::chrono::seconds(10), int receive_buffer = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (receive_buffer > 0)
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      throw std::runtime_error("connect failed");
    }
    std::string req = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    for (const auto& [k, v] : headers) req += k + ": " + v + "\r\n";
    if (method == "POST") {
      req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
             "\r\n";
    }
    req += "\r\n" + body;
    for (size_t sent = 0; sent < req.size();) {
      const auto n = ::send(fd_, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) throw std::runtime_error("send failed");
      sent += static_cast<size_t>(n);
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    size_t end;
    while ((end = buffer_.find("\r\n\r\n")) == std::string::npos) {
      if (!fill(deadline)) throw std::runtime_error("no response headers: " + buffer_);
    }
    const std::string head = buffer_.substr(0, end);
    buffer_.erase(0, end + 4);
    status = std::stoi(head.substr(9, 3));
    size_t at = head.find("\r\n");
    while (at != std::string::npos) {
      const size_t next = head.find("\r\n", at + 2);
      const std::string line = head.substr(at + 2, next == std::string::npos ? next : next - at - 2);
      const auto colon = line.find(':');
      if (colon != std::string::npos) {
        std::string name = line.substr(0, colon);
        for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        headers_[name] = line.substr(line.find_first_not_of(' ', colon + 1));
      }
      at = next;
    }
  }
  ~SseClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  SseClient(const SseClient&) = delete;
  SseClient& operator=(const SseClient&) = delete;

  std::string header(const std::string& lower_name) const {
    auto it = headers_.find(lower_name);
    return it == headers_.end() ? std::string() : it->second;
  }
  // The body so far and until the end of the connection (for a refusal's status).
  std::string rest(std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (fill(deadline)) {
    }
    return buffer_;
  }

  // The next event or comment; `end` when the server ended the response, `timed_out` after
  // `timeout`.
  SseEvent next(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    size_t end;
    while ((end = buffer_.find("\n\n")) == std::string::npos) {
      if (!fill(deadline)) {
        return SseEvent{closed_ ? SseEvent::Kind::end : SseEvent::Kind::timed_out, {}, {}};
      }
    }
    const std::string block = buffer_.substr(0, end);
    buffer_.erase(0, end + 2);
    SseEvent e;
    e.kind = SseEvent::Kind::event;
    bool data = false;
    size_t at = 0;
    while (at <= block.size()) {
      const size_t nl = block.find('\n', at);
      const std::string line = block.substr(at, nl == std::string::npos ? nl : nl - at);
      if (line.starts_with(":")) {
        e.kind = SseEvent::Kind::comment;
        e.data = line.substr(1);
        if (e.data.starts_with(" ")) e.data.erase(0, 1);
      } else if (line.starts_with("event: ")) {
        e.name = line.substr(7);
      } else if (line.starts_with("data: ")) {
        if (data) e.data += "\n";
        e.data += line.substr(6);
        data = true;
      }
      if (nl == std::string::npos) break;
      at = nl + 1;
    }
    return e;
  }

  int status = 0;

 private:
  // Reads what arrives before `deadline`; false on the deadline or the end of the connection.
  bool fill(std::chrono::steady_clock::time_point deadline) {
    if (closed_) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    char chunk[16384];
    const auto n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n <= 0) {
      closed_ = true;
      return false;
    }
    buffer_.append(chunk, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  bool closed_ = false;
  std::string buffer_;
  std::map<std::string, std::string> headers_;
};

}  // namespace outlive::testing
