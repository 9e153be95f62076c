// What a hook answers (SPEC 5.4 rev 4), parsed without a replica, and the signature the replica
// puts on its requests, checked against the test hook server's own implementation.
#include <catch2/catch.hpp>

#include "common/error.hpp"
#include "hooks/channel_hook.hpp"
#include "hooks/signature.hpp"
#include "support/hook_server.hpp"

using namespace outlive;

TEST_CASE("hook answers: keys, not found, allowed, and every malformed shape named") {
  CHECK(hooks::parse_keys_answer(R"({"keys":["a","b"]})") == KeysResult{{"a", "b"}});
  CHECK(hooks::parse_keys_answer(R"({"keys":[]})") == KeysResult{std::vector<std::string>{}});
  CHECK(hooks::parse_keys_answer(R"({"keys":null})") == std::nullopt);
  CHECK(hooks::parse_authorize_answer(R"({"allowed":["user:ada"],"extra":1})") ==
        AllowedViewers{"user:ada"});
  const std::vector<std::pair<std::string, std::string>> bad_keys = {
      {"", "not JSON"},
      {"<html>", "not JSON"},
      {"[]", "not a JSON object"},
      {"{}", "no \"keys\""},
      {R"({"keys":"a"})", "neither an array nor null"},
      {R"({"keys":[1]})", "not a string"}};
  for (const auto& [body, why] : bad_keys) {
    CAPTURE(body);
    CHECK_THROWS_WITH(hooks::parse_keys_answer(body), Catch::Contains(why));
  }
  const std::vector<std::pair<std::string, std::string>> bad_allowed = {
      {R"({"allowed":5})", "not an array"},
      {R"({"allowed":null})", "not an array"},
      {R"({"allowed":["a",null]})", "not a string"},
      {R"({"keys":[]})", "no \"allowed\""}};
  for (const auto& [body, why] : bad_allowed) {
    CAPTURE(body);
    CHECK_THROWS_WITH(hooks::parse_authorize_answer(body), Catch::Contains(why));
  }
}

TEST_CASE("the hook signature: t and v1 as an application checks them") {
  const std::string body = R"({"op":"keys"})";
  const auto now = static_cast<int64_t>(std::time(nullptr));
  const std::string header = hooks::signature("secret", body, now);
  CHECK(header.rfind("t=" + std::to_string(now) + ",v1=", 0) == 0);
  CHECK(header.size() == 2 + std::to_string(now).size() + 4 + 64);
  CHECK(testing::HookServer::check_signature(header, body, "secret").empty());
  CHECK(!testing::HookServer::check_signature(header, body, "other").empty());
  CHECK(!testing::HookServer::check_signature(header, body + " ", "secret").empty());
  CHECK_THAT(testing::HookServer::check_signature(hooks::signature("secret", body, now - 301), body, "secret"),
             Catch::Contains("too old"));
  // A value computed apart from the code: printf '1.x' | openssl dgst -sha256 -hmac k
  CHECK(hooks::signature("k", "x", 1) ==
        "t=1,v1=976cb87e4f568d1c0f03f32859e90af8597cf00b978ba37c229c97d3a15b8449");
}
