#pragma once
// The one place that turns a libpqxx exception (SQLSTATE) into outlive::Error.
#include <exception>
#include <string_view>

#include "common/error.hpp"

namespace outlive::outbox {

// Rethrows the exception currently being handled as outlive::Error; `what` names the operation.
[[noreturn]] void rethrow_as_error(std::string_view what);

}  // namespace outlive::outbox
