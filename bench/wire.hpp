#pragma once
// The wire the benchmark clients speak, by hand (no Beast: its translation units take minutes to
// build here, and a client that parses frame headers itself leaves more of the cores to the
// servers under test): a blocking HTTP GET for readiness and /metrics, client websocket frames,
// and integers read out of JSON text without parsing it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

namespace outlive::bench {

// Wall-clock microseconds: the benches' frames carry clock_timestamp() of the writing transaction
// (or the driver's clock), so latency is measured against the same clock.
inline int64_t wall_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// ---------------------------------------------------------------------------------------------
// Plain HTTP GET (readiness, /metrics)

inline std::optional<std::pair<int, std::string>> http_get(int port, const std::string& target) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return std::nullopt;
  }
  const std::string req =
      "GET " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return std::nullopt;
  }
  std::string resp;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) resp.append(buf, static_cast<size_t>(n));
  close(fd);
  if (resp.rfind("HTTP/1.", 0) != 0 || resp.size() < 12) return std::nullopt;
  const int status = std::atoi(resp.c_str() + 9);
  const auto body = resp.find("\r\n\r\n");
  std::string text = body == std::string::npos ? "" : resp.substr(body + 4);
  // Chunked bodies: good enough for counting metric lines (chunk sizes are separate lines).
  return std::make_pair(status, text);
}

// Sum of a counter family in Prometheus text (all label sets).
inline double metric_sum(const std::string& text, const std::string& name) {
  double sum = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name, 0) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : ' ';
    if (next != '{' && next != ' ') continue;
    const auto space = line.rfind(' ');
    if (space != std::string::npos) sum += std::atof(line.c_str() + space + 1);
  }
  return sum;
}

// ---------------------------------------------------------------------------------------------
// Websocket frames (RFC 6455), client side: frames we send are masked.

inline void append_frame(std::string& out, uint8_t opcode, const char* payload, size_t n) {
  static const uint8_t mask[4] = {0x37, 0xfa, 0x21, 0x3d};
  out.push_back(static_cast<char>(0x80 | opcode));
  if (n < 126) {
    out.push_back(static_cast<char>(0x80 | n));
  } else if (n < 65536) {
    out.push_back(static_cast<char>(0x80 | 126));
    out.push_back(static_cast<char>((n >> 8) & 0xff));
    out.push_back(static_cast<char>(n & 0xff));
  } else {
    out.push_back(static_cast<char>(0x80 | 127));
    for (int i = 7; i >= 0; --i)
      out.push_back(static_cast<char>((static_cast<uint64_t>(n) >> (8 * i)) & 0xff));
  }
  out.append(reinterpret_cast<const char*>(mask), 4);
  for (size_t i = 0; i < n; ++i) out.push_back(static_cast<char>(payload[i] ^ mask[i % 4]));
}

inline std::string upgrade_request(int port, const std::string& target, const std::string& extra_headers) {
  return "GET " + target + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
         "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: "
         "dGhlIHNhbXBsZSBub25jZQ==\r\n"
         "Sec-WebSocket-Version: 13\r\n" +
         extra_headers + "\r\n";
}

// The integer after "name": in a JSON text (jsonb prints "n": 1, nlohmann "n":1).
inline std::optional<int64_t> json_integer(const char* p, size_t n, const char* quoted_name) {
  const size_t k = std::strlen(quoted_name);
  const char* end = p + n;
  const char* at = static_cast<const char*>(memmem(p, n, quoted_name, k));
  if (at == nullptr) return std::nullopt;
  at += k;
  while (at < end && (*at == ' ' || *at == ':')) ++at;
  bool negative = false;
  if (at < end && *at == '-') {
    negative = true;
    ++at;
  }
  if (at >= end || *at < '0' || *at > '9') return std::nullopt;
  int64_t v = 0;
  while (at < end && *at >= '0' && *at <= '9') v = v * 10 + (*at++ - '0');
  return negative ? -v : v;
}

// The string after "name": in a JSON text, without its quotes (no unescaping: for ids, keys and
// cursors, which need none). Empty when absent.
inline std::string_view json_string(const char* p, size_t n, const char* quoted_name) {
  const size_t k = std::strlen(quoted_name);
  const char* end = p + n;
  const char* at = static_cast<const char*>(memmem(p, n, quoted_name, k));
  if (at == nullptr) return {};
  at += k;
  while (at < end && (*at == ' ' || *at == ':')) ++at;
  if (at >= end || *at != '"') return {};
  ++at;
  const char* close = static_cast<const char*>(memchr(at, '"', static_cast<size_t>(end - at)));
  return close ? std::string_view(at, static_cast<size_t>(close - at)) : std::string_view();
}

}  // namespace outlive::bench
