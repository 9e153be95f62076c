#pragma once
// The URLs outlive calls out to (a JWKS, the application's hooks): http:// for a sidecar on the
// same host, or https:// (the system's CA store).
#include <string>

namespace outlive::http_client {

struct Url {
  bool tls = false;
  std::string host;    // without brackets for an IPv6 literal
  std::string port;    // "443" / "80" when the URL names none
  std::string target;  // path and query, "/" at least

  // "host" or "host:port" for the Host header (the port only when it is not the scheme's own).
  std::string host_header() const;
  // scheme://host:port, what connections are kept per.
  std::string origin() const;
};

// http:// or https:// URLs with a host, an optional port and path. Throws
// outlive::Error(invalid_input) starting with `setting` and the URL for anything else (user info,
// fragments, other schemes).
Url parse_url(const std::string& url, const std::string& setting);

}  // namespace outlive::http_client
