// What the application's session check answers (SPEC 5.1 rev 4, auth.hook), parsed without a
// replica, and the configuration auth.hook needs.
#include <catch2/catch.hpp>

#include "common/error.hpp"
#include "config/config.hpp"
#include "hooks/auth_hook.hpp"

using namespace outlive;
using nlohmann::json;

TEST_CASE("auth hook answers: viewers, refusals, and every malformed shape named") {
  const auto a = hooks::parse_credentials_answer(
      R"({"results":{"1":{"viewer":{"id":"user:ada","actor":"user:ada","accessSubject":"user:ada",
          "scopes":null},"expires_in_s":30},
          "2":{"refused":"signed out"},
          "3":{"viewer":{"id":"user:bob:read","actor":"user:bob","accessSubject":"user:bob",
          "scopes":["read"]}}}})",
      4);
  REQUIRE(a.size() == 4);
  CHECK(a[0].admitted());
  CHECK(a[0].viewer["id"] == "user:ada");
  CHECK(a[0].viewer["scopes"].is_null());
  CHECK(a[0].expires_in_s == 30);
  CHECK(!a[1].admitted());
  CHECK(a[1].failure.empty());
  CHECK(a[1].refused == "signed out");
  CHECK(a[2].viewer["scopes"] == json{"read"});
  CHECK(a[2].expires_in_s == 0);
  // A ref the answer lacks fails that credential only.
  CHECK(a[3].failure == "the answer has no result for ref 4");

  // 0 would ask again at once, forever.
  CHECK(hooks::parse_credentials_answer(
            R"({"results":{"1":{"viewer":{"id":"a","actor":"a","accessSubject":"a"},"expires_in_s":0}}})", 1)[0]
            .expires_in_s == 1);

  for (const auto& [body, why] : std::vector<std::pair<std::string, std::string>>{
           {"", "not JSON"}, {"<html>", "not JSON"}, {"[]", "not a JSON object"},
           {"{}", "no \"results\""}, {R"({"results":[]})", "no \"results\""}}) {
    INFO(body);
    try {
      hooks::parse_credentials_answer(body, 1);
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find(why) != std::string::npos);
    }
  }
  for (const auto& [result, why] : std::vector<std::pair<std::string, std::string>>{
           {"5", "not an object"},
           {"{}", "neither \"viewer\" nor \"refused\""},
           {R"({"refused":5})", "\"refused\" is not a string"},
           {R"({"viewer":{"actor":"a","accessSubject":"a"}})", "no \"id\""},
           {R"({"viewer":{"id":"","actor":"a","accessSubject":"a"}})", "no \"id\""},
           {R"({"viewer":{"id":"a","accessSubject":"a"}})", "no \"actor\""},
           {R"({"viewer":{"id":"a","actor":"a"}})", "no \"accessSubject\""},
           {R"({"viewer":{"id":"a","actor":"a","accessSubject":"a","scopes":"x"}})", "neither an array"},
           {R"({"viewer":{"id":"a","actor":"a","accessSubject":"a","scopes":[1]}})", "non-string"},
           {R"({"viewer":{"id":"a","actor":"a","accessSubject":"a"},"expires_in_s":-1})", "expires_in_s"},
           {R"({"viewer":{"id":"a","actor":"a","accessSubject":"a"},"expires_in_s":"5"})", "expires_in_s"}}) {
    INFO(result);
    const auto out = hooks::parse_credentials_answer(R"({"results":{"1":)" + result + "}}", 1);
    CHECK(!out[0].admitted());
    CHECK(out[0].failure.find("ref 1: ") == 0);
    CHECK(out[0].failure.find(why) != std::string::npos);
  }
}

namespace {
json minimal(json auth) {
  return {{"database", "postgresql://x"}, {"nats", {"nats://x"}}, {"auth", std::move(auth)},
          {"apps", {{"a", json::object()}}}};
}
std::string refusal(const json& doc) {
  try {
    config::parse(doc);
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}
}  // namespace

TEST_CASE("auth.hook: read with its defaults, needs hook_secret_file, replaces the SQL queries") {
  auto doc = minimal({{"hook", {{"url", "http://127.0.0.1:9/auth"}}}});
  CHECK(refusal(doc).find("/auth/hook: needs hook_secret_file") != std::string::npos);
  doc["hook_secret_file"] = "/secret";
  const auto c = config::parse(doc);
  REQUIRE(c.auth.hook);
  CHECK(c.auth.hook->url == "http://127.0.0.1:9/auth");
  CHECK(c.auth.hook->timeout == std::chrono::milliseconds(2000));
  CHECK(c.auth.hook->forward_headers == std::vector<std::string>{"cookie", "authorization"});
  doc["auth"]["hook"]["timeout_ms"] = 500;
  doc["auth"]["hook"]["forward_headers"] = {"Cookie", "X-Session"};
  const auto d = config::parse(doc);
  CHECK(d.auth.hook->timeout == std::chrono::milliseconds(500));
  CHECK(d.auth.hook->forward_headers == std::vector<std::string>{"cookie", "x-session"});
  for (const char* query : {"sessions", "api_keys", "oauth_tokens"}) {
    auto both = doc;
    both["auth"][query] = "SELECT 1";
    CHECK(refusal(both).find(std::string("/auth/hook: replaces auth.") + query) != std::string::npos);
  }
  auto ftp = doc;
  ftp["auth"]["hook"]["url"] = "ftp://x";
  CHECK(!refusal(ftp).empty());
}
