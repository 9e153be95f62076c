// The database pool and typed statements against a real PostgreSQL 15 (started by the harness).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <pqxx/pqxx>
#include <stdexcept>
#include <string>
#include <thread>

#include "db/connection.hpp"
#include "db/pool.hpp"
#include "db/typed_query.hpp"
#include "harness/embedded_postgres.hpp"
#include "harness/process.hpp"
#include "support/services.hpp"

using namespace std::chrono_literals;
using outlive::db::exec_typed;
using outlive::db::exec_typed_batch;
using outlive::db::Pool;
using outlive::db::PoolOptions;

namespace {

// An empty database of the test binary's one PostgreSQL (tests/support): db/ has no migrations.
std::string fresh_database() { return outlive::testing::fresh_database(/*migrated=*/false); }

void exec(const std::string& url, const std::string& sql) {
  pqxx::connection c(url);
  pqxx::nontransaction(c).exec(sql);
}

int prepared_statements(pqxx::connection& c) {
  return pqxx::nontransaction(c)
      .exec("SELECT count(*) FROM pg_prepared_statements")[0][0]
      .as<int>();
}

bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// Holds a pool's only worker until released, so what is posted next waits.
struct Blocker {
  std::promise<void> started, release;
  std::shared_future<void> released = release.get_future().share();
  Pool::Task task() {
    return [this](pqxx::connection&) {
      started.set_value();
      released.wait();
    };
  }
};

// A TCP listener on 127.0.0.1 that never accepts: connects complete (the kernel's backlog) and
// then nothing is ever answered, like a server that hangs.
class SilentServer {
 public:
  explicit SilentServer(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd_, 16) != 0) {
      close(fd_);
      throw std::runtime_error("cannot listen on " + std::to_string(port));
    }
  }
  ~SilentServer() { stop(); }
  void stop() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

}  // namespace

TEST_CASE("typed statements bind jsonb and text parameters") {
  const auto url = fresh_database();
  exec(url,
       "CREATE TABLE members (warehouse_id uuid, subject text);"
       "INSERT INTO members VALUES ('6f1c1a52-7c1e-4c59-9b7e-2f0d3c1a9e01', 'user:ada')");
  pqxx::connection c(url);
  const std::string authorize =
      "SELECT v->>'id' AS id FROM jsonb_array_elements($2) v JOIN members m "
      "ON m.warehouse_id = $1::uuid AND m.subject = v->>'accessSubject'";
  const auto rows = exec_typed(
      c, authorize, {"text", "jsonb"},
      {"6f1c1a52-7c1e-4c59-9b7e-2f0d3c1a9e01", R"([{"id":"user:ada","accessSubject":"user:ada"},)"
                                               R"({"id":"user:bob","accessSubject":"user:bob"}])"});
  REQUIRE(rows.size() == 1);
  CHECK(rows[0][0].as<std::string>() == "user:ada");

  const auto keys =
      exec_typed(c, "SELECT $1->>'warehouse' AS key, $2->>'id' AS viewer", {"jsonb", "jsonb"},
                 {R"({"warehouse":"it's \\ here"})", R"({"id":"x"})"});
  REQUIRE(keys.size() == 1);
  CHECK(keys[0][0].as<std::string>() == "it's \\ here");  // quoting keeps quotes and backslashes
  CHECK(keys[0][1].as<std::string>() == "x");

  CHECK(exec_typed(c, "SELECT 1", {}, {}).size() == 1);
}

TEST_CASE("a PREPARE that failed is tried again on the same connection") {
  const auto url = fresh_database();
  pqxx::connection c(url);
  const std::string sql = "SELECT key FROM later WHERE owner = $1->>'subject'";
  try {
    exec_typed(c, sql, {"jsonb"}, {R"({"subject":"user:ada"})"});
    FAIL("the table does not exist yet");
  } catch (const pqxx::sql_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("later") && Catch::Contains("does not exist"));
  }
  exec(url,
       "CREATE TABLE later (key text, owner text); INSERT INTO later VALUES ('k1', 'user:ada')");
  const auto rows = exec_typed(c, sql, {"jsonb"}, {R"({"subject":"user:ada"})"});
  REQUIRE(rows.size() == 1);
  CHECK(rows[0][0].as<std::string>() == "k1");
  CHECK(prepared_statements(c) == 1);
}

TEST_CASE("the same query and types prepare once per connection") {
  const auto url = fresh_database();
  pqxx::connection c(url);
  pqxx::connection other(url);
  const std::string sql = "SELECT $1::text AS v";
  for (int i = 0; i < 3; ++i) {
    CHECK(exec_typed(c, sql, {"text"}, {std::to_string(i)})[0][0].as<std::string>() ==
          std::to_string(i));
  }
  CHECK(prepared_statements(c) == 1);
  exec_typed(c, sql, {"jsonb"}, {"{}"});  // other types: another statement
  CHECK(prepared_statements(c) == 2);
  // Every connection has its own statements.
  CHECK(exec_typed(other, sql, {"text"}, {"o"})[0][0].as<std::string>() == "o");
  CHECK(prepared_statements(other) == 1);
  CHECK(exec_typed(c, sql, {"text"}, {"again"})[0][0].as<std::string>() == "again");
  CHECK(prepared_statements(c) == 2);
}

TEST_CASE("typed statements heal when Postgres dropped or outdated them") {
  const auto url = fresh_database();
  exec(url, "CREATE TABLE t (a text); INSERT INTO t VALUES ('x')");
  pqxx::connection c(url);
  const std::string sql = "SELECT * FROM t WHERE a = $1";
  CHECK(exec_typed(c, sql, {"text"}, {"x"}).size() == 1);
  pqxx::nontransaction(c).exec("DEALLOCATE ALL");  // as a pooler's DISCARD ALL would
  CHECK(exec_typed(c, sql, {"text"}, {"x"}).size() == 1);
  // A SELECT * whose table gained a column: "cached plan must not change result type".
  exec(url, "ALTER TABLE t ADD COLUMN b int DEFAULT 7");
  const auto rows = exec_typed(c, sql, {"text"}, {"x"});
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].size() == 2);
  CHECK(prepared_statements(c) == 1);
}

