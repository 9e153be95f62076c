// The idle cost of ownership (issue 33): 80 apps x 2 replicas on a Postgres with the default
// max_connections (100) and lock table, nothing written. Postgres's CPU is read from /proc for
// every process of the instance (the postmaster and its children) over 10 s.
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <csignal>
#include <fstream>
#include <sstream>

#include "fixtures.hpp"
#include "outbox/migrate.hpp"
#include "outbox/partitions.hpp"

using namespace outlive;
using namespace outlive::testing;
using namespace std::chrono_literals;

namespace {

// utime + stime of `pid` in clock ticks, and its parent; false when it is gone.
bool cpu_of(int pid, long& ticks, int& parent) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return false;
  const auto close = line.rfind(')');  // the command may hold spaces and parentheses
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  std::vector<std::string> f;
  while (rest >> field) f.push_back(field);
  if (f.size() < 13) return false;
  parent = std::stoi(f[1]);                     // field 4
  ticks = std::stol(f[11]) + std::stol(f[12]);  // fields 14 and 15
  return true;
}

// CPU seconds used so far by the postmaster `root` and its children.
double instance_cpu_seconds(int root) {
  long total = 0, ticks = 0;
  int parent = 0;
  if (cpu_of(root, ticks, parent)) total += ticks;
  DIR* d = ::opendir("/proc");
  while (dirent* e = ::readdir(d)) {
    const int pid = std::atoi(e->d_name);
    if (pid > 0 && pid != root && cpu_of(pid, ticks, parent) && parent == root) total += ticks;
  }
  ::closedir(d);
  return static_cast<double>(total) / ::sysconf(_SC_CLK_TCK);
}

int postmaster_pid(const std::string& data_dir) {
  std::ifstream in(data_dir + "/data/postmaster.pid");  // the harness initdbs into <dir>/data
  int pid = 0;
  in >> pid;
  return pid;
}

// Per app: how many distinct replicas own its partitions, and whether all 64 are owned.
std::map<std::string, int> owners_per_app(const std::string& url,
                                          const std::vector<std::string>& apps) {
  pqxx::connection c(url);
  std::map<std::string, int> out;
  for (const auto& r : pqxx::nontransaction(c).exec_params(
           "SELECT a, count(DISTINCT o.owner_pid), count(o.owner_pid)"
           "  FROM unnest($1::text[]) a, events.partition_owners(a) o GROUP BY a",
           outbox::pg_text_array(apps))) {
    out[r[0].as<std::string>()] = r[2].as<int>() == 64 ? r[1].as<int>() : 0;
  }
  return out;
}

bool every_app_owned_by(const std::string& url, const std::vector<std::string>& apps, int n) {
  const auto owners = owners_per_app(url, apps);
  if (owners.size() != apps.size()) return false;
  for (const auto& [_, count] : owners) {
    if (count != n) return false;
  }
  return true;
}

}  // namespace

TEST_CASE(
    "80 apps x 2 idle replicas cost Postgres under 0.05 CPU-s per second, and a third "
    "replica takes a share of every app") {
  harness::PostgresOptions options;
  options.max_connections = 100;  // Postgres's default, and with it the default lock table
  options.data_dir = harness::make_temp_dir("outlive-idle-pg-");
  harness::EmbeddedPostgres pg(options);
  const std::string db = pg.create_database("idle");
  outbox::migrate(db);
  harness::EmbeddedNats nats;
  std::vector<std::string> apps;
  for (int i = 0; i < 80; ++i) apps.push_back("app" + std::to_string(i));
  ReplicaProcess r1(write_config(db, {nats.url()}, "r1", apps), "r1");
  ReplicaProcess r2(write_config(db, {nats.url()}, "r2", apps), "r2");
  const bool shared = eventually([&] { return every_app_owned_by(db, apps, 2); }, 60s, 200ms);
  INFO(r1.log_tail() << r2.log_tail());
  REQUIRE(shared);
  std::this_thread::sleep_for(3s);  // the start's own work (streams, first reads) settles

  const int root = postmaster_pid(options.data_dir);
  REQUIRE(root > 0);
  const double before = instance_cpu_seconds(root);
  const auto start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(10s);  // the measurement window: nothing written
  const double used = instance_cpu_seconds(root) - before;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double per_second = used / seconds;
  WARN("Postgres CPU with 80 apps x 2 idle replicas: " << per_second << " CPU-s per second");
  CHECK(per_second < 0.05);
  {
    pqxx::connection c(db);
    const int locks = pqxx::nontransaction(c)
                          .exec("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")[0][0]
                          .as<int>();
    CHECK(locks == 0);  // nothing held per app or per partition
  }

  // Every app delivers: one update each.
  {
    pqxx::connection c(db);
    pqxx::work tx(c);
    for (const auto& app : apps)
      tx.exec_params("SELECT events.publish_live($1, 'k', jsonb_build_object('n', 1))", app);
    tx.commit();
  }
  topic::Client client({nats.url()}, "test-reader");
  const bool delivered = eventually(
      [&] {
        if (outbox_count(db) != 0) return false;
        for (const auto& app : apps) {
          if (stream_messages(client, app) != 1) return false;
        }
        return true;
      },
      30s, 100ms);
  REQUIRE(delivered);

  ReplicaProcess r3(write_config(db, {nats.url()}, "r3", apps), "r3");
  const bool three = eventually([&] { return every_app_owned_by(db, apps, 3); }, 60s, 200ms);
  INFO(r3.log_tail());
  CHECK(three);
  CHECK(r1.process().running());
  CHECK(r2.process().running());
  CHECK(r3.process().running());

  // SPEC 6: SIGTERM exits 0 within 10 s, 80 apps or one (issue 33: 80 apps exited 1 after 10 s,
  // their topic readers stopped one after another); the others take its partitions at once.
  const auto term = std::chrono::steady_clock::now();
  ::kill(r1.process().pid(), SIGTERM);
  const auto status = r1.process().wait_for(15s);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - term).count();
  WARN("a replica of 80 apps stopped " << took << " s after SIGTERM");
  INFO(r1.log_tail());
  REQUIRE(status.has_value());
  CHECK(WIFEXITED(*status));
  CHECK(WEXITSTATUS(*status) == 0);
  CHECK(took < 10.0);
  CHECK(eventually([&] { return every_app_owned_by(db, apps, 2); }, 5s, 100ms));
}
