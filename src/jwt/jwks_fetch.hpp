#pragma once
// One GET of a JWKS document over HTTP/1.1 (http_client::Link): https:// with the system CA store,
// SNI and hostname verification, or http:// for a sidecar on the same host. Blocking, with a
// deadline for the whole exchange (resolve, connect, TLS, request, response): run on the
// Verifier's thread.
#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "http_client/url.hpp"

namespace outlive::jwt {

using http_client::Url;

// http_client::parse_url for auth.jwt.jwks_url: throws outlive::Error(invalid_input) naming the
// URL for anything else than an http:// or https:// URL.
Url parse_url(const std::string& url);

struct Fetched {
  std::string body;
  std::optional<std::chrono::seconds> max_age;  // from Cache-Control, when it has one
};

// GETs `url`; a 200 with a body of at most 1 MiB is the answer. Throws outlive::Error saying why
// not: Errc::timeout when `timeout` passed first, else Errc::internal (connection, TLS, status).
// Redirects are not followed (the URL is configured: it should name the document).
Fetched fetch_jwks(const std::string& url, std::chrono::milliseconds timeout);

// The max-age directive of a Cache-Control header (RFC 9111 5.2), nullopt without a valid one.
// `no-cache` / `no-store` count as max-age=0 (the Verifier's lower clamp applies).
std::optional<std::chrono::seconds> max_age_of(std::string_view cache_control);

}  // namespace outlive::jwt
