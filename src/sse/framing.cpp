#include "sse/framing.hpp"

#include <nlohmann/json.hpp>

#include "common/base64url.hpp"

namespace outlive::sse {

using json = nlohmann::json;

void append_event(std::string& out, std::initializer_list<std::string_view> data) {
  out += "data: ";
  for (auto part : data) {
    for (char c : part) {
      if (c == '\n') {
        out += "\ndata: ";
      } else if (c != '\r') {  // (a lone CR would end the line too; JSON needs none)
        out += c;
      }
    }
  }
  out += "\n\n";
}

std::string event(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 8);
  append_event(out, {data});
  return out;
}

std::string close_event(uint16_t code, std::string_view reason) {
  const json j = {{"code", code}, {"reason", std::string(reason)}};
  std::string out = "event: close\n";
  append_event(out, {j.dump(-1, ' ', false, json::error_handler_t::replace)});
  return out;
}

int refusal_status(uint16_t close_code, std::string_view error_code) {
  switch (close_code) {
    case 1008:
      if (error_code == "forbidden_origin") return 403;
      if (error_code == "unknown_app") return 404;
      return 401;
    case 4401:
      return 401;
    case 1013:
      return 429;
    case 1009:
      return 400;
    default:  // 1011, 1012: a failed check or a stopping replica, try again
      return 503;
  }
}

namespace {
std::variant<Subs, SubsError> subs_of(const json& array) {
  if (!array.is_array()) return SubsError{"subs must be a JSON array of sub messages"};
  Subs subs;
  for (const auto& m : array) {
    if (!m.is_object() || m.value("type", json()) != "sub") {
      return SubsError{"every element of subs must be a sub message ({\"type\":\"sub\",...})"};
    }
    subs.push_back(m.dump(-1, ' ', false, json::error_handler_t::replace));
  }
  return subs;
}
}  // namespace

std::variant<Subs, SubsError> parse_subs(std::string_view text) {
  // '=' padding is tolerated (some encoders add it, percent-encoded or not).
  std::string trimmed(text);
  while (trimmed.ends_with("%3D") || trimmed.ends_with("%3d")) trimmed.resize(trimmed.size() - 3);
  while (trimmed.ends_with('=')) trimmed.pop_back();
  if (trimmed.empty()) return SubsError{"missing subs"};
  if (trimmed.size() > (kMaxSubsBytes * 4 + 2) / 3) return SubsError{"subs larger than 16 KiB"};
  auto decoded = base64url_decode(trimmed);
  if (!decoded) return SubsError{"subs is not base64url"};
  if (decoded->size() > kMaxSubsBytes) return SubsError{"subs larger than 16 KiB"};
  json array = json::parse(*decoded, nullptr, false);
  if (array.is_discarded()) return SubsError{"subs is not JSON"};
  return subs_of(array);
}

std::variant<Body, SubsError> parse_body(std::string_view text) {
  json body = json::parse(text, nullptr, false);
  if (body.is_discarded() || !body.is_object()) return SubsError{"the body is not a JSON object"};
  const auto subs = body.find("subs");
  if (subs == body.end()) return SubsError{"missing subs"};
  if (subs->dump().size() > kMaxSubsBytes) return SubsError{"subs larger than 16 KiB"};
  auto parsed = subs_of(*subs);
  if (auto* error = std::get_if<SubsError>(&parsed)) return *error;
  Body out{std::get<Subs>(std::move(parsed)), {}};
  if (auto token = body.find("token"); token != body.end()) {
    if (!token->is_string()) return SubsError{"token must be a string"};
    out.token = token->get<std::string>();
  }
  return out;
}

std::string query_value(std::string_view target, std::string_view name) {
  const auto q = target.find('?');
  if (q == std::string_view::npos) return {};
  std::string_view query = target.substr(q + 1);
  while (!query.empty()) {
    const auto amp = query.find('&');
    const auto pair = query.substr(0, amp);
    const auto eq = pair.find('=');
    if (pair.substr(0, eq) == name) {
      return eq == std::string_view::npos ? std::string() : std::string(pair.substr(eq + 1));
    }
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return {};
}

}  // namespace outlive::sse
