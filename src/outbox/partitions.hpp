#pragma once
// The publisher's side of the outbox (SPEC 3, sql/003_partitions.sql): partition ownership through
// session-level advisory locks, reads by position that write nothing, deletes on ack and the
// state of failed publishes. libpqxx stays behind this header.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace outlive::outbox {

constexpr int kPartitions = 64;  // fixed by events.partition_of

struct PendingRow {
  int64_t position = 0;
  std::string id;
  std::string key;
  std::string envelope;
  int64_t created_at_us = 0;
  int attempts = 0;
  int64_t backoff_ms = 0;  // > 0: a failed publish of this row is still backing off
  int partition = 0;
};

struct ReadResult {
  std::vector<PendingRow> rows;  // in position order
  // Every transaction still holding a position up to `handed_out` has an id at most `xid_bound`:
  // the newest outbox writer seen after reading `handed_out` (writers take their id, then the
  // table's lock, then their position). Partition reads only (sql/004 events.read_horizon).
  int64_t handed_out = 0;
  uint64_t xid_bound = 0;
  // The oldest transaction writing to events.outbox just before the read's snapshot was taken:
  // every transaction below it that held a position had ended, so its rows were visible to the
  // read. Transactions that never write to the outbox do not count.
  uint64_t writers_xmin = 0;
  // A read under a lease (sql/005 events.read_owned) that the lease no longer covers: nothing read.
  bool lease_lost = false;
};

// A publisher's lease (sql/005): which member, under which fencing epoch.
struct Lease {
  std::string member;
  int64_t epoch = 0;
};

// A live lease as events.lease_round returns it.
struct LeaseMember {
  std::string member;
  std::vector<std::string> apps;
  bool able = true;
  int backend_pid = 0;
};

struct LeaseRound {
  int64_t epoch = 0;              // the member's epoch after the round
  std::vector<LeaseMember> live;  // every live lease, the member's own included
};

// The partitions of `app` that `member` owns among `live` (the same rule as sql/005
// events.partition_owners: the live, able members serving the app in byte order of their names;
// partition p goes to the (p mod M)-th). Empty when the member is not among them.
std::vector<int> assigned_partitions(const std::vector<LeaseMember>& live, const std::string& app,
                                     const std::string& member);

struct FailedPublish {
  int64_t position = 0;
  std::chrono::milliseconds delay{0};
  std::string error;
};

struct PartitionOwners {
  std::vector<int> owner_pid;  // per partition, 0 when nobody owns it
  int members = 0;             // replicas serving the app, this one included once it joined
};

struct WaitingUpdates {
  std::string app;
  int64_t count = 0;
  double oldest_age_s = 0;
};

// One connection, used by one thread. Every method throws on a database error; after one the
// store is unusable (its locks may be gone) and the owner drops it. Connecting gives up after 2 s.
class PartitionStore {
 public:
  explicit PartitionStore(const std::string& url);
  ~PartitionStore();
  PartitionStore(const PartitionStore&) = delete;
  PartitionStore& operator=(const PartitionStore&) = delete;

  // Without a round trip: false once the server closed the connection (a restart, a terminated
  // backend). Its advisory locks are then gone, so the caller must stop publishing at once.
  bool alive();
  int backend_pid() const { return pid_; }
  // For a SocketSlot (common/socket_slot.hpp): another thread may cut a blocked call short.
  int socket() const;

  void join(const std::string& app);  // the app's shared member lock
  PartitionOwners owners(const std::string& app);
  // Locks those it can of `partitions` (without waiting); returns them.
  std::vector<int> try_acquire(const std::string& app, const std::vector<int>& partitions);
  void release(const std::string& app, const std::vector<int>& partitions);

  // Renews `member`'s lease held under `held_epoch` (0: none) for `ttl`, or takes a new one under
  // a new epoch; returns that epoch and every live lease.
  LeaseRound lease_round(const std::string& member, const std::string& replica,
                         const std::vector<std::string>& apps, std::chrono::milliseconds ttl,
                         int64_t held_epoch, bool able);
  void lease_end(const Lease& lease);

  // The app's rows in `partitions` after position `after`, in position order, at most `max_rows`,
  // without the rows of `skip_keys` and the positions in `known`. With a lease, only while it
  // holds (else `lease_lost` and nothing read).
  ReadResult read(const std::string& app, int64_t after, const std::vector<int>& partitions,
                  const std::vector<std::string>& skip_keys, const std::vector<int64_t>& known,
                  int max_rows, const Lease* lease = nullptr);
  // Which of `apps` have a pending row at all: one round trip for all apps, so an idle replica's
  // poll costs Postgres one statement however many apps it serves.
  std::vector<std::string> apps_with_rows(const std::vector<std::string>& apps);
  // All pending rows of one key, without `known`, in position order, at most `max_rows`.
  ReadResult read_key(const std::string& app, const std::string& key,
                      const std::vector<int64_t>& known, int max_rows);
  // In one transaction: deletes the acked rows, records the failures (attempts, retry_at, error).
  void settle(const std::vector<int64_t>& acked, const std::vector<FailedPublish>& failures);
  std::vector<WaitingUpdates> waiting(const std::vector<std::string>& apps,
                                      std::chrono::milliseconds threshold);

 private:
  struct Conn;
  std::unique_ptr<Conn> conn_;
  int pid_ = 0;
};

// LISTEN outlive_wake on a connection of its own, for a thread that waits on its socket itself
// (poll() on socket() readable, then take()): the wake reaches that thread with no hop through
// another. Not thread-safe. A lost connection makes take() throw; the owner makes a new one.
class WakeConnection {
 public:
  explicit WakeConnection(const std::string& url);
  ~WakeConnection();
  WakeConnection(const WakeConnection&) = delete;
  WakeConnection& operator=(const WakeConnection&) = delete;

  int socket() const;
  // The apps woken since the last call (their payloads), without waiting.
  std::vector<std::string> take();

 private:
  struct Conn;
  std::unique_ptr<Conn> conn_;
};

std::string pg_text_array(const std::vector<std::string>& items);
std::string pg_int_array(const std::vector<int64_t>& items);

}  // namespace outlive::outbox
