// JWT verification (SPEC 5.1 rev 4), pure: src/jwt/token against tokens and JWKS documents made by
// tests/support/jwt_signer (OpenSSL keys, its own encoder), at a fixed `now`.
#include <catch2/catch.hpp>
#include <limits>
#include <string>

#include "common/error.hpp"
#include "jwt/token.hpp"
#include "jwt/verifier.hpp"
#include "support/jwt_signer.hpp"

using namespace outlive::jwt;
using outlive::testing::b64url;
using outlive::testing::claims;
using outlive::testing::jwks;
using outlive::testing::TestKey;
using outlive::testing::unsigned_token;
using json = nlohmann::json;

namespace {

constexpr int64_t kNow = 1'800'000'000;
const std::string kSecret = "a-secret-of-at-least-32-bytes-for-hs256!";
const std::string kPreviousSecret = "the-previous-secret-also-32-bytes-long!!";

// Made once: RSA key generation takes a good fraction of a second on this machine.
const TestKey& rsa_key() {
  static const TestKey k = TestKey::rsa("rsa-1");
  return k;
}
const TestKey& ec_key() {
  static const TestKey k = TestKey::ec("ec-1");
  return k;
}
const TestKey& ed_key() {
  static const TestKey k = TestKey::ed25519("ed-1");
  return k;
}
const TestKey& hmac_key() {
  static const TestKey k = TestKey::hmac(kSecret);
  return k;
}

const KeySet& jwks_set() {
  static const KeySet s = KeySet::from_jwks(jwks({&rsa_key(), &ec_key(), &ed_key()}));
  return s;
}
const KeySet& secret_set() {
  static const KeySet s = KeySet::from_secrets(kSecret, kPreviousSecret);
  return s;
}

Policy all_algorithms() {
  Policy p;
  p.algorithms = {Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA, Algorithm::HS256};
  return p;
}

const KeySet& set_for(const TestKey& k) {
  return k.kind() == TestKey::Kind::hmac ? secret_set() : jwks_set();
}

std::optional<Failure> failure_of(const Verdict& v) {
  if (const auto* f = std::get_if<Failure>(&v)) return *f;
  return std::nullopt;
}

std::string failure_name(const Verdict& v) {
  const auto f = failure_of(v);
  return f ? name_of(*f) : "ok";
}

// Each algorithm's key, for the checks every algorithm must pass.
const TestKey& key_named(const std::string& alg) {
  if (alg == "RS256") return rsa_key();
  if (alg == "ES256") return ec_key();
  if (alg == "EdDSA") return ed_key();
  return hmac_key();
}

std::string with_signature(const std::string& token, const std::string& signature) {
  return token.substr(0, token.rfind('.') + 1) + signature;
}

}  // namespace

