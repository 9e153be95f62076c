#pragma once
// Fault injection, for tests only: makes the n-th pass through a chosen place throw, so that the
// error policy of the thread there (common/thread_failures.hpp) can be shown to hold. Armed by
// the environment variable OUTLIVE_FAULT=<site>:<n> (read once, when the process starts; e.g.
// OUTLIVE_FAULT=dispatcher:3) or, in an in-process test, by arm(). Unarmed, a pass costs one
// relaxed load of a flag. Never set it in production: it throws on purpose.
#include <atomic>
#include <cstdint>
#include <stdexcept>

namespace outlive::fault {

enum class Site : uint8_t {
  topic,       // the topic thread, an update in the window and not yet handed to delivery
  dispatcher,  // the dispatcher's thread, an update taken from its queue and not yet in a lane
  io,          // an io thread, a tab's messages about to be handled
};

// What hit() throws.
struct Injected : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Arms `site`: the `nth` pass from now on throws (once); 0 disarms it. Any thread.
void arm(Site site, uint64_t nth);

namespace detail {
extern std::atomic<bool> armed;  // some site is armed
void hit(Site site);
}  // namespace detail

// One pass through `site`: throws Injected on the armed pass.
inline void hit(Site site) {
  if (detail::armed.load(std::memory_order_relaxed)) [[unlikely]]
    detail::hit(site);
}

}  // namespace outlive::fault
