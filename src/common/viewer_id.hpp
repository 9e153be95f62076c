#pragma once
// Which viewer ids an events.disconnect(app, viewer) names (SPEC 2.6 rev 4): the viewer itself and
// every id under it, `viewer` followed by `:` (so `user:ada` names `user:ada:app`, not `user:adam`).
#include <string_view>

namespace outlive {

inline bool viewer_named_by(std::string_view viewer_id, std::string_view named) {
  if (named.empty() || !viewer_id.starts_with(named)) return false;
  return viewer_id.size() == named.size() || viewer_id[named.size()] == ':';
}

}  // namespace outlive
