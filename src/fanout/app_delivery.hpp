#pragma once
// One app's live delivery on a replica (SPEC 5.5–5.8), made by the replica and fed by the app's
// window directly: window → AppDelivery::push → Dispatcher (lanes, decisions, rounds) →
// Reader::offer → the socket's Feed. It owns the app's Hub (its sockets and who follows which
// key): the app's sockets join it, its dispatcher and ticks read it. The topic's identity is
// recorded here once, for every frame's cursor; each update's shared tail is built once, before the
// update is shared.
#include <cstdint>
#include <map>
#include <string>

#include "fanout/dispatcher.hpp"
#include "fanout/frame.hpp"
#include "window/window.hpp"

namespace outlive::fanout {

class AppDelivery final : public window::Sink {
 public:
  AppDelivery(std::string app, const std::map<std::string, config::Channel>& channels,
              access::Decider& decider, DispatcherOptions options, DeliveryHost& host)
      : app_(app), dispatcher_(std::move(app), channels, hub_, decider, options, host) {}

  // window::Sink, on the topic reader's thread.
  void prepare(window::Update& update, const topic::TopicIdentity& identity) override {
    fanout::prepare(update, identity);
  }
  // Blocks while the dispatcher is full (the topic reader stops reading ahead).
  void push(const window::UpdatePtr& update) override { dispatcher_.push(update); }

  // After the window's start(), before any reader: `identity` is the topic's.
  void start(topic::TopicIdentity identity) {
    identity_ = identity;
    dispatcher_.start(std::move(identity));
  }
  void stop() { dispatcher_.stop(); }

  const std::string& app() const { return app_; }
  // The app's sockets and their follows.
  Hub& hub() { return hub_; }
  const Hub& hub() const { return hub_; }
  const topic::TopicIdentity& identity() const { return identity_; }
  // Which updates were handed off (what a reader catching up may send).
  const HandOffs& hand_offs() const { return dispatcher_.hand_offs(); }
  // An access update has been read and not yet handed off (a replay from a cursor resyncs then).
  bool access_pending() const { return dispatcher_.access_pending(); }
  // The position of the latest access update read.
  uint64_t last_access_position() const { return dispatcher_.last_access_position(); }

 private:
  const std::string app_;
  topic::TopicIdentity identity_;  // written by start(), before any reader reads it
  // Before the dispatcher, which reads it until its thread is joined (its destructor).
  Hub hub_;
  Dispatcher dispatcher_;
};

}  // namespace outlive::fanout