TEST_CASE("typed statement errors and refused arguments surface as exceptions") {
  const auto url = fresh_database();
  pqxx::connection c(url);
  CHECK_THROWS_AS(exec_typed(c, "SELECT $1", {"text", "text"}, {"a"}), std::invalid_argument);
  CHECK_THROWS_AS(exec_typed(c, "SELECT $1", {"text); DROP TABLE x; --"}, {"a"}),
                  std::invalid_argument);
  CHECK_THROWS_WITH(exec_typed(c, "SELECT $1::uuid", {"text"}, {"not a uuid"}),
                    Catch::Contains("invalid input syntax for type uuid"));
  CHECK_THROWS_WITH(exec_typed(c, "SELECT $1->>'k'", {"jsonb"}, {"{"}),
                    Catch::Contains("invalid input syntax for type json"));
  // The connection goes on serving.
  CHECK(exec_typed(c, "SELECT $1::text[]", {"text[]"}, {"{a,b}"}).size() == 1);
}

TEST_CASE("a batch of typed statements answers every row, in order, and heals like one") {
  const auto url = fresh_database();
  exec(url,
       "CREATE TABLE t (a text, n int); INSERT INTO t SELECT 'k' || i, i FROM "
       "generate_series(1, 100) i");
  pqxx::connection c(url);
  const std::string sql = "SELECT n FROM t WHERE a = $1";
  std::vector<std::vector<std::string>> rows;
  for (int i = 100; i >= 1; --i) rows.push_back({"k" + std::to_string(i)});
  rows.push_back({"missing"});
  auto results = exec_typed_batch(c, sql, {"text"}, rows);
  REQUIRE(results.size() == 101);
  for (int i = 0; i < 100; ++i) {
    REQUIRE(results[i].size() == 1);
    CHECK(results[i][0][0].as<int>() == 100 - i);
  }
  CHECK(results[100].empty());
  CHECK(prepared_statements(c) == 1);  // one PREPARE for the whole batch
  CHECK(exec_typed_batch(c, sql, {"text"}, {}).empty());

  pqxx::nontransaction(c).exec("DEALLOCATE ALL");
  results = exec_typed_batch(c, sql, {"text"}, {{"k7"}, {"k8"}});
  REQUIRE(results.size() == 2);
  CHECK(results[1][0][0].as<int>() == 8);

  // One failing row fails the call with its error; the connection goes on serving.
  CHECK(
      exec_typed_batch(c, "SELECT 10 / n FROM t WHERE a = $1", {"text"}, {{"k5"}, {"k2"}}).size() ==
      2);
  exec(url, "INSERT INTO t VALUES ('zero', 0)");
  CHECK_THROWS_WITH(exec_typed_batch(c, "SELECT 10 / n FROM t WHERE a = $1", {"text"},
                                     {{"k5"}, {"zero"}, {"k2"}}),
                    Catch::Contains("division by zero"));
  CHECK_THROWS_AS(exec_typed_batch(c, sql, {"text"}, {{"a", "b"}}), std::invalid_argument);
  CHECK(exec_typed_batch(c, sql, {"text"}, {{"k3"}})[0][0][0].as<int>() == 3);
}

