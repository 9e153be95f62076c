#pragma once
// The recent events.disconnect calls (SPEC 2.6 rev 4, sql/007_disconnect.sql), read once by a
// replica at start so that it refuses the JWTs they refuse on the replicas that read them live.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace outlive::outbox {

struct RecentDisconnect {
  std::string app;
  std::string viewer;
  int64_t at_ms = 0;  // unix milliseconds
};

// The disconnects of `app_ids` of the last `max_age`, on a connection of its own. Throws
// outlive::Error (not_migrated) when events.disconnects does not exist, and what libpqxx throws
// when Postgres cannot be reached.
std::vector<RecentDisconnect> recent_disconnects(const std::string& database_url,
                                                 const std::vector<std::string>& app_ids,
                                                 std::chrono::seconds max_age);

}  // namespace outlive::outbox
