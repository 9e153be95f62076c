#include "ws/http_routes.hpp"

namespace outlive::ws::http_routes {

std::optional<std::string> live_app(std::string_view path) {
  constexpr std::string_view prefix = "/api/", suffix = "/live";
  if (path.size() <= prefix.size() + suffix.size() || path.substr(0, prefix.size()) != prefix ||
      path.substr(path.size() - suffix.size()) != suffix ||
      path.find('/', prefix.size()) != path.size() - suffix.size()) {
    return std::nullopt;
  }
  return std::string(path.substr(prefix.size(), path.size() - prefix.size() - suffix.size()));
}

Routed route(std::string_view target, bool is_get, bool is_upgrade) {
  const std::string_view path = target.substr(0, target.find('?'));
  if (is_upgrade) {
    if (auto app = live_app(path)) return {Route::upgrade, std::move(*app)};
    return {Route::not_found, {}};
  }
  if (!is_get) return {Route::method_not_allowed, {}};
  if (path == "/healthz") return {Route::healthz, {}};
  if (path == "/readyz") return {Route::readyz, {}};
  if (path == "/metrics") return {Route::metrics, {}};
  constexpr std::string_view prefix = "/api/", suffix = "/live/cursor";
  if (path.size() > prefix.size() + suffix.size() && path.substr(0, prefix.size()) == prefix &&
      path.substr(path.size() - suffix.size()) == suffix) {
    return {Route::cursor,
            std::string(path.substr(prefix.size(), path.size() - prefix.size() - suffix.size()))};
  }
  return {Route::not_found, {}};
}

std::string json_body(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string error_body(std::string_view code, std::string_view message) {
  return json_body({{"error", code}, {"message", message}});
}

}  // namespace outlive::ws::http_routes
