#pragma once
// What an identity provider does, for tests and benches of JWT verification (SPEC 5.1 rev 4): keys
// made by OpenSSL (RSA 2048, EC P-256, Ed25519, or an HMAC secret), compact JWS tokens signed with
// them for any header and claims, and the public JWKS document of a set of keys. Independent of
// src/jwt (its own base64url and signatures), so the verifier is checked against another writer.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace outlive::testing {

// base64url without padding.
std::string b64url(std::string_view bytes);

// Unix seconds now (the claims' clock).
int64_t unix_now();

class TestKey {
 public:
  enum class Kind { rsa, ec, ed25519, hmac };

  static TestKey rsa(std::string kid, int bits = 2048);  // RS256
  static TestKey ec(std::string kid);                    // ES256, P-256
  static TestKey ed25519(std::string kid);               // EdDSA
  static TestKey hmac(std::string secret, std::string kid = "");  // HS256

  Kind kind() const { return kind_; }
  const std::string& kid() const { return kid_; }
  // "RS256", "ES256", "EdDSA" or "HS256".
  std::string alg() const;
  // The public JWK: kty and its members, "kid" (when not empty), "alg" and "use": "sig". For an
  // HMAC key: {"kty":"oct","k":...}.
  nlohmann::json jwk() const;
  // A compact JWS of `payload`, signed with this key. The header is {"alg","typ":"JWT","kid"}
  // (kid when not empty) updated with `header_extra`; a null member there removes that member
  // (so {"kid": null} leaves kid out, {"alg": "HS256"} lies about the algorithm, and the
  // signature is still this key's).
  std::string sign(const nlohmann::json& payload, const nlohmann::json& header_extra = {}) const;
  // The JWS signature of `signing_input` ("<header>.<payload>"): raw bytes, ES256 as r||s.
  std::string signature(std::string_view signing_input) const;
  // The public key as SubjectPublicKeyInfo, DER and PEM (the classic confusion signs HS256 with these).
  std::string public_der() const;
  std::string public_pem() const;
  // EVP_PKEY* (null for HMAC): for benches that measure the bare EVP verify.
  void* evp_pkey() const { return pkey_.get(); }
  const std::string& secret() const { return secret_; }

 private:
  Kind kind_ = Kind::hmac;
  std::string kid_;
  std::shared_ptr<void> pkey_;  // EVP_PKEY*
  std::string secret_;
};

// {"keys":[jwk, ...]} of the given keys.
std::string jwks(const std::vector<const TestKey*>& keys);

// A token with {"alg":"none"} (updated with `header_extra`) and an empty signature.
std::string unsigned_token(const nlohmann::json& payload, const nlohmann::json& header_extra = {});

// Claims that pass every check: {"sub","iat": now,"exp": now + lifetime_s}, plus `extra`.
nlohmann::json claims(const std::string& sub, int64_t now, int64_t lifetime_s = 300,
                      const nlohmann::json& extra = nlohmann::json::object());

}  // namespace outlive::testing
