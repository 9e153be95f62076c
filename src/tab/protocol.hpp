#pragma once
// The tab protocol (SPEC 5.2, 5.3): parsing what a tab sends and writing what it receives, the
// same over every transport (websocket, Server-Sent Events). Pure: no sockets, no threads.
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace outlive::tab {

// A subscription's filter (SPEC 5.2 rev 3): each top-level field of an update's data must equal
// its JSON scalar. Numbers compare by value (1 equals 1.0); a field the data lacks matches nothing,
// not even null.
using Filter = std::vector<std::pair<std::string, nlohmann::json>>;

struct SubMessage {
  std::string id;
  std::string channel;
  nlohmann::json scope = nlohmann::json::object();
  std::optional<std::string> cursor;
  // Null without a filter (or with an empty one): every update. Shared, not copied, by the
  // subscription it starts.
  std::shared_ptr<const Filter> filter;
};

struct UnsubMessage {
  std::string id;
};

// SPEC 5.1 rev 4: a JWT sent by the tab, as its credential (the first message) or a refresh.
struct AuthMessage {
  std::string token;
};

struct ProtocolError {
  std::string code;  // "invalid_message"
  std::string message;
  std::optional<std::string> id;  // when the message named a usable id
};

using ClientMessage = std::variant<SubMessage, UnsubMessage, AuthMessage, ProtocolError>;

constexpr size_t kMaxMessageBytes = 16 * 1024;
constexpr size_t kMaxIdLength = 64;
constexpr size_t kMaxCursorLength = 64;
// Levels of objects and arrays, the message itself being level 1 (SPEC 5.7).
constexpr size_t kMaxNesting = 32;
constexpr size_t kMaxFilterFields = 8;
// A token in an auth message: longer ones are refused before any verification (a JWT with a
// large claim set is a few KiB; the message limit is 16 KiB anyway).
constexpr size_t kMaxTokenLength = 8 * 1024;

ClientMessage parse_client_message(std::string_view text);

namespace frames {
std::string subscribed(const std::string& id, const std::string& cursor);
std::string resync(const std::string& id, const std::string& cursor, std::string_view reason);
std::string revoked(const std::string& id, std::string_view reason = "access_denied");
std::string progress(const std::string& cursor);
// SPEC 5.3 rev 4: the socket's JWT expires in `in_ms`; the tab answers with an auth message.
std::string auth_expiring(int64_t in_ms);
std::string error(std::string_view code, std::string_view message,
                  const std::optional<std::string>& id = std::nullopt);
// An update frame is written as two buffers so the data is serialised once for every socket:
// update_head(ids) + the shared update_tail(key, cursor, data_json).
std::string update_head(const std::vector<std::string>& ids);
std::string update_tail(const std::string& key, const std::string& cursor,
                        const std::string& data_json);
}  // namespace frames

}  // namespace outlive::tab
