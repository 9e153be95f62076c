#pragma once
// Server-Sent Events as SPEC 5.9 writes them, and the subscriptions a stream's request carries.
// Pure (no sockets): unit-tested, and every byte of a `subs` parameter reaches parse_subs().
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace outlive::sse {

// The same bound as a message from a websocket tab (SPEC 5.7: 16 KiB), on the decoded JSON.
constexpr size_t kMaxSubsBytes = 16 * 1024;

// One event carrying `data` (a frame's JSON, possibly in parts that are written one after the
// other). A line break inside the data starts another `data:` line, which the client joins back
// with "\n", so no byte of a frame can end the event early or forge a field.
void append_event(std::string& out, std::initializer_list<std::string_view> data);
std::string event(std::string_view data);
// `event: close` with the websocket close code the session chose (SPEC 5.9).
std::string close_event(uint16_t code, std::string_view reason);
inline constexpr std::string_view kKeepAlive = ": ping\n\n";

// The HTTP status a refusal known before the stream starts is answered with (SPEC 5.9: 401/403
// stop, 429/503 retry): from the close code and the error code the session refused with.
int refusal_status(uint16_t close_code, std::string_view error_code);

// The `subs` of GET /api/<app>/live/sse?subs=... (base64url of a JSON array of sub messages) or
// of a POST body's "subs": each sub message as the text a websocket tab would send. An error
// (a message for the 400's body) when it is not that.
struct SubsError {
  std::string message;
};
using Subs = std::vector<std::string>;
std::variant<Subs, SubsError> parse_subs(std::string_view base64url);
// A POST body {"subs":[...],"token":"..."}; the token empty when absent.
struct Body {
  Subs subs;
  std::string token;
};
std::variant<Body, SubsError> parse_body(std::string_view body);
// The raw value of `name` in a request target's query ("" when absent).
std::string query_value(std::string_view target, std::string_view name);

}  // namespace outlive::sse
