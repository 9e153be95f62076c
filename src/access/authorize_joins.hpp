#pragma once
// One viewer's authorize(key) joined with the other viewers asked about the same key (SPEC 5.5:
// up to 500 viewers a call). A page-load wave or a reconnect storm asks the same keys for
// thousands of sockets within milliseconds; asked one viewer at a time that is one statement (or
// one HTTP request to the application's hook) per subscription.
//
// The rule, per (app, channel, key, generation): viewers join the batch that waits to start; once
// a batch started, the next viewers gather into a new one, which starts when a started one
// answered (so a key has at most one call under way unless batches fill). A full batch (500)
// starts at once. S sockets asking one key thus make about 2 calls, not S, while a lone viewer
// is asked at once.
//
// Thread-safe. Pure bookkeeping: the caller runs the calls and answers the waiters.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "access/decider.hpp"

namespace outlive::access {

class AuthorizeJoins {
 public:
  struct Waiter {
    std::string viewer_id;
    std::function<void(AuthorizeAnswer)> done;
    std::function<bool()> wanted;  // empty: always
  };
  struct Batch {
    std::vector<std::string> ids;  // distinct viewer ids
    std::string viewers;           // their viewer objects, comma-separated
    std::vector<Waiter> waiters;   // grows until started()
    // A JSON array of the viewers, as authorize() takes it.
    std::string viewers_json() const { return "[" + viewers + "]"; }
    bool wanted() const;  // some waiter still wants the answer
  };
  using Key = std::tuple<std::string, std::string, std::string, uint64_t>;  // app, channel, key, gen

  explicit AuthorizeJoins(size_t batch_size = 500) : batch_size_(batch_size) {}

  // Adds the viewer. Returns the batch the caller must start now (its call runs later, see
  // started()), or nullptr when the viewer joined a batch that starts later.
  std::shared_ptr<Batch> join(const Key& key, const std::string& viewer_id,
                              const std::string& viewer_json, std::function<void(AuthorizeAnswer)> done,
                              std::function<bool()> wanted);
  // The batch's call begins: nobody joins it any more.
  void started(const Key& key, const std::shared_ptr<Batch>& batch);
  // The batch's call answered, or could not be made (`answer` not ok): each waiter gets the
  // answer about its own viewer (on this thread, no lock held); nullptr: nobody is told (no
  // waiter wanted it any more). Returns the batch gathered meanwhile, which the caller must start
  // now, or nullptr. Once for every launched batch.
  std::shared_ptr<Batch> finished(const Key& key, const std::shared_ptr<Batch>& batch,
                                  const AuthorizeAnswer* answer);

  // Keys with a batch under way or gathering (tests: nothing is left behind).
  size_t pending_keys() const;

 private:
  struct Slot {
    std::shared_ptr<Batch> open;  // accepts viewers; not started
    bool open_launched = false;   // handed to a caller to start
    int running = 0;              // launched, not finished
  };

  const size_t batch_size_;
  mutable std::mutex mutex_;
  std::map<Key, Slot> slots_;
};

}  // namespace outlive::access