TEST_CASE("jwt: each algorithm verifies a good token and refuses a forged one") {
  const std::string alg = GENERATE(as<std::string>{}, "RS256", "ES256", "EdDSA", "HS256");
  CAPTURE(alg);
  const TestKey& key = key_named(alg);
  const KeySet& keys = set_for(key);
  const std::string token = key.sign(claims("ada", kNow));
  const Verdict good = verify(token, keys, all_algorithms(), kNow);
  REQUIRE(failure_name(good) == "ok");
  CHECK(std::get<Claims>(good).subject == "ada");
  CHECK(std::get<Claims>(good).expires_at == kNow + 300);
  CHECK(std::get<Claims>(good).issued_at == kNow);

  SECTION("a bad signature: one bit flipped") {
    const std::string real_b64 = token.substr(token.rfind('.') + 1);
    std::string forged = token;
    // Flip a bit in the middle of the signature's encoding (not its last character, whose low
    // bits may be padding).
    char& c = forged[token.rfind('.') + 1 + real_b64.size() / 2];
    c = c == 'A' ? 'B' : 'A';
    CHECK(failure_name(verify(forged, keys, all_algorithms(), kNow)) == "signature");
  }
  SECTION("a bad signature: the claims changed after signing") {
    const std::string other = key.sign(claims("eve", kNow));
    const size_t a = token.find('.'), b = token.rfind('.');
    const size_t oa = other.find('.'), ob = other.rfind('.');
    const std::string spliced = token.substr(0, a) + other.substr(oa, ob - oa) + token.substr(b);
    CHECK(failure_name(verify(spliced, keys, all_algorithms(), kNow)) == "signature");
  }
  SECTION("a signature of another key of the same algorithm") {
    const TestKey other = alg == "RS256"   ? TestKey::rsa(key.kid())
                          : alg == "ES256" ? TestKey::ec(key.kid())
                          : alg == "EdDSA" ? TestKey::ed25519(key.kid())
                                           : TestKey::hmac("another-secret-of-32-bytes-or-more!!");
    CHECK(failure_name(verify(other.sign(claims("ada", kNow)), keys, all_algorithms(), kNow)) ==
          "signature");
  }
  SECTION("an empty signature") {
    CHECK(failure_name(verify(with_signature(token, ""), keys, all_algorithms(), kNow)) == "signature");
  }
  SECTION("the algorithm not configured") {
    Policy p = all_algorithms();
    p.algorithms.erase(*algorithm_named(alg));
    CHECK(failure_name(verify(token, keys, p, kNow)) == "algorithm");
  }
  SECTION("alg: none, unsigned, with and without the key's kid") {
    CHECK(failure_name(verify(unsigned_token(claims("ada", kNow)), keys, all_algorithms(), kNow)) ==
          "algorithm");
    CHECK(failure_name(verify(unsigned_token(claims("ada", kNow), {{"kid", key.kid()}}), keys,
                              all_algorithms(), kNow)) == "algorithm");
    // The real signature kept, the header changed to none.
    const std::string header = b64url(json{{"alg", "none"}}.dump());
    const std::string relabelled = header + token.substr(token.find('.'));
    CHECK(failure_name(verify(relabelled, keys, all_algorithms(), kNow)) == "algorithm");
    for (const char* spelling : {"None", "NONE", "nOnE", ""}) {
      CAPTURE(spelling);
      CHECK(failure_name(verify(unsigned_token(claims("ada", kNow), {{"alg", spelling}}), keys,
                                all_algorithms(), kNow)) == "algorithm");
    }
  }
  SECTION("alg missing or not a string") {
    CHECK(failure_name(verify(key.sign(claims("ada", kNow), {{"alg", nullptr}}), keys, all_algorithms(),
                              kNow)) == "algorithm");
    CHECK(failure_name(verify(key.sign(claims("ada", kNow), {{"alg", 256}}), keys, all_algorithms(),
                              kNow)) == "algorithm");
  }
  SECTION("a header marked crit") {
    CHECK(failure_name(verify(key.sign(claims("ada", kNow), {{"crit", json::array({"exp"})}}), keys,
                              all_algorithms(), kNow)) == "malformed");
  }
}

TEST_CASE("jwt: a key verifies only its own algorithm") {
  // The token claims another algorithm than its key's, and is signed with the key: refused
  // whatever the claimed algorithm, with or without the kid.
  const TestKey* keys[] = {&rsa_key(), &ec_key(), &ed_key()};
  for (const TestKey* key : keys) {
    for (const char* claimed : {"RS256", "ES256", "EdDSA", "HS256"}) {
      if (key->alg() == claimed) continue;
      CAPTURE(key->alg(), claimed);
      const std::string token = key->sign(claims("ada", kNow), {{"alg", claimed}});
      CHECK(failure_name(verify(token, jwks_set(), all_algorithms(), kNow)) == "algorithm");
      const std::string no_kid = key->sign(claims("ada", kNow), {{"alg", claimed}, {"kid", nullptr}});
      CHECK(failure_of(verify(no_kid, jwks_set(), all_algorithms(), kNow)).has_value());
    }
  }
  // An HMAC secret never verifies RS256.
  const std::string rs_with_secret = hmac_key().sign(claims("ada", kNow), {{"alg", "RS256"}});
  CHECK(failure_name(verify(rs_with_secret, secret_set(), all_algorithms(), kNow)) == "algorithm");
}

