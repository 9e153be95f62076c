#pragma once
// A duration drawn uniformly from [low, high] times `d`: periodic work of many sockets opened
// together (a deploy, a reconnect storm) spreads out instead of arriving in one instant.
#include <chrono>
#include <cstdint>
#include <random>

namespace outlive {

inline std::chrono::milliseconds jittered(std::chrono::milliseconds d, double low, double high) {
  thread_local std::minstd_rand random{std::random_device{}()};
  const auto from = static_cast<int64_t>(static_cast<double>(d.count()) * low);
  const auto to = static_cast<int64_t>(static_cast<double>(d.count()) * high);
  return std::chrono::milliseconds(std::uniform_int_distribution<int64_t>(from, to)(random));
}

}  // namespace outlive
