#pragma once
// Base64url without padding (RFC 4648 5, RFC 7515 2), strict: text that is not the one canonical
// encoding of its bytes is refused, so a JWS part, a JWK member or a cursor has exactly one
// spelling. The one codec of the replica (src/jwt, src/topic/cursor) and of the demo's token
// issuer; tests/support/jwt_signer keeps its own encoder on purpose (an independent writer).
#include <optional>
#include <string>
#include <string_view>

namespace outlive {

inline bool is_base64url_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

// nullopt for any byte outside the alphabet (padding included), a length of 4n+1, or unused
// trailing bits that are not zero.
std::optional<std::string> base64url_decode(std::string_view text);
std::string base64url_encode(std::string_view bytes);

}  // namespace outlive
