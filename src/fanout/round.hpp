#pragma once
// A round of one app's live delivery, built on its dispatcher's thread: each reader's part, then
// offered to every reader at once and handed to the io threads in one post per thread
// (DeliveryHost::take): one hand-off per thread, not per reader, is what keeps a round of
// thousands of sockets cheap.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fanout/delivery.hpp"

namespace outlive::fanout {

class Hub;

// What an app's delivery asks of the replica around it (session::Context).
class DeliveryHost {
 public:
  // Runs take() of each reader on the reader's own thread.
  virtual void take(std::vector<std::shared_ptr<Reader>>&& readers) = 0;
  // Runs progress(position) of each reader on its own thread, likewise.
  virtual void progress(std::vector<std::shared_ptr<Reader>>&& readers, ProgressTick tick) = 0;
  // Per round: commit-to-hand-off delays in seconds.
  virtual void on_round(const std::string& app, const std::vector<double>& delays) = 0;
  // Per progress tick: the readers it visited (those not settled).
  virtual void on_progress(const std::string& app, size_t visited) = 0;
  // An events.disconnect of the app read from its topic (once per disconnect, not per copy), before
  // any reader is ended: the replica remembers it (JWTs issued before it are refused).
  virtual void on_disconnect(const std::string& app, const window::Disconnect& disconnect) = 0;
  // Runs disconnect(reason) of each reader on its own thread.
  virtual void disconnect(std::vector<std::shared_ptr<Reader>>&& readers,
                          const std::string& reason) = 0;

 protected:
  ~DeliveryHost() = default;
};

class Round {
 public:
  Round(const std::string& app, Hub& hub, DeliveryHost& host) : app_(app), hub_(hub), host_(host) {}
  Round(const Round&) = delete;
  Round& operator=(const Round&) = delete;

  // The reader's part of this round (Reader::slot_ is its place: a map from reader to place cost
  // a node per reader per round).
  std::vector<Delivery>& part_of(const std::shared_ptr<Reader>& reader);
  // An update handed off `seconds` after its commit.
  void handed_after(double seconds) { delays_.push_back(seconds); }
  // Offers each reader its part, with every update up to `through` handed off, posts take() of
  // those whose mailbox was empty, and starts the next round.
  void post(uint64_t through);

 private:
  const std::string& app_;
  Hub& hub_;
  DeliveryHost& host_;
  std::vector<std::pair<std::shared_ptr<Reader>, std::vector<Delivery>>> parts_;
  uint64_t number_ = 1;
  std::vector<double> delays_;
};

}  // namespace outlive::fanout
