// parse_client_message (src/tab/protocol) on arbitrary text from a tab: it answers every input
// with a message or an invalid_message error, and what it accepts keeps within SPEC 5.2 and 5.7.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <variant>

#include "tab/protocol.hpp"

using namespace outlive::tab;

namespace {

void require(bool condition) {
  if (!condition) std::abort();
}

bool usable_id(const std::string& id) { return !id.empty() && id.size() <= kMaxIdLength; }

// Levels of `j`, itself included; only called on what the parser accepted (at most 32 levels), so
// the recursion is bounded.
size_t levels(const nlohmann::json& j) {
  if (!j.is_structured()) return 0;
  size_t deepest = 0;
  for (const auto& child : j) deepest = std::max(deepest, levels(child));
  return deepest + 1;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const ClientMessage m = parse_client_message(text);
  if (const auto* sub = std::get_if<SubMessage>(&m)) {
    require(usable_id(sub->id));
    require(!sub->channel.empty());
    require(!sub->cursor || sub->cursor->size() <= kMaxCursorLength);
    require(levels(sub->scope) + 1 <= kMaxNesting);
    (void)frames::subscribed(sub->id, sub->cursor.value_or(""));
  } else if (const auto* unsub = std::get_if<UnsubMessage>(&m)) {
    require(usable_id(unsub->id));
  } else if (const auto* auth = std::get_if<AuthMessage>(&m)) {
    require(!auth->token.empty() && auth->token.size() <= kMaxTokenLength);
  } else {
    const auto& error = std::get<ProtocolError>(m);
    require(error.code == "invalid_message");
    require(!error.id || usable_id(*error.id));
    // The answer is written whatever the id holds.
    (void)frames::error(error.code, error.message, error.id);
  }
  return 0;
}
