#pragma once
// The signature of every request to the application's hooks (SPEC 5.1, 5.4 rev 4):
// `Outlive-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`. The application
// checks it with the same secret and refuses a `t` more than 5 minutes old (replays).
#include <cstdint>
#include <string>
#include <string_view>

namespace outlive::hooks {

inline constexpr const char* kSignatureHeader = "Outlive-Signature";

// The header's value for `body` sent at `unix_seconds`.
std::string signature(std::string_view secret, std::string_view body, int64_t unix_seconds);

// hook_secret_file's secret: the file's bytes with one trailing newline ("\n" or "\r\n") trimmed.
// Throws outlive::Error(invalid_input) naming the file when it cannot be read or is empty.
std::string read_secret(const std::string& path);

}  // namespace outlive::hooks
