// JWT verification with OpenSSL 3's EVP (docs/SECURITY.md, "JWT verification"): Debian 12's libjwt
// (1.10) has neither EdDSA nor JWKS and cpp-jwt (1.4) no EdDSA, so the four algorithms are checked
// here with the same EVP calls those libraries wrap, and the JOSE rules around them are ours.
#include "jwt/token.hpp"

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/param_build.h>
#include <openssl/rsa.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/base64url.hpp"
#include "common/error.hpp"
#include "common/json_depth.hpp"

namespace outlive::jwt {

namespace {

using json = nlohmann::json;

// A compact JWS larger than this is refused before any decoding: real tokens are under 2 KiB, and
// what arrives here comes from anyone who can open a socket.
constexpr size_t kMaxTokenBytes = 8 * 1024;
// A JWKS document larger than this is refused (real ones are a few KiB).
constexpr size_t kMaxJwksBytes = 1024 * 1024;
// Objects and arrays nested deeper than this are refused before parsing: a token's header and
// claims are flat, and a JWKS key holds at most an array (x5c, key_ops).
constexpr size_t kMaxDepth = 16;
// RFC 7518 3.2: an HS256 key must be at least as long as the hash.
constexpr size_t kMinHmacSecretBytes = 32;
// RSA keys shorter than this are skipped (RFC 7518 3.3 requires 2048 bits).
constexpr int kMinRsaBits = 2048;

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;

std::shared_ptr<void> share(Pkey key) {
  return std::shared_ptr<void>(key.release(), [](void* p) { EVP_PKEY_free(static_cast<EVP_PKEY*>(p)); });
}

// A JSON object, or nullopt for anything else (invalid JSON, another type, too deep).
std::optional<json> parse_object(std::string_view text) {
  if (json_nesting_depth(text) > kMaxDepth) return std::nullopt;
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  return j;
}

// ---- keys from JWK members -------------------------------------------------------------------

// A base64url member of a JWK, decoded; nullopt when missing or invalid.
std::optional<std::string> b64_member(const json& jwk, const char* name) {
  const auto it = jwk.find(name);
  if (it == jwk.end() || !it->is_string()) return std::nullopt;
  return base64url_decode(it->get_ref<const std::string&>());
}

Pkey rsa_key(const std::string& n, const std::string& e) {
  Pkey key;
  BIGNUM* bn_n = BN_bin2bn(reinterpret_cast<const unsigned char*>(n.data()), static_cast<int>(n.size()), nullptr);
  BIGNUM* bn_e = BN_bin2bn(reinterpret_cast<const unsigned char*>(e.data()), static_cast<int>(e.size()), nullptr);
  OSSL_PARAM_BLD* bld = OSSL_PARAM_BLD_new();
  OSSL_PARAM* params = nullptr;
  EVP_PKEY_CTX* ctx = nullptr;
  if (bn_n != nullptr && bn_e != nullptr && bld != nullptr &&
      OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_N, bn_n) == 1 &&
      OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_E, bn_e) == 1 &&
      (params = OSSL_PARAM_BLD_to_param(bld)) != nullptr &&
      (ctx = EVP_PKEY_CTX_new_from_name(nullptr, "RSA", nullptr)) != nullptr &&
      EVP_PKEY_fromdata_init(ctx) == 1) {
    EVP_PKEY* raw = nullptr;
    if (EVP_PKEY_fromdata(ctx, &raw, EVP_PKEY_PUBLIC_KEY, params) == 1) key.reset(raw);
  }
  EVP_PKEY_CTX_free(ctx);
  OSSL_PARAM_free(params);
  OSSL_PARAM_BLD_free(bld);
  BN_free(bn_n);
  BN_free(bn_e);
  return key;
}

