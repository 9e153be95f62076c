#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include "jwt/jwks_fetch.hpp"

#include <algorithm>
#include <boost/beast/http.hpp>
#include <cctype>

#include "common/error.hpp"
#include "http_client/link.hpp"

namespace outlive::jwt {

namespace {

namespace http = boost::beast::http;

constexpr size_t kMaxBody = 1024 * 1024;

}  // namespace

Url parse_url(const std::string& url) { return http_client::parse_url(url, "jwks_url"); }

std::optional<std::chrono::seconds> max_age_of(std::string_view value) {
  std::optional<std::chrono::seconds> out;
  while (!value.empty()) {
    const size_t comma = value.find(',');
    std::string_view directive = value.substr(0, comma);
    value = comma == std::string_view::npos ? std::string_view() : value.substr(comma + 1);
    while (!directive.empty() && (directive.front() == ' ' || directive.front() == '\t')) directive.remove_prefix(1);
    while (!directive.empty() && (directive.back() == ' ' || directive.back() == '\t')) directive.remove_suffix(1);
    std::string lower(directive);
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    if (lower == "no-cache" || lower == "no-store") return std::chrono::seconds(0);
    if (lower.rfind("max-age=", 0) != 0) continue;
    std::string_view digits = std::string_view(lower).substr(8);
    if (digits.size() >= 2 && digits.front() == '"' && digits.back() == '"') {
      digits = digits.substr(1, digits.size() - 2);
    }
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
    // Anything over a day is clamped by the caller anyway; stop before it overflows.
    int64_t seconds = 0;
    for (const char d : digits) {
      seconds = std::min<int64_t>(seconds * 10 + (d - '0'), 1'000'000'000);
    }
    out = std::chrono::seconds(seconds);
  }
  return out;
}

Fetched fetch_jwks(const std::string& url, std::chrono::milliseconds timeout) {
  http_client::Link link(parse_url(url), "jwks: GET " + url);
  http_client::Request request{http::verb::get, link.url().target, 11};
  request.set(http::field::accept, "application/json");
  request.set(http::field::connection, "close");
  const auto response =
      link.exchange(request, std::chrono::steady_clock::now() + timeout, kMaxBody);
  if (response.result() != http::status::ok) {
    throw Error(Errc::internal, "jwks: GET " + url + ": status " +
                                    std::to_string(response.result_int()) + " (200 expected)");
  }
  Fetched out;
  out.body = response.body();
  if (const auto it = response.find(http::field::cache_control); it != response.end()) {
    out.max_age = max_age_of(it->value());
  }
  return out;
}

}  // namespace outlive::jwt