TEST_CASE("a reopened connection prepares its statements again") {
  const auto url = fresh_database();
  Pool pool(url, PoolOptions{1, 15s, 2s, 16});
  const std::string sql = "SELECT pg_backend_pid() AS pid, $1::text AS v";
  struct Run {
    bool ok = false;
    int pid = 0;
    int prepared = 0;
  };
  auto run = [&] {
    auto done = std::make_shared<std::promise<Run>>();
    auto result = done->get_future();
    REQUIRE(pool.post([done, &sql](pqxx::connection& c) {
      Run r;
      try {
        r.pid = exec_typed(c, sql, {"text"}, {"v"})[0][0].as<int>();
        r.prepared = prepared_statements(c);
        r.ok = true;
      } catch (const std::exception&) {
      }
      done->set_value(r);
    }));
    REQUIRE(result.wait_for(10s) == std::future_status::ready);
    return result.get();
  };
  const auto first = run();
  REQUIRE(first.ok);
  exec(url, "SELECT pg_terminate_backend(" + std::to_string(first.pid) + ")");
  Run later;
  for (int i = 0; i < 3 && !later.ok; ++i) later = run();  // the first may meet the dead backend
  REQUIRE(later.ok);
  CHECK(later.pid != first.pid);
  CHECK(later.prepared == 1);
}

TEST_CASE("a pool refuses work past max_waiting") {
  const auto url = fresh_database();
  Pool pool(url, PoolOptions{1, 15s, 2s, 2});
  Blocker blocker;
  REQUIRE(pool.post(blocker.task()));
  blocker.started.get_future().wait();
  std::atomic<int> ran{0};
  CHECK(pool.post([&](pqxx::connection&) { ++ran; }));
  CHECK(pool.post([&](pqxx::connection&) { ++ran; }));
  CHECK(pool.waiting() == 2);
  CHECK_FALSE(pool.post([&](pqxx::connection&) { ran += 100; }));
  CHECK(pool.waiting() == 2);
  blocker.release.set_value();
  CHECK(eventually([&] { return ran == 2; }));
  CHECK(pool.waiting() == 0);
  CHECK(pool.post([&](pqxx::connection&) { ++ran; }));  // room again
  CHECK(eventually([&] { return ran == 3; }));
}

TEST_CASE("a pool drops work no longer wanted, and waiting work when it stops") {
  const auto url = fresh_database();
  Pool pool(url, PoolOptions{1, 15s, 2s, 16});
  Blocker blocker;
  REQUIRE(pool.post(blocker.task()));
  blocker.started.get_future().wait();
  std::atomic<bool> open{true};
  std::atomic<int> asked{0}, unwanted_ran{0}, ran{0};
  REQUIRE(pool.post([&](pqxx::connection&) { ++unwanted_ran; },
                    [&] {
                      ++asked;
                      return open.load();
                    }));
  REQUIRE(pool.post([&](pqxx::connection&) { ++ran; }, [] { return true; }));
  open = false;  // its socket closed while it waited
  blocker.release.set_value();
  CHECK(eventually([&] { return ran == 1; }));
  CHECK(asked == 1);
  CHECK(unwanted_ran == 0);

  Blocker second;
  REQUIRE(pool.post(second.task()));
  second.started.get_future().wait();
  for (int i = 0; i < 3; ++i) REQUIRE(pool.post([&](pqxx::connection&) { ++ran; }));
  std::thread stopper([&] { pool.stop(); });
  CHECK(eventually([&] { return pool.waiting() == 0; }));  // dropped at once
  second.release.set_value();
  stopper.join();
  CHECK(ran == 1);
  CHECK_FALSE(pool.post([&](pqxx::connection&) { ++ran; }));
  CHECK_FALSE(pool.healthy());
}

