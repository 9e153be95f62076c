// The owner's reads by position against real PostgreSQL (outbox::PartitionStore and
// publisher::Horizon, sql/004 events.read_horizon): a row that commits after a later position was
// read is still read, and a long transaction that never writes to the outbox holds no cursor back.
#include <catch2/catch.hpp>
#include <numeric>

#include "fixtures.hpp"
#include "outbox/partitions.hpp"
#include "publisher/horizon.hpp"

using namespace outlive;
using namespace outlive::testing;

namespace {

const char* kApp = "horizon";

std::vector<int> all_partitions() {
  std::vector<int> p(outbox::kPartitions);
  std::iota(p.begin(), p.end(), 0);
  return p;
}

int64_t enqueue(pqxx::transaction_base& tx, const std::string& key) {
  return tx
      .exec_params1(
          "SELECT events.enqueue(gen_random_uuid(), $1, 'live', $2,"
          " jsonb_build_object('v', 1, 'k', $2::text, 'd', '{}'::jsonb))",
          kApp, key)[0]
      .as<int64_t>();
}

int64_t enqueue_committed(pqxx::connection& c, const std::string& key) {
  pqxx::work tx(c);
  const auto position = enqueue(tx, key);
  tx.commit();
  return position;
}

// One owner's read from its cursor, as the publisher does it; returns the positions read.
std::vector<int64_t> read_once(outbox::PartitionStore& store, publisher::Horizon& h,
                               const std::vector<int64_t>& known = {}) {
  const auto r = store.read(kApp, h.cursor(), all_partitions(), {}, known, 100);
  h.advance(r, r.rows.empty() ? 0 : r.rows.back().position, false);
  std::vector<int64_t> positions;
  for (const auto& row : r.rows) positions.push_back(row.position);
  return positions;
}

}  // namespace

TEST_CASE("a row that commits after a later position was read is read once it commits") {
  const std::string db = fresh_database();
  outbox::PartitionStore store(db);
  publisher::Horizon h;
  pqxx::connection slow_conn(db), fast_conn(db);

  pqxx::work slow(slow_conn);
  const int64_t early = enqueue(slow, "slow");  // handed out first, committed last
  const int64_t late = enqueue_committed(fast_conn, "fast");
  REQUIRE(early < late);

  CHECK(read_once(store, h) == std::vector<int64_t>{late});
  CHECK(h.cursor() < early);
  for (int i = 0; i < 3; ++i) {
    CHECK(read_once(store, h, {late}).empty());
    CHECK(h.cursor() < early);  // its writer is still running
  }
  slow.commit();
  CHECK(read_once(store, h, {late}) == std::vector<int64_t>{early});
  read_once(store, h, {late, early});
  CHECK(h.cursor() >= late);
}

TEST_CASE("a long transaction that never writes to the outbox holds no cursor back") {
  const std::string db = fresh_database();
  outbox::PartitionStore store(db);
  publisher::Horizon h;
  pqxx::connection long_conn(db), writer(db);

  // A transaction with an id that reads the outbox and runs on: a batch job, a slow authorize().
  pqxx::work long_tx(long_conn);
  long_tx.exec("SELECT pg_current_xact_id()");
  long_tx.exec("SELECT count(*) FROM events.outbox");

  std::vector<int64_t> written;
  for (const char* key : {"a", "b", "c"}) written.push_back(enqueue_committed(writer, key));
  CHECK(read_once(store, h) == written);
  read_once(store, h, written);
  CHECK(h.cursor() >= written.back());

  // The same transaction once it writes to the outbox: from then on it holds the cursor.
  const int64_t held = enqueue(long_tx, "held");
  const int64_t after = enqueue_committed(writer, "d");
  read_once(store, h, written);
  read_once(store, h, written);
  CHECK(h.cursor() < held);
  long_tx.commit();
  auto positions = read_once(store, h, written);
  CHECK(std::count(positions.begin(), positions.end(), held) == 1);
  CHECK(std::count(positions.begin(), positions.end(), after) == 1);
  written.push_back(held);
  written.push_back(after);
  read_once(store, h, written);
  CHECK(h.cursor() >= after);
}

TEST_CASE("reads by position take no transaction id, with a writer running or not") {
  const std::string db = fresh_database();
  outbox::PartitionStore store(db);
  publisher::Horizon h;
  pqxx::connection probe(db), writer_conn(db);
  // Ids are taken in order and every one taken ends, so the first id not yet ended moves by one for
  // each id a read would take (sql/003 took one per read).
  const auto first_not_ended = [&] {
    return pqxx::nontransaction(probe)
        .exec1("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")[0]
        .as<int64_t>();
  };
  const int64_t committed = enqueue_committed(writer_conn, "a");
  const int64_t before = first_not_ended();
  for (int i = 0; i < 50; ++i) read_once(store, h, {committed});
  pqxx::work writer(writer_conn);
  const int64_t pending = enqueue(writer, "b");
  for (int i = 0; i < 50; ++i) CHECK(read_once(store, h, {committed, pending}).empty());
  CHECK(h.cursor() < pending);  // its writer is still running
  const int64_t after = first_not_ended();
  INFO("first id not ended: " << before << " before 100 reads, " << after << " after");
  CHECK(after - before < 5);
  writer.commit();
  CHECK(read_once(store, h, {committed}) == std::vector<int64_t>{pending});
  read_once(store, h, {committed, pending});
  CHECK(h.cursor() >= pending);
}
