#include "admission/proxies.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

namespace outlive::admission {

namespace {

// IPv4 as IPv4-mapped IPv6 so that one comparison serves both families.
std::optional<std::array<uint8_t, 16>> to_bytes(std::string_view text, bool& v6) {
  std::string s(text);
  // "[::1]" and "::ffff:1.2.3.4" as gateways write them.
  if (s.size() > 2 && s.front() == '[' && s.back() == ']') s = s.substr(1, s.size() - 2);
  std::array<uint8_t, 16> out{};
  in_addr a4{};
  if (inet_pton(AF_INET, s.c_str(), &a4) == 1) {
    out[10] = out[11] = 0xff;
    std::memcpy(out.data() + 12, &a4, 4);
    v6 = false;
    return out;
  }
  in6_addr a6{};
  if (inet_pton(AF_INET6, s.c_str(), &a6) == 1) {
    std::memcpy(out.data(), &a6, 16);
    v6 = true;
    return out;
  }
  return std::nullopt;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

std::string limit_key(std::string_view address, int ipv6_prefix) {
  bool v6 = false;
  auto bytes = to_bytes(address, v6);
  if (!bytes || !v6) return std::string(address);
  const int prefix = std::clamp(ipv6_prefix, 0, 128);
  for (int bit = prefix; bit < 128; ++bit)
    (*bytes)[bit / 8] &= static_cast<uint8_t>(~(0x80 >> (bit % 8)));
  char text[INET6_ADDRSTRLEN];
  in6_addr a6{};
  std::memcpy(&a6, bytes->data(), 16);
  inet_ntop(AF_INET6, &a6, text, sizeof text);
  return std::string(text) + "/" + std::to_string(prefix);
}

std::optional<AddressRange> AddressRange::parse(std::string_view text) {
  AddressRange r;
  const auto slash = text.find('/');
  auto bytes = to_bytes(text.substr(0, slash), r.v6_);
  if (!bytes) return std::nullopt;
  r.bytes_ = *bytes;
  const int max = r.v6_ ? 128 : 32;
  int prefix = max;
  if (slash != std::string_view::npos) {
    const auto digits = text.substr(slash + 1);
    if (digits.empty() || digits.size() > 3 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return std::nullopt;
    prefix = std::stoi(std::string(digits));
    if (prefix > max) return std::nullopt;
  }
  r.prefix_ = r.v6_ ? prefix : prefix + 96;
  return r;
}

bool AddressRange::contains(std::string_view address) const {
  bool v6 = false;
  const auto bytes = to_bytes(address, v6);
  if (!bytes) return false;
  int bits = prefix_;
  for (size_t i = 0; i < 16 && bits > 0; ++i, bits -= 8) {
    const uint8_t mask = bits >= 8 ? 0xff : static_cast<uint8_t>(0xff << (8 - bits));
    if (((*bytes)[i] & mask) != (bytes_[i] & mask)) return false;
  }
  return true;
}

TrustedProxies::TrustedProxies(const std::vector<std::string>& ranges) {
  for (const auto& r : ranges) {
    if (auto parsed = AddressRange::parse(r)) ranges_.push_back(*parsed);
  }
}

bool TrustedProxies::trusted(std::string_view address) const {
  return std::any_of(ranges_.begin(), ranges_.end(),
                     [&](const AddressRange& r) { return r.contains(address); });
}

std::string TrustedProxies::client_address(const std::string& peer,
                                           std::string_view forwarded_for) const {
  if (forwarded_for.empty() || !trusted(peer)) return peer;
  // Right to left: each trusted proxy appended the address it saw; the first hop not trusted is
  // the client (anything left of it was written by the client and proves nothing).
  std::string_view rest = forwarded_for;
  while (!rest.empty()) {
    const auto comma = rest.rfind(',');
    const auto hop = trim(comma == std::string_view::npos ? rest : rest.substr(comma + 1));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(0, comma);
    if (hop.empty()) continue;
    bool v6 = false;
    if (!to_bytes(hop, v6)) return peer;  // garbage from an untrusted hop: count the proxy
    if (!trusted(hop)) return std::string(hop);
  }
  return peer;
}

}  // namespace outlive::admission
