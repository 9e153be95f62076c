#pragma once
// The one error type of outlive. C libraries (libpq via pqxx, nats.c) are translated into it at
// their boundary (outbox/pg_error.cpp, topic/nats.cpp), so callers catch one thing.
#include <stdexcept>
#include <string>

namespace outlive {

enum class Errc {
  invalid_input,  // refused input: bad key, bad envelope, schema violation, bad config
  not_migrated,   // events.outbox is missing
  database,       // Postgres failed (connection, statement)
  nats,           // NATS or JetStream failed
  timeout,        // a deadline passed
  internal,
};

class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& message) : std::runtime_error(message), code_(code) {}
  Errc code() const noexcept { return code_; }

 private:
  Errc code_;
};

}  // namespace outlive
