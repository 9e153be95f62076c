// The answers of the application's hooks (src/hooks, SPEC 5.1 and 5.4 rev 4) on arbitrary bytes:
// an answer comes from a service outlive does not control, so each parser either returns a sound
// value or throws outlive::Error(invalid_input), and the session check's parser gives every ref
// its own answer: a viewer with its strings, a refusal, or a failure, never two of them.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/error.hpp"
#include "hooks/auth_hook.hpp"
#include "hooks/channel_hook.hpp"

namespace {

void require(bool condition) {
  if (!condition) std::abort();
}

template <class Parse>
void parse_or_refuse(Parse parse) {
  try {
    parse();
  } catch (const outlive::Error& e) {
    require(e.code() == outlive::Errc::invalid_input);
  }
}

bool nonempty_string(const nlohmann::json& viewer, const char* name) {
  const auto it = viewer.find(name);
  return it != viewer.end() && it->is_string() && !it->get_ref<const std::string&>().empty();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);

  parse_or_refuse([&] {
    const auto keys = outlive::hooks::parse_keys_answer(body);
    if (keys) {
      for (const auto& k : *keys) (void)k.size();
    }
  });
  parse_or_refuse([&] { (void)outlive::hooks::parse_authorize_answer(body).size(); });

  // Up to 64 refs, the most one call asks about.
  const size_t count = size % 65;
  parse_or_refuse([&] {
    const auto answers = outlive::hooks::parse_credentials_answer(body, count);
    require(answers.size() == count);
    for (const auto& a : answers) {
      const bool failed = !a.failure.empty();
      const bool refused = !a.refused.empty();
      const bool admitted = a.admitted();
      require(int(failed) + int(refused) + int(admitted) == 1);
      require(a.expires_in_s >= 0);
      if (!admitted) continue;
      require(a.viewer.is_object());
      require(nonempty_string(a.viewer, "id") && nonempty_string(a.viewer, "actor") &&
              nonempty_string(a.viewer, "accessSubject"));
      const auto& scopes = a.viewer["scopes"];
      require(scopes.is_null() || scopes.is_array());
      if (scopes.is_array()) {
        for (const auto& s : scopes) require(s.is_string());
      }
      (void)a.viewer.dump();  // sent on to channels as it is: must serialize
    }
  });
  return 0;
}
