#include "topic/cursor.hpp"

#include <array>

namespace outlive::topic {
namespace {

constexpr uint8_t kVersion = 1;
constexpr size_t kBytes = 1 + 4 + 8 + 8 + 2;  // version, app hash, instance, position, check
constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

uint32_t fnv1a(const uint8_t* data, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; ++i) {
    h ^= data[i];
    h *= 16777619u;
  }
  return h;
}

int alphabet_index(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '-') return 62;
  if (c == '_') return 63;
  return -1;
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
  std::string out;
  uint32_t buffer = 0;
  int bits = 0;
  for (uint8_t byte : raw) {
    buffer = (buffer << 8) | byte;
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out.push_back(kAlphabet[(buffer >> bits) & 0x3f]);
    }
  }
  if (bits > 0) out.push_back(kAlphabet[(buffer << (6 - bits)) & 0x3f]);
  return out;
}

std::optional<Cursor> Cursor::decode(std::string_view text) {
  constexpr size_t kChars = (kBytes * 8 + 5) / 6;
  if (text.size() != kChars) return std::nullopt;
  std::array<uint8_t, kBytes> raw{};
  uint32_t buffer = 0;
  int bits = 0;
  size_t n = 0;
  for (char c : text) {
    const int v = alphabet_index(c);
    if (v < 0) return std::nullopt;
    buffer = (buffer << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      if (n < kBytes) raw[n++] = static_cast<uint8_t>((buffer >> bits) & 0xff);
    }
  }
  if (n != kBytes || (buffer & ((1u << bits) - 1)) != 0) return std::nullopt;  // canonical padding
  if (raw[0] != kVersion) return std::nullopt;
  if (get(&raw[21], 2) != (fnv1a(raw.data(), 21) & 0xffff)) return std::nullopt;
  return Cursor{static_cast<uint32_t>(get(&raw[1], 4)), static_cast<int64_t>(get(&raw[5], 8)),
                get(&raw[13], 8)};
}

}  // namespace outlive::topic
