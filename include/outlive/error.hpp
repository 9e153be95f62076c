#pragma once
// The one error type of outlive: everything the library throws on purpose is an outlive::Error with
// a code saying what kind of failure it was and a message naming what failed. C libraries (libpq
// via pqxx, nats.c) are translated into it at their boundary, so callers catch one thing.
#include <stdexcept>
#include <string>

namespace outlive {

// What kind of failure an Error reports.
enum class Errc {
  invalid_input,  // refused input: bad key, bad envelope, schema violation, bad config
  not_migrated,   // events.outbox is missing
  database,       // Postgres failed (connection, statement)
  nats,           // NATS or JetStream failed
  timeout,        // a deadline passed
  internal,
};

// Thrown by every outlive function that says it throws; what() is the message.
class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& message) : std::runtime_error(message), code_(code) {}
  // The kind of failure.
  Errc code() const noexcept { return code_; }

 private:
  Errc code_;
};

}  // namespace outlive
