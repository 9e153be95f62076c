#pragma once
// What the HTTP side makes of a request before any I/O (SPEC 5.7, 6): its route, the app its
// target names, the client's forwarded addresses, and JSON bodies that may carry the request's
// bytes. Pure: every byte a client can put in a target or a header reaches this code, so it is
// fuzzed (tests/fuzz/fuzz_http_request.cpp) and never throws on bytes that are not UTF-8.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace outlive::http::routes {

enum class Route { upgrade, sse, healthz, readyz, metrics, cursor, not_found, method_not_allowed };

struct Routed {
  Route route;
  std::string app;  // for upgrade, sse and cursor
};

// The route of a request with this target ("/api/<app>/live?x=1"); upgrades only at
// /api/<app>/live, everything else GET only but /api/<app>/live/sse (SPEC 5.9), which takes POST
// too (a streaming fetch with its token in the body). <app> is one path segment (no '/') in the
// app routes, /live, /live/sse and /live/cursor.
Routed route(std::string_view target, bool is_get, bool is_upgrade, bool is_post = false);

// A JSON body; bytes that are not UTF-8 (an app name from the target) become U+FFFD instead of
// throwing.
std::string json_body(const nlohmann::json& j);
std::string error_body(std::string_view code, std::string_view message);

// Every X-Forwarded-For line of the request, in order, as one list (RFC 9110 5.3). HAProxy's
// `option forwardfor` adds a line of its own instead of extending the client's (nginx extends it):
// the first line alone would be the client's word.
template <class Request>
std::string forwarded_for(const Request& req) {
  std::string joined;
  const auto lines = req.equal_range("X-Forwarded-For");
  for (auto it = lines.first; it != lines.second; ++it) {
    if (!joined.empty()) joined += ", ";
    joined.append(it->value().data(), it->value().size());
  }
  return joined;
}

}  // namespace outlive::http::routes
