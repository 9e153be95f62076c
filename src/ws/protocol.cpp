#include "ws/protocol.hpp"

namespace outlive::ws {
namespace {

ProtocolError invalid(std::string message, std::optional<std::string> id = std::nullopt) {
  return ProtocolError{"invalid_message", std::move(message), std::move(id)};
}

}  // namespace

ClientMessage parse_client_message(std::string_view text) {
  const auto doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return invalid("not JSON");
  if (!doc.is_object()) return invalid("a message is a JSON object");
  std::optional<std::string> id;
  if (auto it = doc.find("id"); it != doc.end() && it->is_string()) {
    const auto& s = it->get_ref<const std::string&>();
    if (!s.empty() && s.size() <= kMaxIdLength) id = s;
  }
  const auto type = doc.find("type");
  if (type == doc.end() || !type->is_string()) return invalid("missing \"type\"", id);
  const auto& t = type->get_ref<const std::string&>();
  if (t != "sub" && t != "unsub") return invalid("unknown type \"" + t + "\" (sub or unsub)", id);
  if (!id) return invalid("\"id\" must be a string of 1 to 64 characters");
  if (t == "unsub") return UnsubMessage{*id};

  SubMessage sub;
  sub.id = *id;
  const auto channel = doc.find("channel");
  if (channel == doc.end() || !channel->is_string() ||
      channel->get_ref<const std::string&>().empty()) {
    return invalid("\"channel\" must be a non-empty string", id);
  }
  sub.channel = channel->get<std::string>();
  if (auto scope = doc.find("scope"); scope != doc.end() && !scope->is_null()) sub.scope = *scope;
  if (auto cursor = doc.find("cursor"); cursor != doc.end() && !cursor->is_null()) {
    if (!cursor->is_string()) return invalid("\"cursor\" must be a string", id);
    const auto& c = cursor->get_ref<const std::string&>();
    // An over-long cursor is still a cursor "from another topic": resync, not an error.
    sub.cursor = c.size() <= kMaxCursorLength ? c : std::string();
  }
  return sub;
}

namespace frames {

std::string subscribed(const std::string& id, const std::string& cursor) {
  return nlohmann::json{{"type", "subscribed"}, {"id", id}, {"cursor", cursor}}.dump();
}

std::string resync(const std::string& id, const std::string& cursor, std::string_view reason) {
  return nlohmann::json{{"type", "resync"}, {"id", id}, {"cursor", cursor}, {"reason", reason}}
      .dump();
}

std::string revoked(const std::string& id, std::string_view reason) {
  return nlohmann::json{{"type", "revoked"}, {"id", id}, {"reason", reason}}.dump();
}

std::string progress(const std::string& cursor) {
  return nlohmann::json{{"type", "progress"}, {"cursor", cursor}}.dump();
}

std::string error(std::string_view code, std::string_view message,
                  const std::optional<std::string>& id) {
  nlohmann::json j{{"type", "error"}, {"code", code}, {"message", message}};
  if (id) j["id"] = *id;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string update_head(const std::vector<std::string>& ids) {
  return R"({"type":"update","ids":)" + nlohmann::json(ids).dump();
}

std::string update_tail(const std::string& key, const std::string& cursor,
                        const std::string& data_json) {
  const std::string k = nlohmann::json(key).dump();
  const std::string c = nlohmann::json(cursor).dump();
  std::string out;
  out.reserve(k.size() + c.size() + data_json.size() + 24);  // exact: shared by every socket
  out.append(R"(,"key":)")
      .append(k)
      .append(R"(,"cursor":)")
      .append(c)
      .append(R"(,"data":)")
      .append(data_json)
      .append("}");
  return out;
}

}  // namespace frames
}  // namespace outlive::ws
