// What a Postgres backend spends on authorize() calls of 500 viewers, by the backend's history:
// the floor (a fresh backend of a server whose malloc never gives memory back), a fresh backend
// of a default server, a pool connection as
// the replica's were (its first statement a check of one viewer) and the same with the pool's heap
// prime (db::PoolOptions::backend_heap_prime). Backend CPU from /proc/<pid>/schedstat, page faults
// from /proc/<pid>/stat: the harness's Postgres runs on this machine.
//
//   build/bench/backend_heap [--rounds 5] [--connections 8]
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <latch>
#include <mutex>
#include <pqxx/pqxx>
#include <string>
#include <thread>

#include "bench/common.hpp"
#include "db/connection.hpp"
#include "db/pool.hpp"
#include "db/typed_query.hpp"
#include "harness/embedded_postgres.hpp"

using namespace outlive;
using namespace std::chrono_literals;

namespace {

constexpr int kViewers = 5000;
constexpr int kBatch = 500;
const char* kAuthorize =
    "SELECT v->>'id' AS id FROM jsonb_array_elements($2) v JOIN members m ON m.key = $1 AND "
    "m.subject = v->>'accessSubject'";

std::string viewers(int from, int count) {
  std::string json = "[";
  for (int i = from; i < from + count; ++i) {
    const std::string id = "user:u" + std::to_string(i);
    json += (i > from ? "," : "") + std::string("{\"id\":\"") + id + "\",\"actor\":\"" + id +
            "\",\"accessSubject\":\"" + id + "\",\"scopes\":[\"read\"]}";
  }
  return json + "]";
}

struct Usage {
  double cpu_ms = 0;
  long faults = 0;
  double wall_ms = 0;
};

Usage usage_of(int pid) {
  Usage u;
  u.cpu_ms = bench::on_cpu_seconds(pid).value_or(0) * 1e3;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string field;
  for (int i = 0; i < 10; ++i) stat >> field;
  u.faults = std::stol(field);
  return u;
}

Usage usage_of(const std::vector<int>& pids) {
  Usage sum;
  for (int pid : pids) {
    const Usage u = usage_of(pid);
    sum.cpu_ms += u.cpu_ms;
    sum.faults += u.faults;
  }
  return sum;
}

// A pool of `connections` whose every connection's first statement is a call of
// `first_viewers`, then 3 warm-up rounds and `rounds` measured ones: every viewer once, in calls of
// 500 posted all at once (as a revocation's checks are). The best round's backend CPU and page
// faults, summed over the pool's backends, and its wall time.
Usage through_pool(const std::string& url, size_t prime, int first_viewers, int connections,
                   int rounds) {
  db::PoolOptions options;
  options.workers = connections;
  options.backend_heap_prime = prime;
  db::Pool pool(url, options);
  std::vector<int> pids;
  std::mutex mutex;
  std::latch everyone_connected(connections);
  const std::string first = viewers(1, first_viewers);
  for (int i = 0; i < connections; ++i) {
    pool.post([&](pqxx::connection& c) {
      db::exec_typed(c, kAuthorize, {"text", "jsonb"}, {"hot", first});
      {
        std::lock_guard lock(mutex);
        pids.push_back(c.backendpid());
      }
      everyone_connected.arrive_and_wait();  // so each of these lands on its own connection
    });
  }
  everyone_connected.wait();
  // The pool primes a backend once its worker finds nothing waiting.
  while (prime > 0 && pool.backends_primed() < static_cast<size_t>(connections))
    std::this_thread::sleep_for(1ms);
  std::vector<std::string> batches;
  for (int from = 1; from <= kViewers; from += kBatch) batches.push_back(viewers(from, kBatch));
  Usage best{1e18, 0};
  for (int r = 0; r < 3 + rounds; ++r) {
    const Usage before = usage_of(pids);
    const auto started = std::chrono::steady_clock::now();
    std::latch done(static_cast<std::ptrdiff_t>(batches.size()));
    for (const auto& b : batches) {
      pool.post([&](pqxx::connection& c) {
        db::exec_typed(c, kAuthorize, {"text", "jsonb"}, {"hot", b});
        done.count_down();
      });
    }
    done.wait();
    const double wall_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
            .count();
    const Usage after = usage_of(pids);
    if (r >= 3 && after.cpu_ms - before.cpu_ms < best.cpu_ms)
      best = {after.cpu_ms - before.cpu_ms, after.faults - before.faults, wall_ms};
  }
  return best;
}

// A connection per statement against one kept: Postgres's CPU for opening a connection, running
// the outbox gauges' kind of statement and closing it (the postmaster's own CPU and its reaped
// children's, /proc/<postmaster>/stat utime+stime+cutime+cstime, so the fork and the backend's
// exit count), against the same statement on a kept connection (its backend's schedstat).
struct ConnectionCost {
  double per_new_connection_ms = 0;
  double per_kept_statement_ms = 0;
};

double postmaster_cpu_ms(int postmaster) {
  std::ifstream stat("/proc/" + std::to_string(postmaster) + "/stat");
  std::string field;
  double ticks = 0;
  for (int i = 1; i <= 17; ++i) {
    stat >> field;
    if (i >= 14) ticks += std::stod(field);
  }
  return ticks * 1e3 / static_cast<double>(sysconf(_SC_CLK_TCK));
}

ConnectionCost connection_cost(const std::string& url, int statements) {
  const char* kStatement = "SELECT count(*) FROM members";
  ConnectionCost cost;
  int postmaster = 0;
  {
    pqxx::connection c(url);
    std::ifstream stat("/proc/" + std::to_string(c.backendpid()) + "/stat");
    std::string field;
    for (int i = 0; i < 4; ++i) stat >> field;
    postmaster = std::stoi(field);
    const double before = usage_of(c.backendpid()).cpu_ms;
    for (int i = 0; i < statements; ++i) pqxx::nontransaction(c).exec(kStatement);
    cost.per_kept_statement_ms = (usage_of(c.backendpid()).cpu_ms - before) / statements;
  }
  std::this_thread::sleep_for(200ms);  // the kept connection's backend exits and is reaped
  const double before = postmaster_cpu_ms(postmaster);
  for (int i = 0; i < statements; ++i) {
    pqxx::connection c(url);
    pqxx::nontransaction(c).exec(kStatement);
  }
  // Reaped when they have exited: wait until the count stops growing.
  double after = postmaster_cpu_ms(postmaster);
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(100ms);
    const double now = postmaster_cpu_ms(postmaster);
    if (now == after && i >= 3) break;
    after = now;
  }
  cost.per_new_connection_ms = (after - before) / statements;
  return cost;
}

