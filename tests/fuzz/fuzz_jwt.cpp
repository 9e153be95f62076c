// JWT and JWKS parsing (src/jwt/token, SPEC 5.1 rev 4) on arbitrary bytes. The input is used three
// ways: as a JWKS document (KeySet::from_jwks: a key set or outlive::Error, nothing else); as a
// compact token verified against fixed key sets (RSA, EC, Ed25519; an HMAC secret); and as the claims of
// a token the target signs itself with the HMAC secret, so the claim checks behind the signature
// are reached too.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/error.hpp"
#include "jwt/token.hpp"
#include "support/jwt_signer.hpp"

using namespace outlive::jwt;
using outlive::testing::TestKey;

namespace {

constexpr int64_t kNow = 1'800'000'000;

void require(bool condition) {
  if (!condition) std::abort();
}

struct Fixed {
  TestKey rsa = TestKey::rsa("rsa");
  TestKey ec = TestKey::ec("ec");
  TestKey ed = TestKey::ed25519("ed");
  TestKey hmac = TestKey::hmac("a-secret-of-at-least-32-bytes-for-the-fuzzer");
  KeySet jwks = KeySet::from_jwks(outlive::testing::jwks({&rsa, &ec, &ed}));
  KeySet secrets = KeySet::from_secrets(hmac.secret(), "");
  Policy policy;
  Fixed() {
    policy.algorithms = {Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA, Algorithm::HS256};
    policy.issuer = "iss";
    policy.audience = "aud";
  }
};

const Fixed& fixed() {
  static const Fixed f;
  return f;
}

void check_claims(const Verdict& v) {
  if (const auto* c = std::get_if<Claims>(&v)) {
    require(!c->subject.empty());
    require(c->expires_at + 30 > kNow);
    require(c->payload.is_object());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const Fixed& f = fixed();

  try {
    const KeySet set = KeySet::from_jwks(text);
    require(set.size() > 0);
  } catch (const outlive::Error& e) {
    require(e.code() == outlive::Errc::invalid_input);
  }

  // Nothing the fuzzer writes is signed by the fixed key pairs (their private halves are never
  // used); the HMAC secret is in the seeds, so those tokens may verify, with sound claims.
  require(std::holds_alternative<Failure>(verify(text, f.jwks, f.policy, kNow)));
  const Verdict by_secret = verify(text, f.secrets, f.policy, kNow);
  check_claims(by_secret);
  if (std::holds_alternative<Claims>(by_secret)) require(looks_like_jwt(text));

  // The input as the claims (and, after a newline, the header's extra members) of a token signed
  // with the HMAC secret: the signature holds, so the claim checks run.
  const size_t newline = text.find('\n');
  const std::string header = newline == std::string_view::npos
                                 ? std::string(R"({"alg":"HS256"})")
                                 : R"({"alg":"HS256",)" + std::string(text.substr(newline + 1)) + "}";
  const std::string input =
      outlive::testing::b64url(header) + "." + outlive::testing::b64url(text.substr(0, newline));
  const std::string token = input + "." + outlive::testing::b64url(f.hmac.signature(input));
  check_claims(verify(token, f.secrets, f.policy, kNow));
  return 0;
}
