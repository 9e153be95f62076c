#pragma once
// Completion handlers allocated at their own size (see ExactAllocator), for the waits every idle
// connection keeps pending.
#include <boost/system/error_code.hpp>
#include <cstddef>
#include <new>
#include <utility>

namespace outlive::ws {

// Asio hands a thread's last freed operation block to its next operation when it is big enough,
// so the read wait every idle socket keeps pending held a block sized for Beast's HTTP read
// (~200 B per socket in heaptrack) instead of its own. A handler with an allocator of its own is
// allocated at its exact size.
template <class T>
struct ExactAllocator {
  using value_type = T;
  ExactAllocator() = default;
  template <class U>
  ExactAllocator(const ExactAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T))); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p); }
  template <class U>
  bool operator==(const ExactAllocator<U>&) const noexcept {
    return true;
  }
  template <class U>
  bool operator!=(const ExactAllocator<U>&) const noexcept {
    return false;
  }
};
template <class F>
struct ExactlySized {
  F f;
  using allocator_type = ExactAllocator<void>;
  allocator_type get_allocator() const noexcept { return {}; }
  void operator()(boost::system::error_code ec) { f(ec); }
};
template <class F>
ExactlySized<F> exactly_sized(F f) {
  return {std::move(f)};
}

}  // namespace outlive::ws
