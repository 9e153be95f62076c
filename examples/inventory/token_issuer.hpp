#pragma once
// The demo's tiny identity provider for `--auth jwt`: an ES256 (P-256) key made at start, its
// public JWKS document for the replicas (auth.jwt.jwks_url), and short-lived tokens for the
// signed-in user. A real application gets both from its identity provider; this one exists so the
// demo runs on one machine without one. The key lives in memory only: a restart makes a new key
// and a new `kid`, and the replicas fetch the new set when a token names the unknown `kid`.
#include <chrono>
#include <memory>
#include <string>

namespace inventory {

class TokenIssuer {
 public:
  // `issuer` and `audience` go into every token's `iss` and `aud` (the replicas check both).
  // Throws std::runtime_error when OpenSSL cannot make the key.
  TokenIssuer(std::string issuer, std::string audience);
  ~TokenIssuer();
  TokenIssuer(const TokenIssuer&) = delete;
  TokenIssuer& operator=(const TokenIssuer&) = delete;

  // {"keys":[{"kty":"EC","crv":"P-256","x","y","kid","alg":"ES256","use":"sig"}]}
  const std::string& jwks() const { return jwks_; }
  // A compact JWS: {"iss","aud","sub","iat","exp": iat + lifetime,"jti"} signed with the key.
  // Callable from any thread.
  std::string issue(const std::string& sub, std::chrono::seconds lifetime) const;

 private:
  struct Key;
  std::unique_ptr<Key> key_;
  std::string issuer_;
  std::string audience_;
  std::string kid_;
  std::string jwks_;
};

}  // namespace inventory