TEST_CASE("jwt: an RSA public key used as an HMAC secret is refused (the classic confusion)") {
  // The attacker knows the public key and signs HS256 with its bytes, hoping the verifier hands
  // the RSA key's bytes to HMAC.
  for (const std::string& bytes : {rsa_key().public_pem(), rsa_key().public_der(),
                                   rsa_key().jwk().dump(), rsa_key().jwk()["n"].get<std::string>()}) {
    const TestKey forger = TestKey::hmac(bytes, rsa_key().kid());
    CHECK(failure_name(verify(forger.sign(claims("ada", kNow)), jwks_set(), all_algorithms(), kNow)) ==
          "algorithm");
    const TestKey no_kid = TestKey::hmac(bytes);
    CHECK(failure_name(verify(no_kid.sign(claims("ada", kNow)), jwks_set(), all_algorithms(), kNow)) ==
          "algorithm");
  }
  // Even a JWKS that publishes an "oct" key does not make it an HMAC secret: it is skipped.
  const TestKey published = TestKey::hmac(kSecret, "oct-1");
  const KeySet with_oct = KeySet::from_jwks(jwks({&rsa_key(), &published}));
  CHECK(with_oct.size() == 1);
  CHECK(with_oct.skipped() == 1);
  CHECK(failure_name(verify(published.sign(claims("ada", kNow)), with_oct, all_algorithms(), kNow)) ==
        "unknown_kid");
}

TEST_CASE("jwt: exp is required and honoured with 30 s of leeway each side") {
  const TestKey& key = ec_key();
  const Policy p = all_algorithms();
  auto at = [&](const json& c) { return failure_name(verify(key.sign(c), jwks_set(), p, kNow)); };
  CHECK(at({{"sub", "ada"}}) == "expired");
  CHECK(at({{"sub", "ada"}, {"exp", kNow - 29}}) == "ok");
  CHECK(at({{"sub", "ada"}, {"exp", kNow - 31}}) == "expired");
  CHECK(at({{"sub", "ada"}, {"exp", kNow - 30}}) == "expired");
  CHECK(at({{"sub", "ada"}, {"exp", kNow - 3600}}) == "expired");
  CHECK(at({{"sub", "ada"}, {"exp", static_cast<double>(kNow) + 0.5}}) == "ok");
  CHECK(at({{"sub", "ada"}, {"exp", std::to_string(kNow + 60)}}) == "malformed");
  CHECK(at({{"sub", "ada"}, {"exp", 1e300}}) == "ok");
  CHECK(at({{"sub", "ada"}, {"exp", -1e300}}) == "expired");
  CHECK(at({{"sub", "ada"}, {"exp", std::numeric_limits<uint64_t>::max()}}) == "ok");
}

TEST_CASE("jwt: an exp past the year 9999 is read as 9999-12-31 so expiry arithmetic cannot overflow") {
  const Policy p = all_algorithms();
  constexpr int64_t kLatest = 253'402'300'799;
  for (const json& exp : {json(std::numeric_limits<uint64_t>::max()), json(18000000601880000000ULL),
                          json(std::numeric_limits<int64_t>::max()), json(1e300)}) {
    const Verdict v = verify(hmac_key().sign({{"sub", "ada"}, {"exp", exp}}), secret_set(), p, kNow);
    REQUIRE(std::holds_alternative<Claims>(v));
    CHECK(std::get<Claims>(v).expires_at == kLatest);
  }
  const Verdict near = verify(hmac_key().sign({{"sub", "ada"}, {"exp", kNow + 60}}), secret_set(), p, kNow);
  REQUIRE(std::holds_alternative<Claims>(near));
  CHECK(std::get<Claims>(near).expires_at == kNow + 60);
}

