#include "support/jwt_signer.hpp"

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <chrono>
#include <stdexcept>

namespace outlive::testing {

namespace {

[[noreturn]] void openssl_failed(const char* what) {
  throw std::runtime_error(std::string("jwt_signer: OpenSSL failed: ") + what);
}

std::shared_ptr<void> own(EVP_PKEY* key, const char* what) {
  if (key == nullptr) openssl_failed(what);
  return std::shared_ptr<void>(key, [](void* p) { EVP_PKEY_free(static_cast<EVP_PKEY*>(p)); });
}

std::string bn_param(EVP_PKEY* key, const char* name, int pad_to = 0) {
  BIGNUM* bn = nullptr;
  if (EVP_PKEY_get_bn_param(key, name, &bn) != 1) openssl_failed(name);
  std::string out(static_cast<size_t>(pad_to > 0 ? pad_to : BN_num_bytes(bn)), '\0');
  const int n = pad_to > 0 ? BN_bn2binpad(bn, reinterpret_cast<unsigned char*>(out.data()), pad_to)
                           : BN_bn2bin(bn, reinterpret_cast<unsigned char*>(out.data()));
  BN_free(bn);
  if (n < 0) openssl_failed("BN_bn2bin");
  return out;
}

std::string digest_sign(EVP_PKEY* key, const EVP_MD* md, std::string_view data) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  size_t len = 0;
  std::string sig;
  const auto* in = reinterpret_cast<const unsigned char*>(data.data());
  if (ctx == nullptr || EVP_DigestSignInit(ctx, nullptr, md, nullptr, key) != 1 ||
      EVP_DigestSign(ctx, nullptr, &len, in, data.size()) != 1) {
    EVP_MD_CTX_free(ctx);
    openssl_failed("EVP_DigestSign");
  }
  sig.resize(len);
  if (EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(sig.data()), &len, in, data.size()) != 1) {
    EVP_MD_CTX_free(ctx);
    openssl_failed("EVP_DigestSign");
  }
  EVP_MD_CTX_free(ctx);
  sig.resize(len);
  return sig;
}

// DER ECDSA-Sig-Value -> the JWS form r||s, 32 bytes each.
std::string raw_ecdsa(const std::string& der) {
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

nlohmann::json merged(nlohmann::json base, const nlohmann::json& extra) {
  if (extra.is_object()) {
    for (const auto& [k, v] : extra.items()) {
      if (v.is_null()) {
        base.erase(k);
      } else {
        base[k] = v;
      }
    }
  }
  return base;
}

}  // namespace

std::string b64url(std::string_view bytes) {
  static constexpr char alphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = (uint32_t(uint8_t(bytes[i])) << 16) | (uint32_t(uint8_t(bytes[i + 1])) << 8) |
                       uint8_t(bytes[i + 2]);
    out += alphabet[(v >> 18) & 63];
    out += alphabet[(v >> 12) & 63];
    out += alphabet[(v >> 6) & 63];
    out += alphabet[v & 63];
  }
  if (bytes.size() - i == 1) {
    const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    out += alphabet[(v >> 18) & 63];
    out += alphabet[(v >> 12) & 63];
  } else if (bytes.size() - i == 2) {
    const uint32_t v = (uint32_t(uint8_t(bytes[i])) << 16) | (uint32_t(uint8_t(bytes[i + 1])) << 8);
    out += alphabet[(v >> 18) & 63];
    out += alphabet[(v >> 12) & 63];
    out += alphabet[(v >> 6) & 63];
  }
  return out;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

TestKey TestKey::rsa(std::string kid, int bits) {
  TestKey k;
  k.kind_ = Kind::rsa;
  k.kid_ = std::move(kid);
  k.pkey_ = own(EVP_PKEY_Q_keygen(nullptr, nullptr, "RSA", static_cast<size_t>(bits)), "RSA keygen");
  return k;
}

