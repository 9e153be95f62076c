#pragma once
// The authorize() batches of one update's followers whose decisions are missing (SPEC 5.5): per
// channel, the distinct viewers, at most `batch_size` to a batch; each batch lists the followers'
// decisions it answers, so an answer touches only those. A batch is sent as soon as it is full:
// Postgres answers the first while the rest are built (~2 ms for 5,000 viewers). A batch's list of
// decisions may still grow after it went (another tab of a viewer already in it): the dispatcher
// reads answers on its own thread, after building returned.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "fanout/hub.hpp"

namespace outlive::fanout {

// One follower's decision for one of its channels: pending[follower].allowed[channel].
struct AskedDecision {
  uint32_t follower;
  uint32_t channel;
};

struct AuthorizeBatch {
  const std::string* channel;
  std::vector<std::string> ids;  // the viewers' ids, in the order of `viewers`
  std::string viewers;           // a JSON array of the viewers' objects, as authorize() takes it
};

class AuthorizeBatches {
 public:
  // Called once per batch, with its index in `asked`.
  using Send = std::function<void(uint32_t batch, AuthorizeBatch&& b)>;
  // `asked` is cleared, then gets one list per batch. `followers`: a size hint.
  AuthorizeBatches(size_t batch_size, size_t followers,
                   std::vector<std::vector<AskedDecision>>& asked, Send send);
  AuthorizeBatches(const AuthorizeBatches&) = delete;
  AuthorizeBatches& operator=(const AuthorizeBatches&) = delete;

  // `decision` is missing; `channel` is the hub's interned name of the follower's channel.
  void add(AskedDecision decision, const std::string* channel, const Viewer& viewer);
  // Sends every batch still being filled.
  void finish();

 private:
  struct Open {  // a channel's batch being filled (usually one channel)
    const std::string* channel;
    std::unordered_map<std::string_view, uint32_t> batch_of_viewer;
    uint32_t filling;
  };
  uint32_t start_batch(const std::string* channel);
  void send(uint32_t n);

  const size_t batch_size_;
  const size_t followers_;
  std::vector<std::vector<AskedDecision>>& asked_;
  Send send_;
  std::vector<AuthorizeBatch> batches_;
  std::vector<Open> open_;
};

}  // namespace outlive::fanout