TEST_CASE("jwt: a token not yet valid by nbf or iat is refused beyond the leeway") {
  const TestKey& key = ed_key();
  const Policy p = all_algorithms();
  auto at = [&](json extra) {
    json c = {{"sub", "ada"}, {"exp", kNow + 300}};
    c.update(extra);
    return failure_name(verify(key.sign(c), jwks_set(), p, kNow));
  };
  CHECK(at({{"nbf", kNow + 29}}) == "ok");
  CHECK(at({{"nbf", kNow + 31}}) == "not_yet_valid");
  CHECK(at({{"nbf", kNow - 100}}) == "ok");
  CHECK(at({{"iat", kNow + 29}}) == "ok");
  CHECK(at({{"iat", kNow + 31}}) == "not_yet_valid");
  CHECK(at({{"iat", kNow - 100}}) == "ok");
  CHECK(at({{"nbf", "soon"}}) == "malformed");
  CHECK(at({{"iat", json::array()}}) == "malformed");
}

TEST_CASE("jwt: iss and aud are checked when configured, aud a string or an array") {
  const TestKey& key = rsa_key();
  Policy p = all_algorithms();
  p.issuer = "https://issuer.example/";
  p.audience = "outlive";
  auto with = [&](json extra) {
    return failure_name(verify(key.sign(claims("ada", kNow, 300, extra)), jwks_set(), p, kNow));
  };
  CHECK(with({{"iss", "https://issuer.example/"}, {"aud", "outlive"}}) == "ok");
  CHECK(with({{"iss", "https://issuer.example/"}, {"aud", {"other", "outlive"}}}) == "ok");
  CHECK(with({{"iss", "https://issuer.example/"}, {"aud", {"other", "another"}}}) == "audience");
  CHECK(with({{"iss", "https://issuer.example/"}, {"aud", json::array()}}) == "audience");
  CHECK(with({{"iss", "https://issuer.example/"}, {"aud", "Outlive"}}) == "audience");
  CHECK(with({{"iss", "https://issuer.example/"}, {"aud", {{"outlive", true}}}}) == "audience");
  CHECK(with({{"iss", "https://issuer.example/"}}) == "audience");
  CHECK(with({{"iss", "https://evil.example/"}, {"aud", "outlive"}}) == "issuer");
  CHECK(with({{"iss", "https://issuer.example"}, {"aud", "outlive"}}) == "issuer");
  CHECK(with({{"aud", "outlive"}}) == "issuer");
  CHECK(with({{"iss", 7}, {"aud", "outlive"}}) == "issuer");
  // Not configured: not checked.
  CHECK(failure_name(verify(key.sign(claims("ada", kNow, 300, {{"iss", "x"}, {"aud", "y"}})), jwks_set(),
                            all_algorithms(), kNow)) == "ok");
}

TEST_CASE("jwt: sub is required") {
  const TestKey& key = hmac_key();
  auto verdict = [&](const json& c) { return failure_name(verify(key.sign(c), secret_set(), all_algorithms(), kNow)); };
  CHECK(verdict({{"exp", kNow + 60}}) == "no_subject");
  CHECK(verdict({{"exp", kNow + 60}, {"sub", ""}}) == "no_subject");
  CHECK(verdict({{"exp", kNow + 60}, {"sub", 42}}) == "no_subject");
  CHECK(verdict({{"exp", kNow + 60}, {"sub", "42"}}) == "ok");
}

