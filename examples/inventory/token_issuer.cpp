#include "token_issuer.hpp"

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string_view>

#include "common/base64url.hpp"

namespace inventory {

namespace {

using nlohmann::json;
using outlive::base64url_encode;  // (src/common: no padding, RFC 7515 2)

[[noreturn]] void openssl_failed(const char* what) {
  throw std::runtime_error(std::string("token issuer: OpenSSL failed: ") + what);
}

std::string random_bytes(int n) {
  std::string out(static_cast<size_t>(n), '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), n) != 1)
    openssl_failed("RAND_bytes");
  return out;
}

// A P-256 coordinate, left-padded to 32 bytes as a JWK wants it (RFC 7518 6.2.1.2).
std::string coordinate(EVP_PKEY* key, const char* name) {
  BIGNUM* bn = nullptr;
  if (EVP_PKEY_get_bn_param(key, name, &bn) != 1) openssl_failed(name);
  std::string out(32, '\0');
  const int n = BN_bn2binpad(bn, reinterpret_cast<unsigned char*>(out.data()), 32);
  BN_free(bn);
  if (n != 32) openssl_failed("BN_bn2binpad");
  return out;
}

// EVP signs ECDSA as a DER ECDSA-Sig-Value; a JWS carries r||s, 32 bytes each (RFC 7518 3.4).
std::string jws_signature(const std::string& der) {
  const auto* p = reinterpret_cast<const unsigned char*>(der.data());
  ECDSA_SIG* sig = d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(der.size()));
  if (sig == nullptr) openssl_failed("d2i_ECDSA_SIG");
  std::string out(64, '\0');
  auto* o = reinterpret_cast<unsigned char*>(out.data());
  const bool ok = BN_bn2binpad(ECDSA_SIG_get0_r(sig), o, 32) == 32 &&
                  BN_bn2binpad(ECDSA_SIG_get0_s(sig), o + 32, 32) == 32;
  ECDSA_SIG_free(sig);
  if (!ok) openssl_failed("BN_bn2binpad");
  return out;
}

}  // namespace

struct TokenIssuer::Key {
  EVP_PKEY* pkey = nullptr;
  ~Key() { EVP_PKEY_free(pkey); }
};

TokenIssuer::TokenIssuer(std::string issuer, std::string audience)
    : key_(std::make_unique<Key>()), issuer_(std::move(issuer)), audience_(std::move(audience)) {
  key_->pkey = EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256");
  if (key_->pkey == nullptr) openssl_failed("EC P-256 keygen");
  // A new kid per key: a replica that still holds the previous run's set refetches on seeing it.
  kid_ = "demo-" + base64url_encode(random_bytes(9));
  const json jwk = {{"kty", "EC"},
                    {"crv", "P-256"},
                    {"x", base64url_encode(coordinate(key_->pkey, OSSL_PKEY_PARAM_EC_PUB_X))},
                    {"y", base64url_encode(coordinate(key_->pkey, OSSL_PKEY_PARAM_EC_PUB_Y))},
                    {"kid", kid_},
                    {"alg", "ES256"},
                    {"use", "sig"}};
  jwks_ = json{{"keys", json::array({jwk})}}.dump();
}

TokenIssuer::~TokenIssuer() = default;

std::string TokenIssuer::issue(const std::string& sub, std::chrono::seconds lifetime) const {
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  const json header = {{"alg", "ES256"}, {"typ", "JWT"}, {"kid", kid_}};
  const json claims = {{"iss", issuer_},
                       {"aud", audience_},
                       {"sub", sub},
                       {"iat", now},
                       {"exp", now + lifetime.count()},
                       {"jti", base64url_encode(random_bytes(12))}};
  const std::string input = base64url_encode(header.dump()) + "." + base64url_encode(claims.dump());

  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  size_t len = 0;
  std::string der;
  const auto* in = reinterpret_cast<const unsigned char*>(input.data());
  bool ok = ctx != nullptr &&
            EVP_DigestSignInit(ctx, nullptr, EVP_sha256(), nullptr, key_->pkey) == 1 &&
            EVP_DigestSign(ctx, nullptr, &len, in, input.size()) == 1;
  if (ok) {
    der.resize(len);
    ok = EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(der.data()), &len, in,
                        input.size()) == 1;
    der.resize(len);
  }
  EVP_MD_CTX_free(ctx);
  if (!ok) openssl_failed("EVP_DigestSign");
  return input + "." + base64url_encode(jws_signature(der));
}

}  // namespace inventory
