#include "common/fault.hpp"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace outlive::fault {
namespace {

constexpr std::array<std::string_view, 3> kSites{"topic", "dispatcher", "io"};

// Passes left before the armed one throws, per site (0: not armed).
std::array<std::atomic<uint64_t>, kSites.size()> left{};

// OUTLIVE_FAULT=<site>:<n>, read when the process starts. Anything else arms nothing (and says
// so: a test that expects a fault must not pass for want of one).
bool from_environment() {
  const char* value = std::getenv("OUTLIVE_FAULT");
  if (value == nullptr || *value == '\0') return false;
  const std::string_view v(value);
  const auto colon = v.find(':');
  for (size_t i = 0; colon != std::string_view::npos && i < kSites.size(); ++i) {
    if (v.substr(0, colon) != kSites[i]) continue;
    const std::string n(v.substr(colon + 1));
    char* end = nullptr;
    const unsigned long long nth = std::strtoull(n.c_str(), &end, 10);
    if (n.empty() || *end != '\0' || nth == 0) break;
    left[i] = nth;
    return true;
  }
  // (stderr itself: this runs before main, when the logger may not be set up yet)
  std::fprintf(stderr, "OUTLIVE_FAULT=%s is not <site>:<n> with a site of topic, dispatcher, io; "
               "nothing armed\n", value);
  return false;
}

}  // namespace

std::atomic<bool> detail::armed{from_environment()};

void arm(Site site, uint64_t nth) {
  left[static_cast<size_t>(site)] = nth;
  if (nth > 0) detail::armed = true;
}

void detail::hit(Site site) {
  auto& l = left[static_cast<size_t>(site)];
  uint64_t n = l.load();
  while (n > 0 && !l.compare_exchange_weak(n, n - 1)) {
  }
  if (n == 1)
    throw Injected("injected fault (OUTLIVE_FAULT) at " +
                   std::string(kSites[static_cast<size_t>(site)]));
}

}  // namespace outlive::fault