TEST_CASE("jwt: a kid the set does not have is unknown_kid, and no kid tries every key of the algorithm") {
  const TestKey stranger = TestKey::rsa("rsa-2");
  CHECK(failure_name(verify(stranger.sign(claims("ada", kNow)), jwks_set(), all_algorithms(), kNow)) ==
        "unknown_kid");
  CHECK(failure_name(verify(stranger.sign(claims("ada", kNow), {{"kid", nullptr}}), jwks_set(),
                            all_algorithms(), kNow)) == "signature");
  CHECK(failure_name(verify(rsa_key().sign(claims("ada", kNow), {{"kid", nullptr}}), jwks_set(),
                            all_algorithms(), kNow)) == "ok");
  CHECK(failure_name(verify(rsa_key().sign(claims("ada", kNow), {{"kid", 7}}), jwks_set(),
                            all_algorithms(), kNow)) == "malformed");
  // HMAC secrets have no kid: a token's kid does not matter to them.
  CHECK(failure_name(verify(hmac_key().sign(claims("ada", kNow), {{"kid", "v2"}}), secret_set(),
                            all_algorithms(), kNow)) == "ok");
  CHECK(jwks_set().has_kid("ec-1"));
  CHECK_FALSE(jwks_set().has_kid("ec-2"));
  CHECK_FALSE(jwks_set().has_kid(""));
}

TEST_CASE("jwt: the previous HMAC secret verifies during a rotation, and no other") {
  const TestKey previous = TestKey::hmac(kPreviousSecret);
  CHECK(failure_name(verify(previous.sign(claims("ada", kNow)), secret_set(), all_algorithms(), kNow)) == "ok");
  const KeySet current_only = KeySet::from_secrets(kSecret, "");
  CHECK(current_only.size() == 1);
  CHECK(failure_name(verify(previous.sign(claims("ada", kNow)), current_only, all_algorithms(), kNow)) ==
        "signature");
  CHECK_THROWS_AS(KeySet::from_secrets("short", ""), outlive::Error);
  CHECK_THROWS_AS(KeySet::from_secrets(kSecret, "short"), outlive::Error);
}

TEST_CASE("jwt: malformed tokens are refused as malformed, never thrown") {
  const Policy p = all_algorithms();
  const std::string good = ec_key().sign(claims("ada", kNow));
  auto verdict = [&](const std::string& t) { return failure_name(verify(t, jwks_set(), p, kNow)); };
  REQUIRE(verdict(good) == "ok");
  const size_t a = good.find('.'), b = good.rfind('.');
  CHECK(verdict("") == "malformed");
  CHECK(verdict("abc") == "malformed");
  CHECK(verdict(good.substr(0, b)) == "malformed");                  // two parts
  CHECK(verdict(good + ".") == "malformed");                         // four parts
  CHECK(verdict(good + ".abc") == "malformed");
  CHECK(verdict("..") == "malformed");
  CHECK(verdict("!!!" + good.substr(a)) == "malformed");             // bad base64 in the header
  CHECK(verdict(good.substr(0, a) + ".pay+load" + good.substr(b)) == "malformed");
  CHECK(verdict(good.substr(0, b + 1) + "sig/nature") == "malformed");
  CHECK(verdict(good.substr(0, b + 1) + good.substr(b + 1) + "=") == "malformed");  // padding
  // A header that is JSON but no object, or no JSON.
  for (const std::string header : {"[]", "\"x\"", "42", "null", "{", "{\"alg\":\"ES256\"", ""}) {
    CAPTURE(header);
    CHECK(verdict(b64url(header) + good.substr(a)) == "malformed");
  }
  // Claims that are not an object, signed properly.
  for (const std::string payload : {"[1,2]", "\"ada\"", "not json"}) {
    CAPTURE(payload);
    const std::string input = b64url(json{{"alg", "ES256"}, {"kid", "ec-1"}}.dump()) + "." + b64url(payload);
    CHECK(verdict(input + "." + b64url(ec_key().signature(input))) == "malformed");
  }
  // Deeply nested JSON in the header.
  CHECK(verdict(b64url(std::string(10000, '[') + std::string(10000, ']')) + good.substr(a)) == "malformed");
  const std::string nested = R"({"alg":"ES256","x":)" + std::string(100, '[') + std::string(100, ']') + "}";
  CHECK(verdict(b64url(nested) + good.substr(a)) == "malformed");
  // A huge token: refused before decoding.
  const std::string big_claim(9000, 'x');
  CHECK(verdict(ec_key().sign(claims("ada", kNow, 300, {{"pad", big_claim}}))) == "malformed");
  CHECK(verdict(std::string(1 << 20, 'a') + "." + "b.c") == "malformed");
  // Binary garbage.
  CHECK(verdict(std::string("\0.\xff.\x80", 5)) == "malformed");
}

