#pragma once
// Websocket bytes by hand, for the protocol's edge cases that a well-behaved client library never
// sends (fragments with a ping between them, unmasked frames, bad UTF-8, a close with a code).
// client_frame() builds a client frame; RawWs speaks it over a plain loopback socket.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

namespace outlive::testing {

// A client frame as a browser sends it: masked (unless `mask` is false), FIN and RSV as given.
inline std::string client_frame(uint8_t opcode, std::string_view payload, bool fin = true,
                                bool mask = true, uint8_t rsv = 0) {
  std::string f;
  f.push_back(static_cast<char>((fin ? 0x80 : 0) | rsv | opcode));
  const uint8_t mask_bit = mask ? 0x80 : 0;
  const uint64_t n = payload.size();
  if (n < 126) {
    f.push_back(static_cast<char>(mask_bit | n));
  } else if (n <= 0xFFFF) {
    f.push_back(static_cast<char>(mask_bit | 126));
    f.push_back(static_cast<char>(n >> 8));
    f.push_back(static_cast<char>(n & 0xFF));
  } else {
    f.push_back(static_cast<char>(mask_bit | 127));
    for (int i = 0; i < 8; ++i) f.push_back(static_cast<char>(n >> (56 - 8 * i)));
  }
  const char key[4] = {0x12, 0x34, 0x56, 0x78};
  if (mask) f.append(key, 4);
  for (size_t i = 0; i < n; ++i)
    f.push_back(mask ? static_cast<char>(payload[i] ^ key[i & 3]) : payload[i]);
  return f;
}

// A server frame as read off the socket.
struct ServerFrame {
  uint8_t opcode = 0;
  std::string payload;
  uint16_t close_code() const {
    return payload.size() >= 2 ? uint16_t((uint8_t(payload[0]) << 8) | uint8_t(payload[1])) : 0;
  }
};

class RawWs {
 public:
  // Upgrades /api/<app>/live on 127.0.0.1:port with `headers` ("Name: value\r\n" lines).
  // `pipelined`: bytes written in the same write as the request, without waiting for the 101.
  RawWs(int port, const std::string& target, const std::string& headers,
        const std::string& pipelined = "") {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
      throw std::runtime_error("connect failed");
    send_raw("GET " + target +
             " HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n" +
             headers + "\r\n" + pipelined);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    size_t end;
    while ((end = buffer_.find("\r\n\r\n")) == std::string::npos) {
      if (!fill(deadline)) throw std::runtime_error("no upgrade response");
    }
    if (buffer_.rfind("HTTP/1.1 101", 0) != 0)
      throw std::runtime_error("upgrade refused: " + buffer_.substr(0, end));
    buffer_.erase(0, end + 4);
  }
  ~RawWs() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawWs(const RawWs&) = delete;
  RawWs& operator=(const RawWs&) = delete;

  void send_raw(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) throw std::runtime_error("send failed");
      sent += static_cast<size_t>(n);
    }
  }

  // `bytes` in pieces of `piece` bytes, each its own TCP segment (no Nagle), `gap` apart: a large
  // message as a real network delivers it.
  void send_in_pieces(const std::string& bytes, size_t piece, std::chrono::microseconds gap) {
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (size_t at = 0; at < bytes.size(); at += piece) {
      send_raw(bytes.substr(at, piece));
      if (gap.count() > 0) std::this_thread::sleep_for(gap);
    }
  }
  int fd() const { return fd_; }

  // The next server frame; nullopt when the connection ended or `timeout` passed (see eof()).
  std::optional<ServerFrame> next(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (buffer_.size() >= 2) {
        const auto* p = reinterpret_cast<const uint8_t*>(buffer_.data());
        uint64_t length = p[1] & 0x7F;
        size_t header = 2;
        if (length == 126) {
          header = 4;
          if (buffer_.size() >= 4) length = (uint64_t(p[2]) << 8) | p[3];
        } else if (length == 127) {
          header = 10;
          if (buffer_.size() >= 10) {
            length = 0;
            for (int i = 0; i < 8; ++i) length = (length << 8) | p[2 + i];
          }
        }
        if (buffer_.size() >= header && buffer_.size() >= header + length) {
          ServerFrame f{static_cast<uint8_t>(p[0] & 0x0F), buffer_.substr(header, length)};
          buffer_.erase(0, header + length);
          return f;
        }
      }
      if (!fill(deadline)) return std::nullopt;
    }
  }

  // True once the server closed the TCP connection (read returned end of file).
  bool eof() const { return eof_; }
  // Waits until the server closes the TCP connection; false when `timeout` passed first.
  bool wait_eof(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!eof_) {
      buffer_.clear();
      if (!fill(deadline) && !eof_) return false;
    }
    return true;
  }

 private:
  bool fill(std::chrono::steady_clock::time_point deadline) {
    if (eof_) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    char chunk[65536];
    const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n <= 0) {
      eof_ = true;
      return false;
    }
    buffer_.append(chunk, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  std::string buffer_;
  bool eof_ = false;
};

}  // namespace outlive::testing
