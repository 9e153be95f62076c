#pragma once
// Base64url without padding (RFC 7515 2, RFC 4648 5), strict: a JWS part or JWK member that is
// not the one canonical encoding of its bytes is refused, so a token has exactly one spelling.
#include <optional>
#include <string>
#include <string_view>

namespace outlive::jwt {

inline bool is_base64url_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

// nullopt for any byte outside the alphabet (padding included), a length of 4n+1, or unused
// trailing bits that are not zero.
std::optional<std::string> base64url_decode(std::string_view text);
std::string base64url_encode(std::string_view bytes);

}  // namespace outlive::jwt