// P-256 from the affine coordinates (32 bytes each, as RFC 7518 6.2.1.2 requires); the point is
// checked to be on the curve.
Pkey ec_key(const std::string& x, const std::string& y) {
  if (x.size() != 32 || y.size() != 32) return nullptr;
  const std::string point = '\x04' + x + y;  // uncompressed SEC1 point
  Pkey key;
  OSSL_PARAM_BLD* bld = OSSL_PARAM_BLD_new();
  OSSL_PARAM* params = nullptr;
  EVP_PKEY_CTX* ctx = nullptr;
  if (bld != nullptr &&
      OSSL_PARAM_BLD_push_utf8_string(bld, OSSL_PKEY_PARAM_GROUP_NAME, "prime256v1", 0) == 1 &&
      OSSL_PARAM_BLD_push_octet_string(bld, OSSL_PKEY_PARAM_PUB_KEY, point.data(), point.size()) == 1 &&
      (params = OSSL_PARAM_BLD_to_param(bld)) != nullptr &&
      (ctx = EVP_PKEY_CTX_new_from_name(nullptr, "EC", nullptr)) != nullptr &&
      EVP_PKEY_fromdata_init(ctx) == 1) {
    EVP_PKEY* raw = nullptr;
    if (EVP_PKEY_fromdata(ctx, &raw, EVP_PKEY_PUBLIC_KEY, params) == 1) key.reset(raw);
  }
  EVP_PKEY_CTX_free(ctx);
  OSSL_PARAM_free(params);
  OSSL_PARAM_BLD_free(bld);
  if (key) {
    EVP_PKEY_CTX* check = EVP_PKEY_CTX_new_from_pkey(nullptr, key.get(), nullptr);
    const bool on_curve = check != nullptr && EVP_PKEY_public_check(check) == 1;
    EVP_PKEY_CTX_free(check);
    if (!on_curve) key.reset();
  }
  return key;
}

Pkey ed25519_key(const std::string& x) {
  if (x.size() != 32) return nullptr;
  return Pkey(EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr,
                                          reinterpret_cast<const unsigned char*>(x.data()), x.size()));
}

// One JWK as a key, or nullopt when it is of a kind this verifier skips (another key type, curve
// or algorithm, an encryption key, a short RSA key, an undecodable member). Symmetric ("oct")
// keys are skipped too: a key published in a JWKS is public, so it must never verify HS256.
std::optional<Key> key_of(const json& jwk) {
  if (!jwk.is_object()) return std::nullopt;
  auto string_member = [&](const char* name) -> std::optional<std::string> {
    const auto it = jwk.find(name);
    if (it == jwk.end()) return std::string();
    if (!it->is_string()) return std::nullopt;
    return it->get<std::string>();
  };
  const auto kty = string_member("kty");
  const auto use = string_member("use");
  const auto alg = string_member("alg");
  const auto kid = string_member("kid");
  if (!kty || !use || !alg || !kid) return std::nullopt;
  if (!use->empty() && *use != "sig") return std::nullopt;
  if (const auto ops = jwk.find("key_ops"); ops != jwk.end()) {
    if (!ops->is_array() || std::find(ops->begin(), ops->end(), json("verify")) == ops->end()) {
      return std::nullopt;
    }
  }
  Key key;
  key.kid = *kid;
  Pkey pkey;
  if (*kty == "RSA") {
    key.algorithm = Algorithm::RS256;
    const auto n = b64_member(jwk, "n");
    const auto e = b64_member(jwk, "e");
    if (!n || !e || n->empty() || e->empty()) return std::nullopt;
    pkey = rsa_key(*n, *e);
    if (pkey && EVP_PKEY_get_bits(pkey.get()) < kMinRsaBits) return std::nullopt;
  } else if (*kty == "EC") {
    key.algorithm = Algorithm::ES256;
    if (string_member("crv").value_or("") != "P-256") return std::nullopt;
    const auto x = b64_member(jwk, "x");
    const auto y = b64_member(jwk, "y");
    if (!x || !y) return std::nullopt;
    pkey = ec_key(*x, *y);
  } else if (*kty == "OKP") {
    key.algorithm = Algorithm::EdDSA;
    if (string_member("crv").value_or("") != "Ed25519") return std::nullopt;
    const auto x = b64_member(jwk, "x");
    if (!x) return std::nullopt;
    pkey = ed25519_key(*x);
  } else {
    return std::nullopt;
  }
  if (!pkey) return std::nullopt;
  // A JWK that names its algorithm verifies only that one (an RSA key marked RS512 is skipped).
  // RFC 9864 names Ed25519's JWS algorithm "Ed25519"; "EdDSA" is what issuers send today.
  const bool ed25519_alias = *alg == "Ed25519" && key.algorithm == Algorithm::EdDSA;
  if (!alg->empty() && !ed25519_alias && algorithm_named(*alg) != key.algorithm) return std::nullopt;
  key.public_key = share(std::move(pkey));
  return key;
}

// ---- signatures ------------------------------------------------------------------------------

bool digest_verify(EVP_PKEY* pkey, const EVP_MD* md, std::string_view data, const unsigned char* sig,
                   size_t sig_len) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (ctx == nullptr) return false;
  bool ok = EVP_DigestVerifyInit(ctx, nullptr, md, nullptr, pkey) == 1 &&
            EVP_DigestVerify(ctx, sig, sig_len, reinterpret_cast<const unsigned char*>(data.data()),
                             data.size()) == 1;
  EVP_MD_CTX_free(ctx);
  return ok;
}

