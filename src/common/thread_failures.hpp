#pragma once
// The error policy of each kind of thread (docs/ARCHITECTURE.md, "Error policy per thread"): the
// top-level loop of every kind catches what its work throws, applies the kind's policy (what the
// failure means for the data decides what is done about it) and counts it here, so that no
// exception ends the process unseen and an operator sees them in
// outlive_thread_failures_total{thread}. Counts of the process: an embedding that runs several
// replicas in one process sees their sum on each.
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace outlive {

enum class ThreadKind : uint8_t { topic, dispatcher, io, pool, publisher };

inline constexpr std::array<ThreadKind, 5> kThreadKinds{ThreadKind::topic, ThreadKind::dispatcher,
                                                        ThreadKind::io, ThreadKind::pool,
                                                        ThreadKind::publisher};

// The `thread` label of the counter.
constexpr std::string_view thread_kind_name(ThreadKind kind) {
  constexpr std::array<std::string_view, 5> names{"topic", "dispatcher", "io", "pool", "publisher"};
  return names[static_cast<size_t>(kind)];
}

namespace detail {
inline std::array<std::atomic<uint64_t>, kThreadKinds.size()> thread_failures{};
}

// Any thread: an exception reached the top-level loop of a thread of this kind.
inline void count_thread_failure(ThreadKind kind) {
  detail::thread_failures[static_cast<size_t>(kind)].fetch_add(1, std::memory_order_relaxed);
}

inline uint64_t thread_failures(ThreadKind kind) {
  return detail::thread_failures[static_cast<size_t>(kind)].load(std::memory_order_relaxed);
}

}  // namespace outlive
