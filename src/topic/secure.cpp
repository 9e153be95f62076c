#include "topic/secure.hpp"

#include <fstream>
#include <sstream>

#include "common/error.hpp"
#include "topic/nats_error.hpp"

namespace outlive::topic {
namespace {

// A secret kept in a file (a mounted secret, a Docker secret) ends with a newline the server
// would take as part of it.
std::string read_secret(const std::string& path, const char* field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error(Errc::invalid_input,
                std::string("NATS ") + field + ": cannot read the file " + path);
  }
  std::ostringstream content;
  content << in.rdbuf();
  std::string text = content.str();
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (text.empty()) {
    throw Error(Errc::invalid_input,
                std::string("NATS ") + field + ": the file " + path + " is empty");
  }
  return text;
}

std::string inline_or_file(const std::string& value, const std::string& file, const char* field) {
  if (!value.empty() && !file.empty()) {
    throw Error(Errc::invalid_input,
                std::string("NATS ") + field + ": give it inline or in a file, not both");
  }
  return file.empty() ? value : read_secret(file, field);
}

}  // namespace

bool apply_connect_options(natsOptions* opts, const std::vector<std::string>& urls,
                           const ConnectOptions& o) {
  const int methods = (o.user.empty() ? 0 : 1) + (o.token.empty() && o.token_file.empty() ? 0 : 1) +
                      (o.nkey.empty() && o.nkey_seed_file.empty() ? 0 : 1) +
                      (o.creds_file.empty() ? 0 : 1);
  if (methods > 1) {
    throw Error(Errc::invalid_input,
                "NATS credentials: use one of user/password, token, nkey or creds file");
  }
  if (!o.user.empty()) {
    const std::string password = inline_or_file(o.password, o.password_file, "password");
    check(natsOptions_SetUserInfo(opts, o.user.c_str(), password.c_str()), "NATS user");
  } else if (!o.password.empty() || !o.password_file.empty()) {
    throw Error(Errc::invalid_input, "NATS password: needs a user");
  }
  if (!o.token.empty() || !o.token_file.empty()) {
    const std::string token = inline_or_file(o.token, o.token_file, "token");
    check(natsOptions_SetToken(opts, token.c_str()), "NATS token");
  }
  if (!o.nkey.empty() || !o.nkey_seed_file.empty()) {
    if (o.nkey.empty() || o.nkey_seed_file.empty()) {
      throw Error(Errc::invalid_input, "NATS nkey: needs both the public nkey and its seed file");
    }
    read_secret(o.nkey_seed_file, "nkey seed");  // nats.c reads it at each connect: fail now
    check(natsOptions_SetNKeyFromSeed(opts, o.nkey.c_str(), o.nkey_seed_file.c_str()), "NATS nkey");
  }
  if (!o.creds_file.empty()) {
    read_secret(o.creds_file, "creds");
    check(natsOptions_SetUserCredentialsFromFiles(opts, o.creds_file.c_str(), nullptr),
          "NATS creds file");
  }

  bool tls = o.wants_tls();
  for (const auto& url : urls) tls = tls || url.rfind("tls://", 0) == 0;
  if (!tls) return false;
  check(natsOptions_SetSecure(opts, true), "NATS TLS");
  if (!o.tls_ca_file.empty()) {
    read_secret(o.tls_ca_file, "TLS CA file");
    check(natsOptions_LoadCATrustedCertificates(opts, o.tls_ca_file.c_str()),
          "NATS TLS CA file " + o.tls_ca_file);
  }
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    throw Error(Errc::invalid_input, "NATS TLS: a client certificate needs its key and back");
  }
  if (!o.tls_cert_file.empty()) {
    read_secret(o.tls_cert_file, "TLS certificate file");
    read_secret(o.tls_key_file, "TLS key file");
    check(natsOptions_LoadCertificatesChain(opts, o.tls_cert_file.c_str(), o.tls_key_file.c_str()),
          "NATS TLS client certificate " + o.tls_cert_file);
  }
  return true;
}

std::optional<std::string> lasting_refusal(natsStatus status) {
  switch (status) {
    case NATS_CONNECTION_AUTH_FAILED:
    case NATS_NOT_PERMITTED:
      return "NATS authorization failed: the server refused the credentials "
             "(nats_options: user/password, token, nkey or creds file)";
    case NATS_SECURE_CONNECTION_REQUIRED:
      return "NATS TLS required: the server only accepts TLS (a tls:// URL or nats_options.tls)";
    case NATS_SECURE_CONNECTION_WANTED:
      return "NATS TLS wanted: TLS is configured but the server does not offer it";
    case NATS_SSL_ERROR:
      return "NATS TLS handshake failed (the CA, the server's name or address, or a client "
             "certificate the server requires)";
    default:
      return std::nullopt;
  }
}

std::string retried_failure_hint(natsStatus status, bool tls) {
  if (!tls) return "";
  if (status != NATS_IO_ERROR && status != NATS_PROTOCOL_ERROR &&
      status != NATS_CONNECTION_CLOSED) {
    return "";
  }
  return " (NATS TLS: the server closed the connection after the handshake; a server with "
         "`verify: true` does that when it refuses the client certificate: check "
         "nats_options.tls cert_file and key_file)";
}

}  // namespace outlive::topic
