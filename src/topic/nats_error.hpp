#pragma once
// The one place that turns a natsStatus (and JetStream error code) into outlive::Error.
#include <nats/nats.h>

#include <string>

#include "common/error.hpp"

namespace outlive::topic {

std::string describe(natsStatus status, jsErrCode js_error = static_cast<jsErrCode>(0));
void check(natsStatus status, const std::string& what,
           jsErrCode js_error = static_cast<jsErrCode>(0));

}  // namespace outlive::topic
