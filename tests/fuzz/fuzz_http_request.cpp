// The HTTP request path before the upgrade (SPEC 5.7 rev 3: any byte in the request target or
// headers is answered, never a crash): Beast's parser with the replica's limits, then everything
// the replica derives from the request — its route and app, the JSON error bodies that quote the
// app, the client address behind trusted proxies and the key per-address limits count under, the
// credential from the Cookie and Authorization headers. Nothing may throw or abort.
#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <variant>

#include "admission/proxies.hpp"
#include "auth/auth.hpp"
#include "http/routes.hpp"
#include "sse/framing.hpp"

namespace beast_http = boost::beast::http;
using namespace outlive;

namespace {
void require(bool condition) {
  if (!condition) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  beast_http::request_parser<beast_http::string_body> parser;
  parser.header_limit(16 * 1024);
  parser.body_limit(64 * 1024);
  parser.eager(true);
  boost::beast::error_code ec;
  parser.put(boost::asio::buffer(data, size), ec);
  if (ec || !parser.is_header_done()) return 0;
  const auto& req = parser.get();
  const std::string_view target(req.target().data(), req.target().size());
  const bool upgrade = req[beast_http::field::upgrade] == "websocket";
  const bool post = req.method() == beast_http::verb::post;
  const auto routed =
      http::routes::route(target, req.method() == beast_http::verb::get, upgrade, post);
  // Every body that quotes the app is JSON that parses again, whatever bytes the app has.
  const std::string body = http::routes::error_body("unknown_app", "no app \"" + routed.app + "\"");
  require(!nlohmann::json::parse(body, nullptr, false).is_discarded());
  if (routed.route == http::routes::Route::upgrade) require(!routed.app.empty());
  // SPEC 5.9: a stream's subs, from the query or the body: a 400 or sub messages of the bound.
  if (routed.route == http::routes::Route::sse) {
    require(!routed.app.empty());
    std::optional<sse::Subs> subs;
    if (post) {
      auto body = sse::parse_body(req.body());
      if (auto* ok = std::get_if<sse::Body>(&body)) subs = std::move(ok->subs);
    } else {
      auto parsed = sse::parse_subs(sse::query_value(target, "subs"));
      if (auto* ok = std::get_if<sse::Subs>(&parsed)) subs = std::move(*ok);
    }
    if (subs) {
      for (const auto& m : *subs) require(!nlohmann::json::parse(m, nullptr, false).is_discarded());
    }
  }

  static const admission::TrustedProxies proxies({"127.0.0.0/8", "::1", "10.0.0.0/8"});
  const std::string address = proxies.client_address("127.0.0.1", http::routes::forwarded_for(req));
  const std::string key = admission::limit_key(address, 64);
  require(!key.empty() || address.empty());
  (void)admission::limit_key(address, 1 + static_cast<int>(size % 128));
  (void)auth::credential_from(std::string(req[beast_http::field::cookie]),
                              std::string(req[beast_http::field::authorization]), "session");
  return 0;
}
