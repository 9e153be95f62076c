// The shared base64url codec (src/common/base64url): no padding, strict decoding (one spelling per
// byte string), as JWS parts, JWK members and cursors use it. Encoding is checked against the test
// signer's own encoder (tests/support/jwt_signer, independent of src/).
#include <catch2/catch.hpp>

#include <string>

#include "common/base64url.hpp"
#include "support/jwt_signer.hpp"

using outlive::base64url_decode;
using outlive::base64url_encode;

TEST_CASE("base64url: RFC 4648 vectors without padding, both ways") {
  const std::pair<std::string, std::string> vectors[] = {
      {"", ""},           {"f", "Zg"},          {"fo", "Zm8"},          {"foo", "Zm9v"},
      {"foob", "Zm9vYg"}, {"fooba", "Zm9vYmE"}, {"foobar", "Zm9vYmFy"}, {"\xfb\xff", "-_8"}};
  for (const auto& [bytes, text] : vectors) {
    CHECK(base64url_encode(bytes) == text);
    const auto decoded = base64url_decode(text);
    REQUIRE(decoded);
    CHECK(*decoded == bytes);
  }
}

TEST_CASE("base64url: every length and byte round-trips and matches an independent encoder") {
  std::string bytes;
  for (int i = 0; i < 300; ++i) {
    bytes.push_back(static_cast<char>((i * 37 + 11) & 0xff));
    const std::string text = base64url_encode(bytes);
    CHECK(text == outlive::testing::b64url(bytes));
    const auto decoded = base64url_decode(text);
    REQUIRE(decoded);
    CHECK(*decoded == bytes);
  }
}

TEST_CASE("base64url: decoding refuses padding, other alphabets, 4n+1 lengths and stray bits") {
  CHECK_FALSE(base64url_decode("Zg=="));  // padding
  CHECK_FALSE(base64url_decode("Zm8="));
  CHECK_FALSE(base64url_decode("+/8"));    // base64, not base64url
  CHECK_FALSE(base64url_decode("Zm9 v"));  // whitespace
  CHECK_FALSE(base64url_decode(std::string("Zm\0v", 4)));
  CHECK_FALSE(base64url_decode("Zm9vY"));  // 4n+1 characters
  CHECK_FALSE(base64url_decode("Z"));
  CHECK_FALSE(base64url_decode("Zh"));   // "f" with non-zero trailing bits
  CHECK_FALSE(base64url_decode("Zm9"));  // "fo" with non-zero trailing bits
  CHECK(base64url_decode("Zm8"));
}
