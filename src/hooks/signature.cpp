#include "hooks/signature.hpp"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <fstream>
#include <iterator>

#include "common/error.hpp"

namespace outlive::hooks {

std::string signature(std::string_view secret, std::string_view body, int64_t unix_seconds) {
  const std::string t = std::to_string(unix_seconds);
  const std::string signed_text = t + "." + std::string(body);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(signed_text.data()), signed_text.size(), mac,
           &length) == nullptr) {
    throw Error(Errc::internal, "hooks: HMAC-SHA256 failed");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "t=" + t + ",v1=";
  for (unsigned int i = 0; i < length; ++i) {
    out += kHex[mac[i] >> 4];
    out += kHex[mac[i] & 0xf];
  }
  return out;
}

std::string read_secret(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(Errc::invalid_input, "hook_secret_file " + path + ": cannot read the file");
  std::string secret((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!secret.empty() && secret.back() == '\n') secret.pop_back();
  if (!secret.empty() && secret.back() == '\r') secret.pop_back();
  if (secret.empty()) throw Error(Errc::invalid_input, "hook_secret_file " + path + ": empty");
  return secret;
}

}  // namespace outlive::hooks
