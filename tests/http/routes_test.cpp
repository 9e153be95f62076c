// Routes of the HTTP side (src/http/routes): which request goes where, and the app it names.
// Hermetic.
#include <catch2/catch.hpp>
#include <string>

#include "http/routes.hpp"

using namespace outlive::http::routes;

TEST_CASE("the app routes take one path segment as the app, the same for /live and /live/cursor") {
  for (const auto& [target, app] :
       std::vector<std::pair<std::string, std::string>>{{"/api/inventory/live", "inventory"},
                                                        {"/api/inventory/live?x=1", "inventory"},
                                                        {"/api/a/live", "a"},
                                                        {"/api/\xff/live", "\xff"}}) {
    INFO(target);
    const auto up = route(target, true, true);
    CHECK(up.route == Route::upgrade);
    CHECK(up.app == app);
    const auto question = target.find('?');
    const std::string cursor =
        question == std::string::npos
            ? target + "/cursor"
            : target.substr(0, question) + "/cursor" + target.substr(question);
    const auto c = route(cursor, true, false);
    CHECK(c.route == Route::cursor);
    CHECK(c.app == app);
  }
  for (const std::string path : {"/api//live", "/api/a/b/live", "/api/live", "/apx/a/live",
                                 "/api/a/live/", "/api/a/lives", "api/a/live", "/"}) {
    INFO(path);
    CHECK(route(path, true, true).route == Route::not_found);
    CHECK(route(path + "/cursor", true, false).route == Route::not_found);
  }
}

TEST_CASE("only GET outside the upgrade, and the operations routes by exact path") {
  CHECK(route("/api/inventory/live", true, false).route == Route::not_found);
  CHECK(route("/api/inventory/live/cursor", false, false).route == Route::method_not_allowed);
  CHECK(route("/healthz", true, false).route == Route::healthz);
  CHECK(route("/readyz?full", true, false).route == Route::readyz);
  CHECK(route("/metrics", true, false).route == Route::metrics);
  CHECK(route("/metrics/", true, false).route == Route::not_found);
  CHECK(route("/healthz", true, true).route == Route::not_found);
}

TEST_CASE("/api/<app>/live/sse takes GET and POST, and no upgrade (SPEC 5.9)") {
  const auto get = route("/api/inventory/live/sse?subs=W10", true, false);
  CHECK(get.route == Route::sse);
  CHECK(get.app == "inventory");
  const auto post = route("/api/inventory/live/sse", false, false, true);
  CHECK(post.route == Route::sse);
  CHECK(post.app == "inventory");
  CHECK(route("/api/inventory/live/sse", false, false).route == Route::method_not_allowed);
  CHECK(route("/api/inventory/live/sse", true, true).route == Route::not_found);
  CHECK(route("/api/inventory/live/cursor", false, false, true).route ==
        Route::method_not_allowed);
  CHECK(route("/api/a/b/live/sse", true, false).route == Route::not_found);
}
