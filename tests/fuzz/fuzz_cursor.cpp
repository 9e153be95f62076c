// topic::Cursor (src/topic/cursor) on arbitrary text from a tab: what decodes is exactly what
// encode() writes (one text per cursor), and every cursor survives encode then decode.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "topic/cursor.hpp"

using outlive::topic::Cursor;

namespace {

void require(bool condition) {
  if (!condition) std::abort();
}

bool same(const Cursor& a, const Cursor& b) {
  return a.app_hash == b.app_hash && a.instance == b.instance && a.position == b.position;
}

void round_trip(const Cursor& c) {
  const std::string text = c.encode();
  require(!text.empty() && text.size() <= outlive::topic::kMaxCursorLength);
  for (const char ch : text) require(ch > 0x20 && ch < 0x7F);
  const auto back = Cursor::decode(text);
  require(back && same(*back, c));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (const auto c = Cursor::decode(text)) {
    require(c->encode() == text);
    round_trip(*c);
  }
  // The same bytes as the fields of a cursor.
  Cursor c;
  if (size >= sizeof c.app_hash + sizeof c.instance + sizeof c.position) {
    std::memcpy(&c.app_hash, data, sizeof c.app_hash);
    std::memcpy(&c.instance, data + sizeof c.app_hash, sizeof c.instance);
    std::memcpy(&c.position, data + sizeof c.app_hash + sizeof c.instance, sizeof c.position);
    round_trip(c);
  }
  return 0;
}
