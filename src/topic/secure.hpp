#pragma once
// Private to src/topic/: applies ConnectOptions (credentials, TLS) to nats.c options, and names a
// connect failure that waiting will not cure.
#include <nats/nats.h>

#include <optional>
#include <string>
#include <vector>

#include "topic/connect_options.hpp"

namespace outlive::topic {

// Throws Error(invalid_input) for a secret file that cannot be read or options that contradict
// each other, Error(nats) when nats.c refuses a certificate or key. Returns whether TLS is on.
bool apply_connect_options(natsOptions* opts, const std::vector<std::string>& urls,
                           const ConnectOptions& options);
// For an authorization or TLS refusal: what to tell the operator. nullopt: worth retrying.
std::optional<std::string> lasting_refusal(natsStatus status);
// What to add to a failure that was retried until the connect timeout: with TLS, a server that
// verifies clients accepts the handshake (TLS 1.3) and then drops a client whose certificate it
// refuses, which nats.c reports as a protocol or I/O error indistinguishable from a restart.
std::string retried_failure_hint(natsStatus status, bool tls);

}  // namespace outlive::topic