// JWS carries ES256 as r||s (32 bytes each, RFC 7518 3.4); EVP wants a DER ECDSA-Sig-Value.
std::optional<std::string> ecdsa_der(const std::string& raw) {
  if (raw.size() != 64) return std::nullopt;
  const auto* p = reinterpret_cast<const unsigned char*>(raw.data());
  ECDSA_SIG* sig = ECDSA_SIG_new();
  BIGNUM* r = BN_bin2bn(p, 32, nullptr);
  BIGNUM* s = BN_bin2bn(p + 32, 32, nullptr);
  if (sig == nullptr || r == nullptr || s == nullptr || ECDSA_SIG_set0(sig, r, s) != 1) {
    ECDSA_SIG_free(sig);
    BN_free(r);
    BN_free(s);
    return std::nullopt;
  }
  std::optional<std::string> out;
  unsigned char* der = nullptr;
  const int len = i2d_ECDSA_SIG(sig, &der);
  if (len > 0) out.emplace(reinterpret_cast<const char*>(der), static_cast<size_t>(len));
  OPENSSL_free(der);
  ECDSA_SIG_free(sig);
  return out;
}

bool hmac_verify(const std::string& secret, std::string_view data, const std::string& signature) {
  if (signature.size() != 32 || secret.empty()) return false;
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac, &mac_len) == nullptr ||
      mac_len != 32) {
    return false;
  }
  return CRYPTO_memcmp(mac, signature.data(), 32) == 0;
}

bool signature_verifies(const Key& key, std::string_view signed_part, const std::string& signature) {
  auto* pkey = static_cast<EVP_PKEY*>(key.public_key.get());
  const auto* sig = reinterpret_cast<const unsigned char*>(signature.data());
  switch (key.algorithm) {
    case Algorithm::RS256:
      return pkey != nullptr && digest_verify(pkey, EVP_sha256(), signed_part, sig, signature.size());
    case Algorithm::ES256: {
      const auto der = ecdsa_der(signature);
      return pkey != nullptr && der &&
             digest_verify(pkey, EVP_sha256(), signed_part,
                           reinterpret_cast<const unsigned char*>(der->data()), der->size());
    }
    case Algorithm::EdDSA:
      // Ed25519 hashes internally: no digest of our own (EVP_DigestVerify with a null md).
      return pkey != nullptr && signature.size() == 64 &&
             digest_verify(pkey, nullptr, signed_part, sig, signature.size());
    case Algorithm::HS256:
      return pkey == nullptr && hmac_verify(key.secret, signed_part, signature);
  }
  return false;
}

// ---- claims ----------------------------------------------------------------------------------

// A NumericDate claim (RFC 7519 2): a JSON number, fractions dropped; nullopt when absent;
// `malformed` set when present but not a finite number.
std::optional<int64_t> numeric_date(const json& payload, const char* name, bool& malformed) {
  const auto it = payload.find(name);
  if (it == payload.end()) return std::nullopt;
  if (it->is_number_integer()) {
    if (it->is_number_unsigned()) {
      const auto u = it->get<uint64_t>();
      return u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                 ? std::numeric_limits<int64_t>::max()
                 : static_cast<int64_t>(u);
    }
    return it->get<int64_t>();
  }
  if (it->is_number_float()) {
    const double d = it->get<double>();
    if (!std::isfinite(d)) {
      malformed = true;
      return std::nullopt;
    }
    // Clamped well inside int64 so the leeway arithmetic below cannot overflow.
    constexpr double kLimit = 4e18;
    return static_cast<int64_t>(std::floor(std::clamp(d, -kLimit, kLimit)));
  }
  malformed = true;
  return std::nullopt;
}

bool audience_matches(const json& aud, const std::string& wanted) {
  if (aud.is_string()) return aud.get_ref<const std::string&>() == wanted;
  if (aud.is_array()) {
    return std::any_of(aud.begin(), aud.end(), [&](const json& a) {
      return a.is_string() && a.get_ref<const std::string&>() == wanted;
    });
  }
  return false;
}

constexpr int64_t kClampSeconds = 4'000'000'000'000'000'000;  // far beyond any date, no overflow

int64_t clamp_seconds(int64_t v) { return std::clamp(v, -kClampSeconds, kClampSeconds); }

constexpr int64_t kLatestDate = 253'402'300'799;  // 9999-12-31T23:59:59Z

