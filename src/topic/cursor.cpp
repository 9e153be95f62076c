#include "topic/cursor.hpp"

#include <array>

#include "common/base64url.hpp"

namespace outlive::topic {
namespace {

constexpr uint8_t kVersion = 1;
constexpr size_t kBytes = 1 + 4 + 8 + 8 + 2;  // version, app hash, instance, position, check

uint32_t fnv1a(const uint8_t* data, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; ++i) {
    h ^= data[i];
    h *= 16777619u;
  }
  return h;
}

void put(uint8_t* out, uint64_t v, int n) {
  for (int i = n - 1; i >= 0; --i) {
    out[i] = static_cast<uint8_t>(v & 0xff);
    v >>= 8;
  }
}

uint64_t get(const uint8_t* in, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | in[i];
  return v;
}

}  // namespace

Cursor Cursor::at(const TopicIdentity& topic, uint64_t position) {
  const auto* p = reinterpret_cast<const uint8_t*>(topic.app_id.data());
  return Cursor{fnv1a(p, topic.app_id.size()), topic.instance, position};
}

bool Cursor::belongs_to(const TopicIdentity& topic) const {
  const Cursor expected = at(topic, 0);
  return expected.app_hash == app_hash && expected.instance == instance;
}

std::string Cursor::encode() const {
  std::array<uint8_t, kBytes> raw{};
  raw[0] = kVersion;
  put(&raw[1], app_hash, 4);
  put(&raw[5], static_cast<uint64_t>(instance), 8);
  put(&raw[13], position, 8);
  put(&raw[21], fnv1a(raw.data(), 21) & 0xffff, 2);
  return base64url_encode(std::string_view(reinterpret_cast<const char*>(raw.data()), raw.size()));
}

std::optional<Cursor> Cursor::decode(std::string_view text) {
  constexpr size_t kChars = (kBytes * 8 + 5) / 6;
  if (text.size() != kChars) return std::nullopt;
  // Strict (the alphabet only, zero trailing bits): a cursor has one spelling.
  const auto bytes = base64url_decode(text);
  if (!bytes || bytes->size() != kBytes) return std::nullopt;
  const auto* raw = reinterpret_cast<const uint8_t*>(bytes->data());
  if (raw[0] != kVersion) return std::nullopt;
  if (get(&raw[21], 2) != (fnv1a(raw, 21) & 0xffff)) return std::nullopt;
  return Cursor{static_cast<uint32_t>(get(&raw[1], 4)), static_cast<int64_t>(get(&raw[5], 8)),
                get(&raw[13], 8)};
}

}  // namespace outlive::topic
