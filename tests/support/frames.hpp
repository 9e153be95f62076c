#pragma once
// Reading a replica the way the websocket tests do: the next frame a tab acts on, a cursor's
// position, one series of /metrics. Header-only: it uses Catch's assertions.
#include <catch2/catch.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "support/ws_client.hpp"
#include "topic/cursor.hpp"

namespace outlive::testing {

// The next frame that is not `progress`; fails on close or timeout. `cursor` (when given) follows
// the socket's latest cursor, as a tab does.
inline nlohmann::json next_frame(WsClient& ws,
                                 std::chrono::milliseconds timeout = std::chrono::seconds(10),
                                 std::string* cursor = nullptr) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) FAIL("no frame in time");
    auto r = ws.next(left);
    if (r.timed_out) FAIL("no frame in time");
    if (r.closed) FAIL("socket closed with " << r.close_code);
    auto j = r.json();
    if (cursor && j.contains("cursor") && j["type"] != "resync")
      *cursor = j["cursor"].get<std::string>();
    if (j["type"] != "progress") return j;
  }
}

inline uint64_t position_of(const std::string& cursor) {
  const auto c = topic::Cursor::decode(cursor);
  REQUIRE(c);
  return c->position;
}

// One sample of a series of /metrics (e.g. `outlive_window_bytes{app="inventory"}`), or nullopt
// while it does not exist (a counter nothing has counted yet).
inline std::optional<double> metric_sample(int port, const std::string& series) {
  const auto body = "\n" + http_get(port, "/metrics").second;
  const auto at = body.find("\n" + series + " ");
  if (at == std::string::npos) return std::nullopt;
  return std::stod(body.substr(at + series.size() + 2));
}

inline double metric(int port, const std::string& series) {
  const auto v = metric_sample(port, series);
  if (!v) FAIL("no metric " << series);
  return *v;
}

inline double metric_or_zero(int port, const std::string& series) {
  return metric_sample(port, series).value_or(0);
}

}  // namespace outlive::testing
