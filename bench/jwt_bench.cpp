// jwt_bench: the CPU cost of one JWT verification (SPEC 5.1 rev 4, issue 43) per algorithm, against
// its floor, the bare OpenSSL signature check of the same token with the same key (what any JWT
// library must pay), and against what the SQL credential path spends on the replica before its
// query: one SHA-256 of the token.
//
//   build/bench/jwt_bench [--iterations 2000] [--rounds 5]
//
// Single-threaded, in process, keys made by tests/support/jwt_signer. Each figure is the median
// of --rounds rounds of --iterations calls.
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "auth/auth.hpp"
#include "common/base64url.hpp"
#include "bench/common.hpp"
#include "bench/load.hpp"
#include "jwt/token.hpp"
#include "support/jwt_signer.hpp"

using namespace outlive;
using namespace outlive::bench;
using testing::TestKey;

namespace {

volatile int sink = 0;

// Median µs per call of `f` over `rounds` rounds of `iterations` calls.
double us_per_call(int iterations, int rounds, const std::function<int()>& f) {
  std::vector<double> per_call;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) sink = sink + f();
    per_call.push_back(seconds_since(t0) * 1e6 / iterations);
  }
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

// The floor: the signature of `token` checked with EVP alone, as verify() does it (a fresh
// EVP_MD_CTX per call), without parsing anything. ES256's signature is handed over as DER, made
// once outside the loop.
std::function<int()> floor_of(const TestKey& key, const std::string& token) {
  const size_t dot = token.rfind('.');
  const std::string input = token.substr(0, dot);
  const std::string raw = *base64url_decode(token.substr(dot + 1));
  auto* pkey = static_cast<EVP_PKEY*>(key.evp_pkey());
  if (key.kind() == TestKey::Kind::hmac) {
    const std::string secret = key.secret();
    return [=] {
      unsigned char mac[EVP_MAX_MD_SIZE];
      unsigned int len = 0;
      HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(input.data()), input.size(), mac, &len);
      return CRYPTO_memcmp(mac, raw.data(), 32) == 0 ? 1 : 0;
    };
  }
  std::string sig = raw;
  if (key.kind() == TestKey::Kind::ec) {
    ECDSA_SIG* s = ECDSA_SIG_new();
    ECDSA_SIG_set0(s, BN_bin2bn(reinterpret_cast<const unsigned char*>(raw.data()), 32, nullptr),
                   BN_bin2bn(reinterpret_cast<const unsigned char*>(raw.data()) + 32, 32, nullptr));
    unsigned char* der = nullptr;
    const int len = i2d_ECDSA_SIG(s, &der);
    sig.assign(reinterpret_cast<const char*>(der), static_cast<size_t>(len));
    OPENSSL_free(der);
    ECDSA_SIG_free(s);
  }
  const EVP_MD* md = key.kind() == TestKey::Kind::ed25519 ? nullptr : EVP_sha256();
  return [=] {
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    const int ok = EVP_DigestVerifyInit(ctx, nullptr, md, nullptr, pkey) == 1 &&
                   EVP_DigestVerify(ctx, reinterpret_cast<const unsigned char*>(sig.data()), sig.size(),
                                    reinterpret_cast<const unsigned char*>(input.data()), input.size()) == 1;
    EVP_MD_CTX_free(ctx);
    return ok ? 1 : 0;
  };
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 2000, rounds = 5;
  std::string command = "build/bench/jwt_bench";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--iterations") {
      iterations = std::max(1, std::stoi(argv[i + 1]));
    } else if (flag == "--rounds") {
      rounds = std::max(1, std::stoi(argv[i + 1]));
    } else {
      std::fprintf(stderr, "usage: jwt_bench [--iterations 2000] [--rounds 5]\n");
      return 2;
    }
  }
  LoadSampler load;
  const TestKey rsa = TestKey::rsa("rsa"), ec = TestKey::ec("ec"), ed = TestKey::ed25519("ed"),
                hmac = TestKey::hmac("a-secret-of-at-least-32-bytes-for-hs256!");
  const jwt::KeySet jwks = jwt::KeySet::from_jwks(testing::jwks({&rsa, &ec, &ed}));
  const jwt::KeySet secrets = jwt::KeySet::from_secrets(hmac.secret(), "");
  jwt::Policy policy;
  policy.algorithms = {jwt::Algorithm::RS256, jwt::Algorithm::ES256, jwt::Algorithm::EdDSA, jwt::Algorithm::HS256};
  policy.issuer = "https://issuer.example/";
  policy.audience = "outlive";
  const int64_t now = testing::unix_now();
  // A typical access token: iss, aud, sub, iat, exp, scope.
  const nlohmann::json claims = testing::claims(
      "auth0|5f7c8ec7c33c6c004bbafe82", now, 3600,
      {{"iss", policy.issuer}, {"aud", policy.audience}, {"scope", "read:inventory write:inventory"}});

  std::printf("### jwt_bench, %s\n\n- Machine: %s\n\n", now_utc().c_str(), machine_line().c_str());
  std::printf("| algorithm | token bytes | verify() µs | floor: EVP signature check µs | verify / floor | SHA-256 of the token µs |\n"
              "|---|---:|---:|---:|---:|---:|\n");
  for (const TestKey* key : {&rsa, &ec, &ed, &hmac}) {
    const std::string token = key->sign(claims);
    const jwt::KeySet& set = key->kind() == TestKey::Kind::hmac ? secrets : jwks;
    if (!std::holds_alternative<jwt::Claims>(jwt::verify(token, set, policy, now))) {
      std::fprintf(stderr, "jwt_bench: the %s token does not verify\n", key->alg().c_str());
      return 1;
    }
    const auto floor = floor_of(*key, token);
    if (floor() != 1) {
      std::fprintf(stderr, "jwt_bench: the %s floor does not verify\n", key->alg().c_str());
      return 1;
    }
    const double verify_us = us_per_call(iterations, rounds, [&] {
      return std::holds_alternative<jwt::Claims>(jwt::verify(token, set, policy, now)) ? 1 : 0;
    });
    const double floor_us = us_per_call(iterations, rounds, floor);
    const double sha_us = us_per_call(iterations, rounds, [&] { return static_cast<int>(auth::sha256_hex(token).size()); });
    std::printf("| %s | %zu | %.2f | %.2f | %.2fx | %.2f |\n", key->alg().c_str(), token.size(), verify_us, floor_us,
                verify_us / floor_us, sha_us);
    std::fflush(stdout);
  }
  const auto w = load.stop();
  std::printf("\n- Load average (1 min) start / end: %.2f / %.2f%s\n- Median of %d rounds of %d calls, one thread\n- Command: `%s`\n",
              w.start, w.end, w.quiet() ? "" : " (above 1.0: not a quiet machine)", rounds, iterations,
              command.c_str());
  return sink < 0 ? 1 : 0;
}
