#pragma once
// One app's live delivery (SPEC 5.5, 5.8): takes the app's updates in topic order, decides access
// for the readers that follow each key, and hands every reader its part of a round. Keys are
// isolated: while authorize() runs for one key (up to the 10 s deadline), that key's later updates
// wait in its lane, in order, and every other key goes on. Bounded: when `max_waiting` updates wait
// (queued or in lanes), push() blocks, so the topic reader stops reading ahead. What it holds
// apart: the lanes (here), the authorize() batches (AuthorizeBatches), a reader's frame (frame.hpp,
// shared with catch-up), a hot key's decisions (DecisionMemo), the round being built (Round) and
// the app's ticks its thread runs between rounds (Ticks).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "config/config.hpp"
#include "fanout/authorize_batches.hpp"
#include "fanout/decision_memo.hpp"
#include "fanout/frame.hpp"
#include "fanout/hand_offs.hpp"
#include "fanout/hub.hpp"
#include "fanout/round.hpp"
#include "fanout/ticks.hpp"
#include "topic/cursor.hpp"
#include "window/window.hpp"

namespace outlive::access {
class Decider;
}

namespace outlive::fanout {

struct DispatcherOptions {
  std::chrono::milliseconds check_timeout{10000};
  size_t max_waiting = 4096;  // updates taken from the topic and not yet handed off
  size_t round_size = 64;
  size_t authorize_batch = 500;
  std::chrono::milliseconds progress_interval{1000};
  std::chrono::milliseconds collection_refresh{60000};  // keys() again for collections
};

class Dispatcher {
 public:
  // `hub` is the app's own (AppDelivery's): it outlives the dispatcher.
  Dispatcher(std::string app, const std::map<std::string, config::Channel>& channels, Hub& hub,
             access::Decider& decider, DispatcherOptions options, DeliveryHost& host);
  ~Dispatcher();  // stop()
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // `identity` is the topic's (the frames' cursors), read once by the app's window.
  void start(topic::TopicIdentity identity);
  void stop();

  // The topic reader's thread, in topic order. Blocks while the dispatcher is full.
  void push(const window::UpdatePtr& update);

  // An access update has been read and not yet handed off (a replay from a cursor resyncs then).
  bool access_pending() const { return access_pending_.load() > 0; }
  // The position of the latest access update read.
  uint64_t last_access_position() const { return last_access_position_.load(); }
  // Updates taken and not yet handed off (the bound is max_waiting).
  size_t waiting() const;
  // Which updates have been handed off (what a reader catching up may send).
  const HandOffs& hand_offs() const { return hand_offs_; }

 private:
  struct Pending {         // a follower of one update, with the decisions read for it
    const Target* target;  // in the item's targets
    Access access;         // missing: asked of authorize()
    bool handed = false;   // its delivery is in a round already
  };
  struct Item {
    window::UpdatePtr update;
    Targets targets;                  // the key's followers when it was taken
    std::vector<Pending> pending;     // made when it reaches the front of its lane
    bool decided = false;             // decisions were read from the cache (once per item)
    std::shared_ptr<void> forgotten;  // an access update's forgotten decisions, freed after it
    std::shared_ptr<const OutgoingUpdate> out;  // built at its first hand-off
  };
  struct Lane {
    std::deque<Item> items;
    int asking = 0;  // authorize() batches in flight for the front item
    uint64_t ask_id = 0;
    std::chrono::steady_clock::time_point deadline{};
    std::vector<std::vector<AskedDecision>>
        asked;  // per batch of the front item (AuthorizeBatches)
  };
  struct Answer {
    std::string key;
    uint64_t ask_id = 0;
    uint32_t batch = 0;
    bool ok = false;
    std::set<std::string> allowed;
  };
  // What the dispatcher's thread shares with push() and with the pool workers that answer.
  struct Queue {
    std::mutex mutex;
    std::condition_variable wake;      // the dispatcher's thread
    std::condition_variable has_room;  // push()
    std::deque<window::UpdatePtr> incoming;
    std::vector<Answer> answers;
    size_t waiting = 0;  // incoming + lane items
    bool stop = false;
  };

  // An events.disconnect that ends readers once every update before it is handed off.
  struct Ending {
    uint64_t position;
    std::string reason;
    std::vector<std::shared_ptr<Reader>> readers;
  };

  void run();
  // One pass of run(): the answers, the deadlines, the batch taken from the queue (`next` is the
  // index of the update being taken), the round and the ticks.
  void work(std::vector<Answer>& answers, const std::vector<window::UpdatePtr>& batch,
            size_t& next);
  // The dispatcher's error policy (docs/ARCHITECTURE.md): an exception in work() at batch[next]
  // (or after the batch) abandons what the lanes hold and that update; the batch's later updates
  // go back to the queue, and every live reader is told to resync at the abandoned position.
  void recover(const std::string& what, std::vector<window::UpdatePtr>& batch, size_t next);
  // Tells every live reader the positions up to abandoned_through_ were not handed to it.
  void resync_abandoned();
  void take(const window::UpdatePtr& update);
  // An update that goes to no lane (a disconnect, a gap) is done with.
  void release(uint64_t position);
  // A disconnect (SPEC 2.6 rev 4): its first copy marks the readers it names, which receive
  // nothing after it from then on, and queues their ending.
  void take_disconnect(const window::UpdatePtr& update);
  // Ends the readers of each queued disconnect whose earlier updates are all handed off, after
  // the round that holds those goes out.
  void run_endings();
  // Hands off the lane's items whose decisions are complete; asks authorize() for the front one
  // when decisions are missing.
  void run_lane(const std::string& key);
  // Fills the item's pending with every follower's cached decisions; true when some are missing.
  bool decide(const std::string& key, Item& item);
  void ask(const std::string& key, Lane& lane, Item& item);
  void apply(const Answer& answer);
  void expire(std::chrono::steady_clock::time_point now);
  // Every follower's delivery into the round (those not handed already).
  void hand_off(Item& item);
  // The followers of `asked` whose decisions are now complete, while other batches are still out:
  // the first answers of a big key go out while Postgres answers the rest.
  void hand_off_answered(Item& item, const std::vector<AskedDecision>& asked);
  // `early`: the update's other batches are still out (the cursor then stays below it).
  void deliver(Item& item, Pending& p, bool early);
  // The round goes out with what it holds (the position handed off through: handed_through()).
  void post_round() { round_.post(handed_through()); }
  uint64_t handed_through() const;

  const std::string app_;
  const std::map<std::string, config::Channel>& channels_;
  Hub& hub_;
  DeliveryHost& host_;
  access::Decider& decider_;
  const DispatcherOptions options_;
  topic::TopicIdentity identity_;  // written by start(), before the thread
  HandOffs hand_offs_;

  const std::shared_ptr<Queue> queue_ = std::make_shared<Queue>();
  std::thread thread_;

  // The dispatcher thread's own state.
  std::unordered_map<std::string, Lane> lanes_;
  uint64_t next_ask_ = 0;
  DecisionMemo memo_;
  uint64_t taken_through_ = 0;
  Round round_;
  Ticks ticks_;
  std::deque<Ending> endings_;
  std::set<std::string> disconnects_seen_;       // the copies of one disconnect act once
  std::deque<std::string> disconnects_seen_order_;  // the oldest forgotten beyond 1,024
  uint64_t abandoned_through_ = 0;  // recover(): live readers not yet told (0: none)
  std::atomic<int> access_pending_{0};
  std::atomic<uint64_t> last_access_position_{0};
};

}  // namespace outlive::fanout
