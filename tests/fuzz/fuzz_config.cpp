// config::parse (src/config) on arbitrary JSON: a configuration is read or refused with
// outlive::Error(invalid_input); any other exception escapes and counts as a crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "config/config.hpp"

namespace {

void require(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto doc = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;
  try {
    const auto config = outlive::config::parse(doc, "fuzz.json");
    require(!config.database.empty());
    require(!config.nats.empty());
    require(!config.apps.empty());
    require(config.server.idle_timeout > config.server.ping_interval);
  } catch (const outlive::Error& e) {
    require(e.code() == outlive::Errc::invalid_input);
  }
  return 0;
}