TestKey TestKey::ec(std::string kid) {
  TestKey k;
  k.kind_ = Kind::ec;
  k.kid_ = std::move(kid);
  k.pkey_ = own(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"), "EC keygen");
  return k;
}

TestKey TestKey::ed25519(std::string kid) {
  TestKey k;
  k.kind_ = Kind::ed25519;
  k.kid_ = std::move(kid);
  k.pkey_ = own(EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519"), "Ed25519 keygen");
  return k;
}

TestKey TestKey::hmac(std::string secret, std::string kid) {
  TestKey k;
  k.kind_ = Kind::hmac;
  k.kid_ = std::move(kid);
  k.secret_ = std::move(secret);
  return k;
}

std::string TestKey::alg() const {
  switch (kind_) {
    case Kind::rsa: return "RS256";
    case Kind::ec: return "ES256";
    case Kind::ed25519: return "EdDSA";
    case Kind::hmac: return "HS256";
  }
  return "";
}

nlohmann::json TestKey::jwk() const {
  auto* key = static_cast<EVP_PKEY*>(pkey_.get());
  nlohmann::json j;
  switch (kind_) {
    case Kind::rsa:
      j = {{"kty", "RSA"}, {"n", b64url(bn_param(key, OSSL_PKEY_PARAM_RSA_N))},
           {"e", b64url(bn_param(key, OSSL_PKEY_PARAM_RSA_E))}};
      break;
    case Kind::ec:
      j = {{"kty", "EC"}, {"crv", "P-256"}, {"x", b64url(bn_param(key, OSSL_PKEY_PARAM_EC_PUB_X, 32))},
           {"y", b64url(bn_param(key, OSSL_PKEY_PARAM_EC_PUB_Y, 32))}};
      break;
    case Kind::ed25519: {
      unsigned char raw[32];
      size_t len = sizeof raw;
      if (EVP_PKEY_get_raw_public_key(key, raw, &len) != 1) openssl_failed("raw public key");
      j = {{"kty", "OKP"}, {"crv", "Ed25519"},
           {"x", b64url(std::string_view(reinterpret_cast<const char*>(raw), len))}};
      break;
    }
    case Kind::hmac:
      j = {{"kty", "oct"}, {"k", b64url(secret_)}};
      break;
  }
  j["alg"] = alg();
  j["use"] = "sig";
  if (!kid_.empty()) j["kid"] = kid_;
  return j;
}

std::string TestKey::signature(std::string_view input) const {
  auto* key = static_cast<EVP_PKEY*>(pkey_.get());
  switch (kind_) {
    case Kind::rsa: return digest_sign(key, EVP_sha256(), input);
    case Kind::ec: return raw_ecdsa(digest_sign(key, EVP_sha256(), input));
    case Kind::ed25519: return digest_sign(key, nullptr, input);
    case Kind::hmac: {
      unsigned char mac[EVP_MAX_MD_SIZE];
      unsigned int len = 0;
      if (HMAC(EVP_sha256(), secret_.data(), static_cast<int>(secret_.size()),
               reinterpret_cast<const unsigned char*>(input.data()), input.size(), mac, &len) == nullptr) {
        openssl_failed("HMAC");
      }
      return std::string(reinterpret_cast<const char*>(mac), len);
    }
  }
  return "";
}

std::string TestKey::sign(const nlohmann::json& payload, const nlohmann::json& header_extra) const {
  nlohmann::json header = {{"alg", alg()}, {"typ", "JWT"}};
  if (!kid_.empty()) header["kid"] = kid_;
  header = merged(std::move(header), header_extra);
  const std::string input = b64url(header.dump()) + "." + b64url(payload.dump());
  return input + "." + b64url(signature(input));
}

std::string TestKey::public_der() const {
  unsigned char* der = nullptr;
  const int len = i2d_PUBKEY(static_cast<EVP_PKEY*>(pkey_.get()), &der);
  if (len <= 0) openssl_failed("i2d_PUBKEY");
  std::string out(reinterpret_cast<const char*>(der), static_cast<size_t>(len));
  OPENSSL_free(der);
  return out;
}

std::string TestKey::public_pem() const {
  BIO* bio = BIO_new(BIO_s_mem());
  if (bio == nullptr || PEM_write_bio_PUBKEY(bio, static_cast<EVP_PKEY*>(pkey_.get())) != 1) {
    BIO_free(bio);
    openssl_failed("PEM_write_bio_PUBKEY");
  }
  char* data = nullptr;
  const long len = BIO_get_mem_data(bio, &data);
  std::string out(data, static_cast<size_t>(len));
  BIO_free(bio);
  return out;
}

std::string jwks(const std::vector<const TestKey*>& keys) {
  nlohmann::json list = nlohmann::json::array();
  for (const TestKey* k : keys) list.push_back(k->jwk());
  return nlohmann::json{{"keys", list}}.dump();
}

std::string unsigned_token(const nlohmann::json& payload, const nlohmann::json& header_extra) {
  const nlohmann::json header = merged({{"alg", "none"}, {"typ", "JWT"}}, header_extra);
  return b64url(header.dump()) + "." + b64url(payload.dump()) + ".";
}

nlohmann::json claims(const std::string& sub, int64_t now, int64_t lifetime_s, const nlohmann::json& extra) {
  nlohmann::json c = {{"sub", sub}, {"iat", now}, {"exp", now + lifetime_s}};
  return merged(std::move(c), extra);
}

}  // namespace outlive::testing