TEST_CASE("a pool gives up connecting after connect_timeout and keeps serving") {
  SECTION("a closed port fails at once") {
    const int port = outlive::harness::free_port();
    Pool pool("postgresql://postgres@127.0.0.1:" + std::to_string(port) + "/postgres",
              PoolOptions{1, 15s, 1s, 16});
    const auto started = std::chrono::steady_clock::now();
    CHECK_FALSE(pool.healthy());
    CHECK(std::chrono::steady_clock::now() - started < 1s);
  }
  SECTION("a server that never answers is given up on, then served once it is up") {
    const int port = outlive::harness::free_port();
    SilentServer silent(port);
    Pool pool("postgresql://postgres@127.0.0.1:" + std::to_string(port) + "/postgres",
              PoolOptions{1, 15s, 1s, 16});
    std::atomic<int> ran{0};
    const auto started = std::chrono::steady_clock::now();
    REQUIRE(pool.post([&](pqxx::connection&) { ++ran; }));
    REQUIRE(pool.post([&](pqxx::connection&) { ++ran; }));
    // The second is taken once the first's connection attempt gave up: libpq's floor is 2 s.
    REQUIRE(eventually([&] { return pool.waiting() == 0; }, 10s));
    const auto attempt = std::chrono::steady_clock::now() - started;
    CHECK(attempt >= 1s);
    CHECK(attempt < 3500ms);
    CHECK(ran == 0);
    silent.stop();
    outlive::harness::PostgresOptions options;
    options.port = port;
    outlive::harness::EmbeddedPostgres server(options);
    CHECK(eventually([&] { return pool.healthy(); }, 20s));
    REQUIRE(pool.post([&](pqxx::connection&) { ++ran; }));
    CHECK(eventually([&] { return ran >= 1; }));
  }
}

TEST_CASE("connect_timeout is added to either form of connection string") {
  using outlive::db::with_connect_timeout;
  CHECK(with_connect_timeout("postgresql://u@h:5/db", 5s) ==
        "postgresql://u@h:5/db?connect_timeout=5");
  CHECK(with_connect_timeout("postgresql://u@h/db?sslmode=disable", 1500ms) ==
        "postgresql://u@h/db?sslmode=disable&connect_timeout=2");
  CHECK(with_connect_timeout("postgres://h/db?", 100ms) == "postgres://h/db?connect_timeout=1");
  CHECK(with_connect_timeout("host=h dbname=db", 3s) == "host=h dbname=db connect_timeout=3");
  CHECK(with_connect_timeout("", 3s) == "connect_timeout=3");
}

TEST_CASE("the pool's connections are named outlive-pool unless the URL names them") {
  const auto url = fresh_database();
  const auto name_seen = [](const std::string& pool_url) {
    Pool pool(pool_url, PoolOptions{1, 15s, 2s, 16});
    std::promise<std::string> name;
    REQUIRE(pool.post([&](pqxx::connection& c) {
      name.set_value(
          pqxx::nontransaction(c).exec1("SELECT current_setting('application_name')")[0].c_str());
    }));
    auto f = name.get_future();
    REQUIRE(f.wait_for(10s) == std::future_status::ready);
    return f.get();
  };
  CHECK(name_seen(url) == "outlive-pool");
  CHECK(name_seen(outlive::db::with_setting(url, "application_name", "mine")) == "mine");
  CHECK(outlive::db::named("host=h", "x") == "host=h fallback_application_name=x");
}