Verdict verify_unchecked(std::string_view token, const KeySet& keys, const Policy& policy, int64_t now) {
  if (token.size() > kMaxTokenBytes) return Failure::malformed;
  const size_t first = token.find('.');
  if (first == std::string_view::npos) return Failure::malformed;
  const size_t second = token.find('.', first + 1);
  if (second == std::string_view::npos || token.find('.', second + 1) != std::string_view::npos) {
    return Failure::malformed;
  }
  const std::string_view header_b64 = token.substr(0, first);
  const std::string_view payload_b64 = token.substr(first + 1, second - first - 1);
  const std::string_view signature_b64 = token.substr(second + 1);
  const std::string_view signed_part = token.substr(0, second);

  const auto header_text = base64url_decode(header_b64);
  if (!header_text) return Failure::malformed;
  const auto header = parse_object(*header_text);
  if (!header) return Failure::malformed;
  // An extension the issuer marks critical is one we do not understand (RFC 7515 4.1.11).
  if (header->contains("crit")) return Failure::malformed;
  const auto alg_it = header->find("alg");
  if (alg_it == header->end() || !alg_it->is_string()) return Failure::algorithm;
  const auto alg = algorithm_named(alg_it->get_ref<const std::string&>());
  if (!alg || policy.algorithms.count(*alg) == 0) return Failure::algorithm;
  std::optional<std::string> kid;
  if (const auto it = header->find("kid"); it != header->end()) {
    if (!it->is_string()) return Failure::malformed;
    kid = it->get<std::string>();
  }
  const auto signature = base64url_decode(signature_b64);
  if (!signature) return Failure::malformed;
  const auto payload_text = base64url_decode(payload_b64);
  if (!payload_text) return Failure::malformed;

  const auto candidates = keys.candidates(*alg, kid);
  if (candidates.empty()) {
    // A kid the set does not have may be a rotation a refetch finds; a kid of a key of another
    // type (RS256 key, HS256 token) or no key of the algorithm at all is the token's fault.
    if (kid && !keys.has_kid(*kid)) return Failure::unknown_kid;
    return Failure::algorithm;
  }
  const bool verified = std::any_of(candidates.begin(), candidates.end(), [&](const Key* k) {
    return signature_verifies(*k, signed_part, *signature);
  });
  if (!verified) return Failure::signature;

  // The claims are parsed only once the signature holds: before it, they are anyone's bytes.
  auto payload = parse_object(*payload_text);
  if (!payload) return Failure::malformed;
  bool malformed = false;
  const auto exp = numeric_date(*payload, "exp", malformed);
  const auto nbf = numeric_date(*payload, "nbf", malformed);
  const auto iat = numeric_date(*payload, "iat", malformed);
  if (malformed) return Failure::malformed;
  const int64_t leeway = policy.leeway.count();
  if (!exp || now >= clamp_seconds(*exp) + leeway) return Failure::expired;
  if (nbf && clamp_seconds(*nbf) > now + leeway) return Failure::not_yet_valid;
  if (iat && clamp_seconds(*iat) > now + leeway) return Failure::not_yet_valid;
  if (!policy.issuer.empty()) {
    const auto it = payload->find("iss");
    if (it == payload->end() || !it->is_string() || it->get_ref<const std::string&>() != policy.issuer) {
      return Failure::issuer;
    }
  }
  if (!policy.audience.empty()) {
    const auto it = payload->find("aud");
    if (it == payload->end() || !audience_matches(*it, policy.audience)) return Failure::audience;
  }
  const auto sub = payload->find("sub");
  if (sub == payload->end() || !sub->is_string() || sub->get_ref<const std::string&>().empty()) {
    return Failure::no_subject;
  }
  Claims claims;
  claims.subject = sub->get<std::string>();
  // A date past 9999-12-31 means "never" to anyone issuing it; clamped so the socket's expiry
  // arithmetic (seconds from now, then a steady_clock deadline) stays far inside int64.
  claims.expires_at = std::min<int64_t>(*exp, kLatestDate);
  claims.issued_at = iat;
  claims.payload = std::move(*payload);
  return claims;
}

}  // namespace

std::optional<Algorithm> algorithm_named(std::string_view name) {
  if (name == "RS256") return Algorithm::RS256;
  if (name == "ES256") return Algorithm::ES256;
  if (name == "EdDSA") return Algorithm::EdDSA;
  if (name == "HS256") return Algorithm::HS256;
  return std::nullopt;
}

const char* name_of(Algorithm a) {
  switch (a) {
    case Algorithm::RS256: return "RS256";
    case Algorithm::ES256: return "ES256";
    case Algorithm::EdDSA: return "EdDSA";
    case Algorithm::HS256: return "HS256";
  }
  return "?";
}