TEST_CASE("jwt: looks_like_jwt tells JWTs from other Bearer tokens") {
  CHECK(looks_like_jwt(rsa_key().sign(claims("ada", kNow))));
  CHECK(looks_like_jwt(unsigned_token(claims("ada", kNow))));
  CHECK(looks_like_jwt("a.b.c"));
  CHECK_FALSE(looks_like_jwt("a.b"));
  CHECK_FALSE(looks_like_jwt("a.b.c.d"));
  CHECK_FALSE(looks_like_jwt(".b.c"));
  CHECK_FALSE(looks_like_jwt("a..c"));
  CHECK_FALSE(looks_like_jwt("sk_live_4f2a9c"));
  CHECK_FALSE(looks_like_jwt("a.b.c="));
  CHECK_FALSE(looks_like_jwt("a b.c.d"));
  CHECK_FALSE(looks_like_jwt(""));
}

TEST_CASE("jwt: algorithm names are exact") {
  CHECK(algorithm_named("RS256") == Algorithm::RS256);
  CHECK(algorithm_named("EdDSA") == Algorithm::EdDSA);
  CHECK_FALSE(algorithm_named("none"));
  CHECK_FALSE(algorithm_named("rs256"));
  CHECK_FALSE(algorithm_named("HS512"));
  CHECK_FALSE(algorithm_named("RS256 "));
  for (const Failure f : all_failures()) CHECK(std::string(name_of(f)).find(' ') == std::string::npos);
}

TEST_CASE("jwt: a JWKS document skips the keys it cannot use and rejects a malformed document") {
  json doc = json::parse(jwks({&rsa_key(), &ec_key(), &ed_key()}));
  auto& list = doc["keys"];
  list.push_back({{"kty", "RSA"}, {"kid", "enc"}, {"use", "enc"}, {"n", list[0]["n"]}, {"e", "AQAB"}});
  list.push_back({{"kty", "EC"}, {"kid", "p384"}, {"crv", "P-384"}, {"x", "AAAA"}, {"y", "AAAA"}});
  list.push_back({{"kty", "OKP"}, {"kid", "ed448"}, {"crv", "Ed448"}, {"x", "AAAA"}});
  list.push_back({{"kty", "OKP"}, {"kid", "x25519"}, {"crv", "X25519"}, {"x", list[2]["x"]}});
  list.push_back({{"kty", "RSA"}, {"kid", "rs512"}, {"alg", "RS512"}, {"n", list[0]["n"]}, {"e", "AQAB"}});
  list.push_back({{"kty", "RSA"}, {"kid", "bad-n"}, {"n", "!!"}, {"e", "AQAB"}});
  list.push_back({{"kty", "EC"}, {"kid", "off-curve"}, {"crv", "P-256"}, {"x", b64url(std::string(32, '\1'))},
                  {"y", b64url(std::string(32, '\2'))}});
  list.push_back({{"kty", "EC"}, {"kid", "short-x"}, {"crv", "P-256"}, {"x", b64url(std::string(31, '\1'))},
                  {"y", list[1]["y"]}});
  list.push_back({{"kty", "RSA"}, {"kid", "verify-not-allowed"}, {"key_ops", {"encrypt"}}, {"n", list[0]["n"]},
                  {"e", "AQAB"}});
  list.push_back({{"kty", "unknown"}, {"kid", "?"}});
  list.push_back({{"kid", "no-kty"}});
  list.push_back({{"kty", 7}});
  const TestKey small = TestKey::rsa("rsa-1024", 1024);
  list.push_back(small.jwk());
  const KeySet set = KeySet::from_jwks(doc.dump());
  CHECK(set.size() == 3);
  CHECK(set.skipped() == 13);
  CHECK(set.has_kid("rsa-1"));
  CHECK_FALSE(set.has_kid("rs512"));
  CHECK_FALSE(set.has_kid("off-curve"));
  CHECK(failure_name(verify(small.sign(claims("ada", kNow)), set, all_algorithms(), kNow)) == "unknown_kid");
  CHECK(failure_name(verify(ec_key().sign(claims("ada", kNow)), set, all_algorithms(), kNow)) == "ok");
  // A JWK with "alg" accepted when it agrees, and without "use".
  json minimal = ed_key().jwk();
  minimal.erase("use");
  minimal.erase("alg");
  CHECK(KeySet::from_jwks(json{{"keys", {minimal}}}.dump()).size() == 1);

  for (const std::string& bad : std::vector<std::string>{
           "", "not json", "[]", "{}", R"({"keys":{}})", R"({"keys":"x"})", R"({"keys":[]})", R"({"keys":[1]})",
        R"({"keys":[{"kty":"oct","k":"AAAA"}]})", std::string(2'000'000, ' ') + "{}",
        R"({"keys":[)" + std::string(100, '[') + std::string(100, ']') + "]}"}) {
    CAPTURE(bad.substr(0, 60));
    CHECK_THROWS_AS(KeySet::from_jwks(bad), outlive::Error);
  }
}

