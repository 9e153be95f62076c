#include "outbox/partitions.hpp"

#include <poll.h>

#include <algorithm>
#include <pqxx/pqxx>

#include "common/log.hpp"
#include "db/pool.hpp"

namespace outlive::outbox {

std::string pg_text_array(const std::vector<std::string>& items) {
  std::string out = "{";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ',';
    out += '"';
    for (char c : items[i]) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    out += '"';
  }
  return out + "}";
}

std::string pg_int_array(const std::vector<int64_t>& items) {
  std::string out = "{";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + std::to_string(items[i]);
  return out + "}";
}

namespace {

std::string pg_int_array(const std::vector<int>& items) {
  return outbox::pg_int_array(std::vector<int64_t>(items.begin(), items.end()));
}

std::string pg_interval(std::chrono::milliseconds d) {
  return std::to_string(d.count()) + " milliseconds";
}

// The columns of read_key (events.read_partitions returns the same ones, then the horizon).
constexpr const char* kRowColumns =
    "o.position, o.id::text, o.key, o.envelope::text,"
    " (extract(epoch FROM o.created_at) * 1000000)::bigint, o.attempts,"
    " CASE WHEN o.retry_at > now()"
    "  THEN ceil(extract(epoch FROM o.retry_at - now()) * 1000)::bigint ELSE 0 END,"
    " o.partition";

// Both reads return these columns first (read_partitions then adds the horizon).
PendingRow pending_row(const pqxx::row& row) {
  return PendingRow{row[0].as<int64_t>(),     row[1].as<std::string>(), row[2].as<std::string>(),
                    row[3].as<std::string>(), row[4].as<int64_t>(),     row[5].as<int>(),
                    row[6].as<int64_t>(),     row[7].as<int>()};
}

}  // namespace

// A server that accepts the connection and then never answers (frozen) must not hold the owner:
// connecting gives up after this (libpq counts whole seconds, at least 2).
constexpr auto kConnectTimeout = std::chrono::seconds(2);

// A request the server never acknowledges at the TCP level (a network partition that closes no
// socket) fails after this instead of after the kernel's ~15 minutes of retransmissions.
constexpr const char* kTcpUserTimeoutMs = "4000";

struct PartitionStore::Conn {
  explicit Conn(const std::string& url)
      : c(db::named(db::with_setting(db::with_connect_timeout(url, kConnectTimeout),
                                     "tcp_user_timeout", kTcpUserTimeoutMs),
                    "outlive-publisher")) {}
  pqxx::connection c;
};

PartitionStore::PartitionStore(const std::string& url) : conn_(std::make_unique<Conn>(url)) {
  pqxx::nontransaction tx(conn_->c);
  // The reads must walk outbox_app_position_idx in position order and stop after max_rows
  // whatever the statistics say (an outbox is usually empty when it is analyzed; see 002).
  tx.exec("SET enable_seqscan = off; SET enable_bitmapscan = off; SET enable_sort = off");
  // What this connection commits may be lost in a crash: an ack's delete (the update is published
  // again, under the same Nats-Msg-Id), a failure's attempts, a read's transaction id. None is
  // worth a WAL flush per read.
  tx.exec("SET synchronous_commit = off");
  pid_ = tx.exec1("SELECT pg_backend_pid()")[0].as<int>();
  conn_->c.prepare("read_partitions",
                   "SELECT * FROM events.read_partitions($1, $2, $3::smallint[], $4::text[],"
                   " $5::bigint[], $6)");
  // events.read_owned's check as a one-time filter of the read itself: Postgres evaluates it
  // before the function scan, and the rows are materialised once, not again by a wrapping
  // PL/pgSQL function (which cost the drain ~12%: docs/BENCHMARKS.md).
  conn_->c.prepare("read_owned",
                   "SELECT * FROM events.read_partitions($1, $2, $3::smallint[], $4::text[],"
                   " $5::bigint[], $6) WHERE EXISTS (SELECT 1 FROM events.publisher_leases l"
                   " WHERE l.member = $7 AND l.epoch = $8 AND l.expires_at > now())");
  conn_->c.prepare("lease_round",
                   "SELECT my_epoch, m_member, array_to_string(m_apps, ','), m_able, m_pid"
                   " FROM events.lease_round($1, $2, $3::text[], $4, $5, $6)");
  conn_->c.prepare("apps_with_rows",
                   "SELECT a FROM unnest($1::text[]) a WHERE EXISTS (SELECT 1 FROM events.outbox o"
                   " WHERE o.app_id = a AND o.topic = 'live')");
  conn_->c.prepare("read_key", std::string("SELECT ") + kRowColumns +
                                   " FROM events.outbox o"
                                   " WHERE o.app_id = $1 AND o.key = $2 AND o.topic = 'live'"
                                   "   AND o.position <> ALL($3::bigint[])"
                                   " ORDER BY o.position LIMIT $4");
  conn_->c.prepare("delete_acked", "DELETE FROM events.outbox WHERE position = ANY($1::bigint[])");
}

