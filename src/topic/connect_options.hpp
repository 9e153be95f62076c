#pragma once
// How a replica proves itself to NATS and checks NATS in return (SPEC 6, rev 3). A plain struct
// without nats.c so the configuration can carry it; topic::Client applies it.
#include <string>

namespace outlive::topic {

struct ConnectOptions {
  // At most one way to authenticate: user (+ password), token, nkey + seed file, or creds file.
  // Secrets come inline or, better, from a file (its content with trailing newlines dropped), so
  // they stay out of the configuration and out of `ps`.
  std::string user;
  std::string password;
  std::string password_file;
  std::string token;
  std::string token_file;
  std::string nkey;            // the public user nkey (U...) whose seed is in nkey_seed_file
  std::string nkey_seed_file;  // nats.c signs the server's nonce with it
  std::string creds_file;      // a decorated JWT and its nkey seed (nsc generate creds)

  // TLS: required when `tls` is set, a tls:// URL is given or any file below is named.
  bool tls = false;
  std::string tls_ca_file;    // the CA that signed the servers' certificates (else the system's)
  std::string tls_cert_file;  // a client certificate for servers that verify clients
  std::string tls_key_file;

  bool wants_tls() const {
    return tls || !tls_ca_file.empty() || !tls_cert_file.empty() || !tls_key_file.empty();
  }
};

}  // namespace outlive::topic
