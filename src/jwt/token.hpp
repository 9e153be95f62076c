#pragma once
// JWT verification (SPEC 5.1 rev 4), pure: a compact JWS checked against a key set with OpenSSL's
// EVP (RS256, ES256, EdDSA/Ed25519, HS256; `none` never), then its time and audience claims. No
// I/O, no clock of its own: the caller passes `now`. Thread-safe (a KeySet is immutable once built).
#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace outlive::jwt {

enum class Algorithm { RS256, ES256, EdDSA, HS256 };

// "RS256" -> Algorithm::RS256, ...; nullopt for anything else ("none", "HS512", "rs256").
std::optional<Algorithm> algorithm_named(std::string_view name);
const char* name_of(Algorithm a);

// One verification key: a public key from a JWKS (RSA, EC P-256, OKP Ed25519) or an HMAC secret.
// The algorithm it may verify is fixed by its type (an RSA key never verifies HS256: the classic
// confusion), and by its `alg` when the JWK names one.
struct Key {
  std::string kid;  // may be empty
  Algorithm algorithm;
  std::shared_ptr<void> public_key;  // EVP_PKEY*, freed with EVP_PKEY_free; null for HMAC
  std::string secret;                // HMAC only
};

// The keys a token may be checked against. Immutable once built; shared between threads.
class KeySet {
 public:
  KeySet() = default;
  // A JWKS document ({"keys":[...]}). Keys of an unsupported type, curve or `use` other than "sig"
  // are skipped (counted in skipped()), and so are symmetric ("oct") keys (a published key is
  // public, so it must never verify HS256), RSA keys under 2048 bits and keys whose members do not
  // decode. A malformed document (not an object with a "keys" array of objects, over 1 MiB or 16
  // levels deep), or one with no usable key, throws outlive::Error(invalid_input) saying why.
  static KeySet from_jwks(std::string_view document);
  // HS256 secrets: the current one, then the previous one (a rotation), which may be empty. A
  // secret under 32 bytes throws outlive::Error(invalid_input) (RFC 7518 3.2). A
  // secret under 32 bytes throws outlive::Error(invalid_input) (RFC 7518 3.2).
  static KeySet from_secrets(std::string current, std::string previous);

  // The keys of `alg` that may verify a token of this header: those with the token's `kid` when
  // the set has it; else those without a kid (HMAC secrets, a JWK without `kid`) when the token
  // names a kid; else, for a token without kid, every key of the algorithm. Empty when none fits.
  std::vector<const Key*> candidates(Algorithm alg, const std::optional<std::string>& kid) const;
  bool has_kid(const std::string& kid) const;
  size_t size() const { return keys_.size(); }
  size_t skipped() const { return skipped_; }

 private:
  std::vector<Key> keys_;
  size_t skipped_ = 0;
};

// What the configuration asks of a token (config::Jwt, resolved).
struct Policy {
  std::set<Algorithm> algorithms;
  std::string issuer;    // empty: not checked
  std::string audience;  // empty: not checked
  std::chrono::seconds leeway{30};
};

// Why a token was refused. The names are the `result` label of outlive_jwt_verifications_total.
enum class Failure {
  malformed,        // not three base64url parts of JSON objects, or a claim of the wrong type
  algorithm,        // `alg` missing, `none`, not configured, or no key of the set is of it (an
                    // RSA key named by the kid of an HS256 token)
  unknown_kid,      // no key of the set has the token's `kid` (a JWKS refetch may find it)
  signature,        // no candidate key verifies the signature
  expired,          // `exp` (+ leeway) has passed, or `exp` is missing
  not_yet_valid,    // `nbf` or `iat` is in the future (beyond the leeway)
  issuer,           // `iss` differs from the configured issuer
  audience,         // `aud` does not name the configured audience
  no_subject,       // no `sub` string
  no_keys,          // Verifier only: the JWKS has not been fetched for 24 h, so nothing verifies
};
const char* name_of(Failure f);
// Every Failure, in declaration order (the metric's label values).
const std::vector<Failure>& all_failures();

struct Claims {
  std::string subject;  // `sub`
  int64_t expires_at;   // `exp`, unix seconds, at most 253402300799 (9999-12-31)
  std::optional<int64_t> issued_at;  // `iat`
  nlohmann::json payload;            // every claim, for the actor/scope mapping
};

using Verdict = std::variant<Claims, Failure>;

// A token in three base64url parts separated by dots (what SPEC 5.1 calls "a token in three
// base64url parts"): other Bearer tokens go to the SQL queries.
bool looks_like_jwt(std::string_view token);

// Checks `token` against `keys` and `policy` at `now` (unix seconds). Never throws for any input.
Verdict verify(std::string_view token, const KeySet& keys, const Policy& policy, int64_t now);

}  // namespace outlive::jwt
