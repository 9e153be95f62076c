#pragma once
// The one place that turns a libpqxx exception (SQLSTATE) into outlive::Error.
#include <exception>
#include <string_view>

#include "common/error.hpp"

namespace outlive::outbox {

// Rethrows the exception currently being handled as outlive::Error; `what` names the operation.
[[noreturn]] void rethrow_as_error(std::string_view what);

// True when `e` is a failure of the database or of its connection (libpqxx, or outlive::Error of
// Errc::database or Errc::timeout): what an outage throws, unlike a mistake in the code.
bool from_database(const std::exception& e);

}  // namespace outlive::outbox
