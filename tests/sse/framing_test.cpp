// SSE framing and the subs of a stream's request (SPEC 5.9): pure functions.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "common/base64url.hpp"
#include "sse/framing.hpp"

using namespace outlive;
using namespace outlive::sse;
using nlohmann::json;

TEST_CASE("sse: a frame is one data event") {
  CHECK(event(R"({"type":"progress","cursor":"c"})") ==
        "data: {\"type\":\"progress\",\"cursor\":\"c\"}\n\n");
  std::string out;
  append_event(out, {"{\"type\":\"update\",", "\"key\":\"k\"}"});
  CHECK(out == "data: {\"type\":\"update\",\"key\":\"k\"}\n\n");
}

TEST_CASE("sse: a line break inside a frame cannot end the event") {
  CHECK(event("{\"a\":\n1}") == "data: {\"a\":\ndata: 1}\n\n");
  CHECK(event("x\r\n\r\ny") == "data: x\ndata: \ndata: y\n\n");
}

TEST_CASE("sse: close event carries the websocket close code") {
  const std::string e = close_event(1012, "replica stopping");
  REQUIRE(e.starts_with("event: close\ndata: "));
  REQUIRE(e.ends_with("\n\n"));
  const auto j = json::parse(e.substr(19, e.size() - 21));
  CHECK(j["code"] == 1012);
  CHECK(j["reason"] == "replica stopping");
  CHECK(kKeepAlive == ": ping\n\n");
}

TEST_CASE("sse: refusals before the stream are HTTP statuses") {
  CHECK(refusal_status(1008, "unauthorized") == 401);
  CHECK(refusal_status(1008, "forbidden_origin") == 403);
  CHECK(refusal_status(1008, "unknown_app") == 404);
  CHECK(refusal_status(4401, "token expired") == 401);
  CHECK(refusal_status(1013, "rate_limited") == 429);
  CHECK(refusal_status(1013, "too_many_sockets") == 429);
  CHECK(refusal_status(1012, "replica stopping") == 503);
  CHECK(refusal_status(1011, "access check failed") == 503);
}

TEST_CASE("sse: subs parameter") {
  const json subs = json::array({{{"type", "sub"}, {"id", "w1"}, {"channel", "warehouse"}}});
  const std::string encoded = base64url_encode(subs.dump());
  auto parsed = parse_subs(encoded);
  REQUIRE(std::holds_alternative<Subs>(parsed));
  REQUIRE(std::get<Subs>(parsed).size() == 1);
  CHECK(json::parse(std::get<Subs>(parsed)[0]) == subs[0]);
  // padding, percent-encoded or not, is tolerated
  const std::string two = base64url_encode("[]");  // "W10"
  CHECK(std::holds_alternative<Subs>(parse_subs(two + "=")));
  CHECK(std::holds_alternative<Subs>(parse_subs(two + "%3D")));

  CHECK(std::holds_alternative<SubsError>(parse_subs("")));
  CHECK(std::holds_alternative<SubsError>(parse_subs("not base64!")));
  CHECK(std::holds_alternative<SubsError>(parse_subs(base64url_encode("{nope"))));
  CHECK(std::holds_alternative<SubsError>(parse_subs(base64url_encode("{}"))));
  CHECK(std::holds_alternative<SubsError>(parse_subs(base64url_encode("[1]"))));
  CHECK(std::holds_alternative<SubsError>(parse_subs(base64url_encode(R"([{"type":"unsub"}])"))));
}

TEST_CASE("sse: subs of 16 KiB pass, larger are refused") {
  auto of_size = [](size_t size) {
    json m = {{"type", "sub"}, {"id", "w1"}, {"channel", "warehouse"}, {"pad", ""}};
    const size_t base = json::array({m}).dump().size();
    m["pad"] = std::string(size - base, 'x');
    const std::string text = json::array({m}).dump();
    REQUIRE(text.size() == size);
    return base64url_encode(text);
  };
  CHECK(std::holds_alternative<Subs>(parse_subs(of_size(kMaxSubsBytes))));
  CHECK(std::holds_alternative<SubsError>(parse_subs(of_size(kMaxSubsBytes + 1))));
  CHECK(std::holds_alternative<SubsError>(parse_subs(std::string(64 * 1024, 'A'))));
}

TEST_CASE("sse: POST body") {
  auto body = parse_body(R"({"subs":[{"type":"sub","id":"a","channel":"c"}],"token":"t"})");
  REQUIRE(std::holds_alternative<Body>(body));
  CHECK(std::get<Body>(body).token == "t");
  CHECK(std::get<Body>(body).subs.size() == 1);
  CHECK(std::holds_alternative<SubsError>(parse_body("[]")));
  CHECK(std::holds_alternative<SubsError>(parse_body(R"({"token":"t"})")));
  CHECK(std::holds_alternative<SubsError>(parse_body(R"({"subs":[],"token":1})")));
}

TEST_CASE("sse: query value") {
  CHECK(query_value("/api/a/live/sse?subs=abc", "subs") == "abc");
  CHECK(query_value("/api/a/live/sse?x=1&subs=abc&y=2", "subs") == "abc");
  CHECK(query_value("/api/a/live/sse?xsubs=1", "subs").empty());
  CHECK(query_value("/api/a/live/sse", "subs").empty());
}
