#pragma once
// Deletes acked rows on a connection and a thread of its own (docs/ARCHITECTURE.md "The publisher
// loop"), so the loop goes on reading and publishing while a delete runs. `on_deleted` reports each
// group from the settler's thread once its delete committed; only then may the loop forget those
// rows (until then its reads skip them as held). A delete that fails is tried again on a new
// connection every 500 ms; the rows stay held meanwhile, and a replica that stops first leaves
// them to be published again under the same Nats-Msg-Id.
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/outage_log.hpp"
#include "common/socket_slot.hpp"

namespace outlive::publisher {

class Settler {
 public:
  // `slot`, when given, is where the settler puts its connection's socket (its owner may then
  // interrupt it while this object is being destroyed); by default a slot of its own.
  Settler(std::string database_url, std::function<void(std::vector<int64_t>)> on_deleted,
          SocketSlot* slot = nullptr);
  ~Settler();  // deletes what was handed over (gives up at the first failure), then joins
  Settler(const Settler&) = delete;
  Settler& operator=(const Settler&) = delete;

  void add(std::vector<int64_t> positions);
  // From any thread: a delete waiting on a server that does not answer fails at once, and so does
  // every later one (the destructor then gives up on what is left).
  void interrupt() { slot_.interrupt(); }

 private:
  void run();

  const std::string url_;
  const std::function<void(std::vector<int64_t>)> on_deleted_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<int64_t> queue_;
  bool stopping_ = false;
  SocketSlot own_slot_;
  SocketSlot& slot_;  // the settler's connection
  // One line when deletes start failing, a repeat every 10 s, one when they work again.
  log::OutageLog outage_{"publisher: deleting acked updates (they stay held and are tried again)"};
  std::thread thread_;
};

}  // namespace outlive::publisher
