#pragma once
// The owner's cursor over its partitions (pure; docs/ARCHITECTURE.md "The outbox and the claim").
// Positions are handed out when a row is written, not when it commits, so a row may become
// visible below a position already read. The cursor passes a position only once every row at or
// below it is final: each read notes the positions handed out so far and a transaction id no lower
// than that of any transaction still holding one of them; once no transaction up to that id is
// still writing to the outbox (the writers' xmin of this or a later read passed it), every row up
// to that position is visible, and was returned by that read unless it stopped at max_rows first.
// Transactions that never write to the outbox hold nothing back, however long they run.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "outbox/partitions.hpp"

namespace outlive::publisher {

class Horizon {
 public:
  int64_t cursor() const { return cursor_; }
  void reset() {
    cursor_ = 0;
    pending_.clear();
  }

  // After a partition read from cursor(): `last_returned` is the highest position it returned
  // (0: none); `full` when it stopped at max_rows.
  void advance(const outbox::ReadResult& read, int64_t last_returned, bool full) {
    pending_.push_back(Pending{read.handed_out, read.xid_bound});
    int64_t ripe = cursor_;
    for (const auto& p : pending_) {
      if (read.writers_xmin > p.xid_bound) ripe = std::max(ripe, p.handed_out);
    }
    const int64_t next = full ? std::min(ripe, std::max(cursor_, last_returned)) : ripe;
    cursor_ = std::max(cursor_, next);
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [&](const Pending& p) { return p.handed_out <= cursor_; }),
                   pending_.end());
    // Bounded: behind a long transaction the reads keep coming. Dropping an entry only means the
    // cursor waits for a later one, whose transactions include the dropped one's.
    if (pending_.size() > kMaxPending) pending_.erase(pending_.begin() + 1);
  }

 private:
  struct Pending {
    int64_t handed_out;
    uint64_t xid_bound;
  };
  static constexpr size_t kMaxPending = 16;
  int64_t cursor_ = 0;
  std::vector<Pending> pending_;
};

}  // namespace outlive::publisher
