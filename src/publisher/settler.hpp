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

namespace outlive::publisher {

class Settler {
 public:
  Settler(std::string database_url, std::function<void(std::vector<int64_t>)> on_deleted);
  ~Settler();  // deletes what was handed over (gives up at the first failure), then joins
  Settler(const Settler&) = delete;
  Settler& operator=(const Settler&) = delete;

  void add(std::vector<int64_t> positions);

 private:
  void run();

  const std::string url_;
  const std::function<void(std::vector<int64_t>)> on_deleted_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<int64_t> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace outlive::publisher
