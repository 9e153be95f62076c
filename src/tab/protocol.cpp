#include "tab/protocol.hpp"

#include <algorithm>

#include "common/json_depth.hpp"

namespace outlive::tab {
namespace {

ProtocolError invalid(std::string message, std::optional<std::string> id = std::nullopt) {
  return ProtocolError{"invalid_message", std::move(message), std::move(id)};
}

std::optional<std::string> usable_id(const std::string& s) {
  if (s.empty() || s.size() > kMaxIdLength) return std::nullopt;
  return s;
}

// Reads only the message's own "id" from a message too deep to build: nothing is kept of the
// values inside it.
class IdReader : public nlohmann::json_sax<nlohmann::json> {
 public:
  std::optional<std::string> id;
  bool top_level_object = false;

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t& s) override {
    const bool is_id = key_is_id_;
    value();
    if (is_id) id = usable_id(s);
    return true;
  }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    if (depth_ == 0) top_level_object = true;
    ++depth_;
    return value();
  }
  bool key(string_t& k) override {
    key_is_id_ = depth_ == 1 && k == "id";
    return true;
  }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    ++depth_;
    return value();
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  // As in the parsed document, the last "id" wins: one that is not a string leaves no id.
  bool value() {
    if (key_is_id_) id.reset();
    key_is_id_ = false;
    return true;
  }

  size_t depth_ = 0;
  bool key_is_id_ = false;
};

}  // namespace

ClientMessage parse_client_message(std::string_view text) {
  // JSON has no raw NUL byte (in a string it is written \u0000), but nlohmann's lexer ends the
  // input at one: `{"type":"unsub","id":"x"}` followed by a NUL and anything would be accepted.
  if (text.find('\0') != std::string_view::npos) return invalid("not JSON");
  if (json_nesting_depth(text) > kMaxNesting) {
    IdReader reader;
    if (!nlohmann::json::sax_parse(text, &reader, nlohmann::json::input_format_t::json,
                                   /*strict=*/true, /*ignore_comments=*/false)) {
      return invalid("not JSON");
    }
    if (!reader.top_level_object) return invalid("a message is a JSON object");
    return invalid("nested deeper than " + std::to_string(kMaxNesting) + " levels", reader.id);
  }
  const auto doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return invalid("not JSON");
  if (!doc.is_object()) return invalid("a message is a JSON object");
  std::optional<std::string> id;
  if (auto it = doc.find("id"); it != doc.end() && it->is_string()) {
    id = usable_id(it->get_ref<const std::string&>());
  }
  const auto type = doc.find("type");
  if (type == doc.end() || !type->is_string()) return invalid("missing \"type\"", id);
  const auto& t = type->get_ref<const std::string&>();
  if (t == "auth") {
    const auto token = doc.find("token");
    if (token == doc.end() || !token->is_string() || token->get_ref<const std::string&>().empty())
      return invalid("\"token\" must be a non-empty string");
    if (token->get_ref<const std::string&>().size() > kMaxTokenLength)
      return invalid("\"token\" is longer than " + std::to_string(kMaxTokenLength) + " bytes");
    return AuthMessage{token->get<std::string>()};
  }
  if (t != "sub" && t != "unsub")
    return invalid("unknown type \"" + t + "\" (sub, unsub or auth)", id);
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
  if (auto filter = doc.find("filter"); filter != doc.end() && !filter->is_null()) {
    const std::string shape =
        "\"filter\" must be an object of at most " + std::to_string(kMaxFilterFields) + " fields";
    if (!filter->is_object() || filter->size() > kMaxFilterFields) return invalid(shape, id);
    Filter fields;
    fields.reserve(filter->size());
    for (const auto& [name, value] : filter->items()) {
      if (value.is_structured()) {
        return invalid(
            "\"filter\" field \"" + name + "\" must be a string, number, boolean or null", id);
      }
      fields.emplace_back(name, value);
    }
    if (!fields.empty()) sub.filter = std::make_shared<const Filter>(std::move(fields));
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

namespace {
// A JSON string. Ids and reasons are almost always plain printable ASCII, copied as they are; a
// revocation writes thousands of these frames in one round, where building a json object for
// each cost more than the frame's system call.
void append_quoted(std::string& out, std::string_view s) {
  const bool plain = std::all_of(
      s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7f && c != '"' && c != '\\'; });
  if (!plain) {
    out += nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return;
  }
  out += '"';
  out.append(s);
  out += '"';
}
}  // namespace

std::string revoked(const std::string& id, std::string_view reason) {
  std::string out;
  out.reserve(id.size() + reason.size() + 40);
  out += R"({"id":)";
  append_quoted(out, id);
  out += R"(,"reason":)";
  append_quoted(out, reason);
  out += R"(,"type":"revoked"})";
  return out;
}

std::string progress(const std::string& cursor) {
  return nlohmann::json{{"type", "progress"}, {"cursor", cursor}}.dump();
}

std::string auth_expiring(int64_t in_ms) {
  return nlohmann::json{{"type", "auth_expiring"}, {"in_ms", in_ms}}.dump();
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
}  // namespace outlive::tab