double load_average() {
  double load[3] = {0, 0, 0};
  getloadavg(load, 3);
  return load[0];
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  int connections = 8;  // the replica's pool (server.db_pool_size)
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--rounds") rounds = std::max(1, std::atoi(argv[i + 1]));
    if (std::string(argv[i]) == "--connections") connections = std::max(1, std::atoi(argv[i + 1]));
  }
  const double load_before = load_average();
  const auto make_members = [](const std::string& url) {
    pqxx::connection c(url);
    pqxx::nontransaction(c).exec(
        "CREATE TABLE members (key text, subject text, PRIMARY KEY (key, subject)); "
        "INSERT INTO members SELECT 'hot', 'user:u' || i FROM generate_series(1, " +
        std::to_string(kViewers) + ") i");
  };
  // The floor: the same statement in a server whose malloc never gives memory back (glibc's
  // tunables, read when each process starts), so no call pays for mapping memory again.
  Usage floor;
  {
    setenv("GLIBC_TUNABLES",
           "glibc.malloc.trim_threshold=268435456:glibc.malloc.mmap_threshold=33554432", 1);
    harness::EmbeddedPostgres keeping;
    unsetenv("GLIBC_TUNABLES");
    const std::string url = keeping.create_database("heap");
    make_members(url);
    floor = through_pool(url, 0, kBatch, connections, rounds);
  }
  harness::EmbeddedPostgres postgres;
  const std::string url = postgres.create_database("heap");
  make_members(url);
  const Usage first_big = through_pool(url, 0, kBatch, connections, rounds);
  const Usage unprimed = through_pool(url, 0, 1, connections, rounds);
  const Usage primed =
      through_pool(url, db::PoolOptions{}.backend_heap_prime, 1, connections, rounds);
  const ConnectionCost connections_cost = connection_cost(url, 40);
  const double load_after = load_average();

  utsname machine{};
  uname(&machine);
  std::printf("### backend_heap\n\n");
  std::printf("- Machine: %u CPUs, kernel %s; load average (1 min) before / after: %.2f / %.2f%s\n",
              std::thread::hardware_concurrency(), machine.release, load_before, load_after,
              load_after > 1.0 ? " (NOT quiet: no verdict)" : "");
  std::printf(
      "- Each case: a pool of %d connections (as the replica's); per round %d viewers in calls of "
      "%d (the replica's authorize batch) posted at once, as a revocation's checks are, every "
      "viewer a member; backend CPU (/proc/<pid>/schedstat) and page faults summed over the "
      "pool's backends; best of %d rounds after 3 warm-up rounds\n\n",
      connections, kViewers, kBatch, rounds);
  std::printf(
      "| backends | each one's first statement | backend CPU ms per %d viewers | page faults | "
      "ratio to the floor | wall ms |\n",
      kViewers);
  std::printf("|---|---|---:|---:|---:|---:|\n");
  const auto row = [&](const char* name, const char* first, const Usage& u) {
    std::printf("| %s | %s | %.2f | %ld | **%.2fx** | %.1f |\n", name, first, u.cpu_ms, u.faults,
                u.cpu_ms / floor.cpu_ms, u.wall_ms);
  };
  row("floor: a Postgres whose malloc never trims nor unmaps "
      "(`GLIBC_TUNABLES=glibc.malloc.trim_threshold=268435456:glibc.malloc.mmap_threshold="
      "33554432`)",
      "500 viewers", floor);
  row("glibc's defaults, no prime", "500 viewers", first_big);
  row("glibc's defaults, no prime (`server.db_backend_heap_prime_bytes: 0`)", "1 viewer", unprimed);
  row("glibc's defaults, the pool's 4 MiB prime (the default)", "1 viewer", primed);
  std::printf(
      "\nA connection per statement (`SELECT count(*)` of the members, as the outbox gauges "
      "count the outbox; 40 times): **%.1f ms** of Postgres CPU per connection opened, used and "
      "closed (the postmaster's fork and the backend's start and exit included) against %.2f ms "
      "per statement on a kept connection = %.0fx\n",
      connections_cost.per_new_connection_ms, connections_cost.per_kept_statement_ms,
      connections_cost.per_new_connection_ms / connections_cost.per_kept_statement_ms);
  std::printf("\ncommand: build/bench/backend_heap --rounds %d --connections %d\n", rounds,
              connections);
  return 0;
}
