#include "http/routes.hpp"

namespace outlive::http::routes {

namespace {
// The <app> of /api/<app><suffix>: one path segment, not empty; nullopt for any other path.
std::optional<std::string> app_of(std::string_view path, std::string_view suffix) {
  constexpr std::string_view prefix = "/api/";
  if (path.size() <= prefix.size() + suffix.size() || !path.starts_with(prefix) ||
      !path.ends_with(suffix)) {
    return std::nullopt;
  }
  const auto app = path.substr(prefix.size(), path.size() - prefix.size() - suffix.size());
  if (app.find('/') != std::string_view::npos) return std::nullopt;
  return std::string(app);
}
}  // namespace

Routed route(std::string_view target, bool is_get, bool is_upgrade, bool is_post) {
  const std::string_view path = target.substr(0, target.find('?'));
  if (is_upgrade) {
    if (auto app = app_of(path, "/live")) return {Route::upgrade, std::move(*app)};
    return {Route::not_found, {}};
  }
  if (is_get || is_post) {
    if (auto app = app_of(path, "/live/sse")) return {Route::sse, std::move(*app)};
  }
  if (!is_get) return {Route::method_not_allowed, {}};
  if (path == "/healthz") return {Route::healthz, {}};
  if (path == "/readyz") return {Route::readyz, {}};
  if (path == "/metrics") return {Route::metrics, {}};
  if (auto app = app_of(path, "/live/cursor")) return {Route::cursor, std::move(*app)};
  return {Route::not_found, {}};
}

std::string json_body(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string error_body(std::string_view code, std::string_view message) {
  return json_body({{"error", code}, {"message", message}});
}

}  // namespace outlive::http::routes