namespace {
// Minor page faults of the backend serving `c` so far (/proc/<pid>/stat, field 10): the harness's
// Postgres runs on this machine.
long backend_page_faults(pqxx::connection& c) {
  std::ifstream stat("/proc/" + std::to_string(c.backendpid()) + "/stat");
  std::string field;
  for (int i = 0; i < 10; ++i) stat >> field;
  return std::stol(field);
}

// The page faults of the pool's backend over 10 authorize()-shaped statements of 500 viewers, run
// after one of a single viewer (as a pool's first check usually is) and 3 more of 500.
long faults_of_big_statements(const std::string& url, size_t heap_prime) {
  exec(url,
       "CREATE TABLE IF NOT EXISTS members (key text, subject text, PRIMARY KEY (key, subject))");
  const auto viewers = [](int n) {
    std::string json = "[";
    for (int i = 0; i < n; ++i) {
      const std::string id = "user:u" + std::to_string(i);
      json += (i ? "," : "") + std::string("{\"id\":\"") + id + "\",\"accessSubject\":\"" + id +
              "\",\"scopes\":[\"read\"]}";
    }
    return json + "]";
  };
  const std::string authorize =
      "SELECT v->>'id' FROM jsonb_array_elements($2) v JOIN members m ON m.key = $1 AND "
      "m.subject = v->>'accessSubject'";
  PoolOptions options{1, 15s, 2s, 16};
  options.backend_heap_prime = heap_prime;
  Pool pool(url, options);
  std::promise<void> first;
  REQUIRE(pool.post([&](pqxx::connection& c) {
    exec_typed(c, authorize, {"text", "jsonb"}, {"k", viewers(1)});
    first.set_value();
  }));
  REQUIRE(first.get_future().wait_for(10s) == std::future_status::ready);
  // Primed once nothing waits (or never, without a prime).
  if (heap_prime > 0) REQUIRE(eventually([&] { return pool.backends_primed() == 1; }));
  std::promise<long> faults;
  REQUIRE(pool.post([&](pqxx::connection& c) {
    for (int i = 0; i < 3; ++i) exec_typed(c, authorize, {"text", "jsonb"}, {"k", viewers(500)});
    const long before = backend_page_faults(c);
    for (int i = 0; i < 10; ++i) exec_typed(c, authorize, {"text", "jsonb"}, {"k", viewers(500)});
    faults.set_value(backend_page_faults(c) - before);
  }));
  auto f = faults.get_future();
  REQUIRE(f.wait_for(20s) == std::future_status::ready);
  return f.get();
}
}  // namespace

TEST_CASE("a pool's backends keep the memory of big statements instead of mapping it each time") {
  // glibc's malloc in a backend gives back memory freed at the top of its heap beyond 128 KiB
  // until the process frees a block it mmap()ed; the pool frees one of 4 MiB once a new
  // connection's worker finds nothing waiting.
  const auto url = fresh_database();
  const long primed = faults_of_big_statements(url, 4 << 20);
  const long unprimed = faults_of_big_statements(url, 0);
  INFO("page faults over 10 statements: primed " << primed << ", unprimed " << unprimed);
  CHECK(primed < 60);
  // The control: without the prime the backend maps fresh pages for every statement (were this to
  // stop failing, glibc no longer needs the prime).
  CHECK(unprimed > 150);
}

TEST_CASE("a pool primes a backend only when nothing waits, and again after reconnecting") {
  const auto url = fresh_database();
  PoolOptions options{1, 15s, 2s, 64};
  Pool pool(url, options);
  Blocker blocker;
  REQUIRE(pool.post(blocker.task()));
  blocker.started.get_future().wait();
  // A burst waits behind the running task: none of it waits for a prime.
  std::atomic<int> ran{0};
  std::atomic<size_t> primed_while_busy{0};
  for (int i = 0; i < 20; ++i) {
    REQUIRE(pool.post([&](pqxx::connection&) {
      primed_while_busy = std::max(primed_while_busy.load(), pool.backends_primed());
      ++ran;
    }));
  }
  blocker.release.set_value();
  REQUIRE(eventually([&] { return ran == 20; }));
  CHECK(primed_while_busy == 0);
  REQUIRE(eventually([&] { return pool.backends_primed() == 1; }));
  // A lost connection is reopened, and its new backend primed.
  REQUIRE(pool.post([](pqxx::connection& c) {
    try {
      pqxx::nontransaction(c).exec("SELECT pg_terminate_backend(pg_backend_pid())");
    } catch (const std::exception&) {
    }
  }));
  std::promise<void> reopened;
  REQUIRE(eventually([&] { return pool.waiting() == 0; }));
  REQUIRE(pool.post([&](pqxx::connection&) { reopened.set_value(); }));
  REQUIRE(reopened.get_future().wait_for(10s) == std::future_status::ready);
  CHECK(eventually([&] { return pool.backends_primed() == 2; }));
}
