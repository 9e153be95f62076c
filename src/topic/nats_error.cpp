#include "topic/nats_error.hpp"

namespace outlive::topic {

std::string describe(natsStatus status, jsErrCode js_error) {
  std::string text = natsStatus_GetText(status);
  const char* last = nats_GetLastError(nullptr);
  if (last != nullptr && *last != '\0') text += std::string(" (") + last + ")";
  if (js_error != 0)
    text += " [jetstream error " + std::to_string(static_cast<int>(js_error)) + "]";
  return text;
}

void check(natsStatus status, const std::string& what, jsErrCode js_error) {
  if (status == NATS_OK) return;
  throw Error(status == NATS_TIMEOUT ? Errc::timeout : Errc::nats,
              what + ": " + describe(status, js_error));
}

}  // namespace outlive::topic
