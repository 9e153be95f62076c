#pragma once
// The client address behind gateways (SPEC 5.1 rev 2): the TCP peer's, unless the peer is a
// trusted proxy; then the right-most X-Forwarded-For hop that is not itself a trusted proxy. Pure.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace outlive::admission {

// An address or a CIDR range, IPv4 or IPv6 ("127.0.0.0/8", "::1", "10.1.2.3").
class AddressRange {
 public:
  // nullopt when `text` is not an address or range.
  static std::optional<AddressRange> parse(std::string_view text);
  bool contains(std::string_view address) const;

 private:
  std::array<uint8_t, 16> bytes_{};
  bool v6_ = false;
  int prefix_ = 0;
};

// The key per-address limits count under (SPEC 5.7 rev 3): an IPv4 address as it is, an IPv6
// address cut to its first `ipv6_prefix` bits ("2001:db8:1:2::/64"), since one host is usually
// given a whole /64 and could otherwise open from a new address each time. Text that is not an
// address is its own key.
std::string limit_key(std::string_view address, int ipv6_prefix = 64);

class TrustedProxies {
 public:
  TrustedProxies() = default;
  // Entries that do not parse are ignored (the configuration schema refuses them first).
  explicit TrustedProxies(const std::vector<std::string>& ranges);
  bool trusted(std::string_view address) const;
  // The address limits count, for a connection from `peer` carrying `forwarded_for`.
  std::string client_address(const std::string& peer, std::string_view forwarded_for) const;

 private:
  std::vector<AddressRange> ranges_;
};

}  // namespace outlive::admission