TEST_CASE("jwt: the viewer of a token: id_prefix + sub, scopes from scope or scp, actor and subject from claims") {
  outlive::config::Jwt settings;
  auto viewer = [&](const json& payload) {
    Claims c;
    c.subject = payload["sub"];
    c.expires_at = kNow + 60;
    c.payload = payload;
    return viewer_of(c, settings);
  };
  auto plain = viewer({{"sub", "ada"}});
  CHECK(plain.id == "user:ada");
  CHECK(plain.actor == "user:ada");
  CHECK(plain.access_subject == "user:ada");
  CHECK_FALSE(plain.scopes.has_value());
  CHECK_FALSE(plain.app_session);

  auto scoped = viewer({{"sub", "ada"}, {"scope", "write  read"}});
  CHECK(scoped.id == "user:ada:read,write");
  CHECK(scoped.scopes == std::vector<std::string>{"write", "read"});
  CHECK(scoped.actor == "user:ada");
  CHECK(viewer({{"sub", "ada"}, {"scp", {"b", "a,c"}}}).id == "user:ada:a\\,c,b");
  CHECK(viewer({{"sub", "ada"}, {"scp", "x y"}}).id == "user:ada:x,y");
  CHECK(viewer({{"sub", "ada"}, {"scope", ""}}).id == "user:ada:");
  CHECK(viewer({{"sub", "ada"}, {"scope", "s"}, {"scp", {"t"}}}).id == "user:ada:s");  // scope wins

  settings.id_prefix = "auth0|";
  settings.actor_claim = "email";
  settings.access_subject_claim = "org_member";
  auto mapped = viewer({{"sub", "123"}, {"email", "ada@example.com"}, {"org_member", "member:9"}, {"scope", "r"}});
  CHECK(mapped.id == "auth0|123:r");
  CHECK(mapped.actor == "ada@example.com");
  CHECK(mapped.access_subject == "member:9");
  // A configured claim that is missing or not a string: the id without scopes.
  auto fallback = viewer({{"sub", "123"}, {"email", 5}, {"scope", "r"}});
  CHECK(fallback.actor == "auth0|123");
  CHECK(fallback.access_subject == "auth0|123");
}