const char* name_of(Failure f) {
  switch (f) {
    case Failure::malformed: return "malformed";
    case Failure::algorithm: return "algorithm";
    case Failure::unknown_kid: return "unknown_kid";
    case Failure::signature: return "signature";
    case Failure::expired: return "expired";
    case Failure::not_yet_valid: return "not_yet_valid";
    case Failure::issuer: return "issuer";
    case Failure::audience: return "audience";
    case Failure::no_subject: return "no_subject";
    case Failure::no_keys: return "no_keys";
  }
  return "?";
}

const std::vector<Failure>& all_failures() {
  static const std::vector<Failure> all = {
      Failure::malformed, Failure::algorithm,     Failure::unknown_kid,
      Failure::signature, Failure::expired,       Failure::not_yet_valid,
      Failure::issuer,    Failure::audience,      Failure::no_subject,
      Failure::no_keys};
  return all;
}

KeySet KeySet::from_jwks(std::string_view document) {
  if (document.size() > kMaxJwksBytes) {
    throw Error(Errc::invalid_input, "jwks: the document is larger than 1 MiB");
  }
  if (json_nesting_depth(document) > kMaxDepth) {
    throw Error(Errc::invalid_input, "jwks: the document nests deeper than 16 levels");
  }
  const json doc = json::parse(document, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) throw Error(Errc::invalid_input, "jwks: the document is not JSON");
  if (!doc.is_object()) throw Error(Errc::invalid_input, "jwks: the document is not a JSON object");
  const auto keys = doc.find("keys");
  if (keys == doc.end() || !keys->is_array()) {
    throw Error(Errc::invalid_input, "jwks: the document has no \"keys\" array");
  }
  KeySet set;
  for (const auto& jwk : *keys) {
    if (!jwk.is_object()) throw Error(Errc::invalid_input, "jwks: a key is not a JSON object");
    if (auto key = key_of(jwk)) {
      set.keys_.push_back(std::move(*key));
    } else {
      ++set.skipped_;
    }
  }
  if (set.keys_.empty()) {
    throw Error(Errc::invalid_input, "jwks: no usable key (RSA >= 2048 bits, EC P-256 or Ed25519 for "
                                     "signatures) among " + std::to_string(keys->size()));
  }
  return set;
}

KeySet KeySet::from_secrets(std::string current, std::string previous) {
  auto check = [](const std::string& secret, const char* which) {
    if (secret.size() < kMinHmacSecretBytes) {
      throw Error(Errc::invalid_input, std::string("jwt: the ") + which +
                                           " HMAC secret is shorter than 32 bytes (RFC 7518 3.2)");
    }
  };
  check(current, "current");
  KeySet set;
  set.keys_.push_back(Key{"", Algorithm::HS256, nullptr, std::move(current)});
  if (!previous.empty()) {
    check(previous, "previous");
    set.keys_.push_back(Key{"", Algorithm::HS256, nullptr, std::move(previous)});
  }
  return set;
}

std::vector<const Key*> KeySet::candidates(Algorithm alg, const std::optional<std::string>& kid) const {
  std::vector<const Key*> out;
  if (kid && has_kid(*kid)) {
    for (const auto& k : keys_) {
      if (k.kid == *kid && k.algorithm == alg) out.push_back(&k);
    }
    return out;
  }
  // No kid in the token: every key of the algorithm. A kid the set does not have: the keys that
  // have none (the HMAC secrets, or a JWK without `kid`), which RFC 7517 lets match any token.
  for (const auto& k : keys_) {
    if (k.algorithm == alg && (!kid || k.kid.empty())) out.push_back(&k);
  }
  return out;
}

bool KeySet::has_kid(const std::string& kid) const {
  return std::any_of(keys_.begin(), keys_.end(), [&](const Key& k) { return !kid.empty() && k.kid == kid; });
}

bool looks_like_jwt(std::string_view token) {
  size_t dots = 0;
  size_t part = 0;  // bytes in the current part
  for (const char c : token) {
    if (c == '.') {
      // The header and the payload are never empty; the signature is (for `alg: none`), and such
      // a token is still a JWT, refused as one rather than looked up as an API key.
      if (part == 0) return false;
      ++dots;
      part = 0;
    } else if (is_base64url_char(c)) {
      ++part;
    } else {
      return false;
    }
  }
  return dots == 2;
}

Verdict verify(std::string_view token, const KeySet& keys, const Policy& policy, int64_t now) {
  try {
    return verify_unchecked(token, keys, policy, now);
  } catch (...) {
    // Only an allocation can throw on this path: refused, never thrown into a caller's io thread.
    return Failure::malformed;
  }
}

}  // namespace outlive::jwt
