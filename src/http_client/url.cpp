#include "http_client/url.hpp"

#include <algorithm>
#include <cctype>
#include <string_view>

#include "common/error.hpp"

namespace outlive::http_client {

std::string Url::host_header() const {
  const bool default_port = port == (tls ? "443" : "80");
  const std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return default_port ? h : h + ":" + port;
}

std::string Url::origin() const { return (tls ? "https://" : "http://") + host + ":" + port; }

Url parse_url(const std::string& url, const std::string& setting) {
  auto bad = [&](const std::string& why) -> Url {
    throw Error(Errc::invalid_input, setting + " " + url + ": " + why);
  };
  Url u;
  std::string_view rest = url;
  if (rest.rfind("https://", 0) == 0) {
    u.tls = true;
    rest.remove_prefix(8);
  } else if (rest.rfind("http://", 0) == 0) {
    rest.remove_prefix(7);
  } else {
    return bad("not an http:// or https:// URL");
  }
  if (rest.find('#') != std::string_view::npos) return bad("a URL with a fragment");
  const size_t slash = rest.find_first_of("/?");
  std::string_view authority = rest.substr(0, slash);
  u.target = slash == std::string_view::npos ? "/" : std::string(rest.substr(slash));
  if (u.target[0] == '?') u.target = "/" + u.target;
  if (authority.find('@') != std::string_view::npos) return bad("user info in the URL");
  if (!authority.empty() && authority[0] == '[') {
    const size_t end = authority.find(']');
    if (end == std::string_view::npos) return bad("an unclosed IPv6 literal");
    u.host = std::string(authority.substr(1, end - 1));
    authority.remove_prefix(end + 1);
    if (!authority.empty() && authority[0] != ':') return bad("bytes after the IPv6 literal");
    if (!authority.empty()) u.port = std::string(authority.substr(1));
  } else {
    const size_t colon = authority.find(':');
    u.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) u.port = std::string(authority.substr(colon + 1));
  }
  if (u.host.empty()) return bad("no host");
  for (const char c : u.target) {
    if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f) return bad("a space or control byte in the path");
  }
  if (u.port.empty()) {
    u.port = u.tls ? "443" : "80";
  } else if (u.port.size() > 5 || !std::all_of(u.port.begin(), u.port.end(), ::isdigit) ||
             std::stoi(u.port) == 0 || std::stoi(u.port) > 65535) {
    return bad("the port is not a number from 1 to 65535");
  }
  return u;
}

}  // namespace outlive::http_client