PartitionStore::~PartitionStore() = default;

int PartitionStore::socket() const { return conn_->c.sock(); }

bool PartitionStore::alive() {
  if (!conn_->c.is_open()) return false;
  pollfd p{conn_->c.sock(), POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return true;  // nothing arrived: an idle connection says nothing
  try {
    conn_->c.get_notifs();  // reads what arrived: an error and the end of the connection
  } catch (const std::exception&) {
    return false;
  }
  return conn_->c.is_open() && (p.revents & (POLLHUP | POLLERR)) == 0;
}

void PartitionStore::join(const std::string& app) {
  pqxx::nontransaction(conn_->c).exec_params(
      "SELECT pg_advisory_lock_shared(events.lock_base($1) | 64)", app);
}

PartitionOwners PartitionStore::owners(const std::string& app) {
  const auto r = pqxx::nontransaction(conn_->c).exec_params(
      "SELECT part, coalesce(owner_pid, 0), members FROM events.partition_owners($1)", app);
  PartitionOwners out;
  out.owner_pid.assign(kPartitions, 0);
  for (const auto& row : r) {
    const int p = row[0].as<int>();
    if (p >= 0 && p < kPartitions) out.owner_pid[p] = row[1].as<int>();
    out.members = row[2].as<int>();
  }
  return out;
}

std::vector<int> PartitionStore::try_acquire(const std::string& app,
                                             const std::vector<int>& partitions) {
  const auto r = pqxx::nontransaction(conn_->c).exec_params(
      "SELECT p FROM unnest($2::int[]) p WHERE pg_try_advisory_lock(events.lock_base($1) | p)", app,
      pg_int_array(partitions));
  std::vector<int> got;
  for (const auto& row : r) got.push_back(row[0].as<int>());
  return got;
}

void PartitionStore::release(const std::string& app, const std::vector<int>& partitions) {
  pqxx::nontransaction(conn_->c).exec_params(
      "SELECT pg_advisory_unlock(events.lock_base($1) | p) FROM unnest($2::int[]) p", app,
      pg_int_array(partitions));
}

ReadResult PartitionStore::read(const std::string& app, int64_t after,
                                const std::vector<int>& partitions,
                                const std::vector<std::string>& skip_keys,
                                const std::vector<int64_t>& known, int max_rows,
                                const Lease* lease) {
  // One round trip; the horizon is taken before the rows' snapshot (sql/003).
  pqxx::nontransaction tx(conn_->c);
  const auto r = lease ? tx.exec_prepared("read_owned", app, after, pg_int_array(partitions),
                                          pg_text_array(skip_keys), pg_int_array(known), max_rows,
                                          lease->member, lease->epoch)
                       : tx.exec_prepared("read_partitions", app, after, pg_int_array(partitions),
                                          pg_text_array(skip_keys), pg_int_array(known), max_rows);
  ReadResult out;
  out.lease_lost = r.empty();  // a read that holds its lease returns at least the horizon row
  for (const auto& row : r) {
    out.handed_out = row[8].as<int64_t>();
    out.xid_bound = row[9].as<uint64_t>();
    out.writers_xmin = row[10].as<uint64_t>();
    if (row[0].is_null()) continue;  // nothing pending: the row only carries the horizon
    out.rows.push_back(pending_row(row));
  }
  return out;
}

std::vector<std::string> PartitionStore::apps_with_rows(const std::vector<std::string>& apps) {
  const auto r =
      pqxx::nontransaction(conn_->c).exec_prepared("apps_with_rows", pg_text_array(apps));
  std::vector<std::string> out;
  for (const auto& row : r) out.push_back(row[0].as<std::string>());
  return out;
}

LeaseRound PartitionStore::lease_round(const std::string& member, const std::string& replica,
                                       const std::vector<std::string>& apps,
                                       std::chrono::milliseconds ttl, int64_t held_epoch,
                                       bool able) {
  const auto r = pqxx::nontransaction(conn_->c).exec_prepared(
      "lease_round", member, replica, pg_text_array(apps), static_cast<int>(ttl.count()),
      held_epoch, able);
  LeaseRound out;
  for (const auto& row : r) {
    out.epoch = row[0].as<int64_t>();
    LeaseMember m{row[1].as<std::string>(), {}, row[3].as<bool>(), row[4].as<int>()};
    const auto joined = row[2].as<std::string>();  // app ids have no ',' ([a-z0-9-])
    for (size_t start = 0; start < joined.size();) {
      const size_t end = std::min(joined.find(',', start), joined.size());
      m.apps.push_back(joined.substr(start, end - start));
      start = end + 1;
    }
    out.live.push_back(std::move(m));
  }
  return out;
}

void PartitionStore::lease_end(const Lease& lease) {
  pqxx::nontransaction(conn_->c).exec_params("SELECT events.lease_end($1, $2)", lease.member,
                                             lease.epoch);
}

std::vector<int> assigned_partitions(const std::vector<LeaseMember>& live, const std::string& app,
                                     const std::string& member) {
  std::vector<const std::string*> serving;
  for (const auto& m : live) {
    if (m.able && std::find(m.apps.begin(), m.apps.end(), app) != m.apps.end())
      serving.push_back(&m.member);
  }
  std::sort(serving.begin(), serving.end(), [](auto* a, auto* b) { return *a < *b; });
  const auto me =
      std::find_if(serving.begin(), serving.end(), [&](auto* m) { return *m == member; });
  std::vector<int> out;
  if (me == serving.end()) return out;
  const int n = static_cast<int>(serving.size());
  const int i = static_cast<int>(me - serving.begin());
  for (int p = i; p < kPartitions; p += n) out.push_back(p);
  return out;
}

ReadResult PartitionStore::read_key(const std::string& app, const std::string& key,
                                    const std::vector<int64_t>& known, int max_rows) {
  const auto r = pqxx::nontransaction(conn_->c).exec_prepared("read_key", app, key,
                                                              pg_int_array(known), max_rows);
  ReadResult out;
  for (const auto& row : r) out.rows.push_back(pending_row(row));
  return out;
}

void PartitionStore::settle(const std::vector<int64_t>& acked,
                            const std::vector<FailedPublish>& failures) {
  if (acked.empty() && failures.empty()) return;
  if (failures.empty()) {  // the usual case: one statement, one round trip
    pqxx::nontransaction(conn_->c).exec_prepared("delete_acked", pg_int_array(acked));
    return;
  }
  pqxx::work tx(conn_->c);
  if (!acked.empty()) tx.exec_prepared("delete_acked", pg_int_array(acked));
  for (const auto& f : failures) {
    tx.exec_params(
        "UPDATE events.outbox SET attempts = attempts + 1, retry_at = now() + $2::interval,"
        " last_error = $3 WHERE position = $1",
        f.position, pg_interval(f.delay), f.error);
  }
  tx.commit();
}

std::vector<WaitingUpdates> PartitionStore::waiting(const std::vector<std::string>& apps,
                                                    std::chrono::milliseconds threshold) {
  const auto rows = pqxx::nontransaction(conn_->c).exec_params(
      "SELECT app_id, count(*), extract(epoch FROM now() - min(created_at))::float8"
      " FROM events.outbox WHERE app_id = ANY($1::text[]) AND created_at < now() - $2::interval"
      " GROUP BY app_id",
      pg_text_array(apps), pg_interval(threshold));
  std::vector<WaitingUpdates> out;
  for (const auto& r : rows)
    out.push_back({r[0].as<std::string>(), r[1].as<int64_t>(), r[2].as<double>()});
  return out;
}

struct WakeConnection::Conn {
  class Receiver : public pqxx::notification_receiver {
   public:
    Receiver(pqxx::connection_base& c, std::vector<std::string>& woken)
        : notification_receiver(c, "outlive_wake"), woken_(woken) {}
    void operator()(const std::string& payload, int) override { woken_.push_back(payload); }

   private:
    std::vector<std::string>& woken_;
  };
  explicit Conn(const std::string& url)
      : c(db::named(db::with_connect_timeout(url, kConnectTimeout), "outlive-wake")),
        receiver(c, woken) {}
  pqxx::connection c;
  std::vector<std::string> woken;
  Receiver receiver;
};

WakeConnection::WakeConnection(const std::string& url) : conn_(std::make_unique<Conn>(url)) {}
WakeConnection::~WakeConnection() = default;

int WakeConnection::socket() const { return conn_->c.sock(); }

std::vector<std::string> WakeConnection::take() {
  conn_->c.get_notifs();
  if (!conn_->c.is_open()) throw std::runtime_error("the wake connection closed");
  return std::exchange(conn_->woken, {});
}

}  // namespace outlive::outbox
