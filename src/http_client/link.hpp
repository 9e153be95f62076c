#pragma once
// One kept-alive HTTP/1.1 connection to one origin (Boost.Beast; TLS through libssl with the
// system's CA store, SNI and host name verification). Blocking, with a deadline for the whole
// exchange: a Link belongs to one thread at a time (a JWKS refresh, a hook worker), never an io
// thread's. Every outgoing HTTP call of outlive goes through here.
#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <chrono>
#include <memory>
#include <string>

#include "http_client/url.hpp"

namespace outlive::http_client {

using Deadline = std::chrono::steady_clock::time_point;
using Request = boost::beast::http::request<boost::beast::http::string_body>;
using Response = boost::beast::http::response<boost::beast::http::string_body>;

class Link {
 public:
  // Not connected until the first exchange. `what` starts every error message ("jwks: GET <url>").
  Link(Url url, std::string what);
  ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  // Sends `request` (its Host and User-Agent set here; the target is the caller's) and reads the
  // answer of at most `body_limit` bytes. Connects first when not connected; a kept-alive
  // connection the server closed meanwhile (nothing of the answer read) is reconnected once.
  // Throws outlive::Error: Errc::timeout when `deadline` passed first, Errc::internal otherwise
  // (resolving, connecting, TLS, a body over the limit), the message naming what failed. After a
  // failure, or an answer that does not keep the connection alive, the next exchange reconnects.
  Response exchange(Request& request, Deadline deadline, size_t body_limit);

  bool connected() const;
  const Url& url() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outlive::http_client
