#pragma once
// What the outbox holds per app, for the replica's outbox gauges (/metrics): read in the
// background on a kept connection (db/kept_connection.hpp), never per scrape.
#include <cstdint>
#include <map>
#include <string>

namespace outlive::db {
class Connection;
}

namespace outlive::outbox {

struct Backlog {
  int64_t pending = 0;      // rows of the app in events.outbox
  double oldest_age = 0.0;  // seconds since the oldest of them was written
};

// Every app with rows (apps without any are absent). Throws what the query threw.
std::map<std::string, Backlog> backlog_by_app(db::Connection& conn);

}  // namespace outlive::outbox
