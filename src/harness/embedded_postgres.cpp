#include "harness/embedded_postgres.hpp"

#include <libpq-fe.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "common/error.hpp"

namespace outlive::harness {
namespace {

std::optional<RunAs> postgres_user_if_root() {
  if (geteuid() != 0) return std::nullopt;
  const passwd* pw = getpwnam("postgres");
  if (pw == nullptr) throw Error(Errc::internal, "running as root but there is no 'postgres' user");
  return RunAs{pw->pw_uid, pw->pw_gid};
}

std::string conninfo(int port, const std::string& db) {
  return "host=127.0.0.1 port=" + std::to_string(port) + " user=postgres dbname=" + db +
         " connect_timeout=2";
}

// initdb takes seconds; tests start many servers. One initdb'd cluster per machine and server
// version is kept in the temp dir and copied (it is made in a private dir, then renamed into place,
// so concurrent test processes never see half of one).
std::string cluster_template(const std::string& bin, const std::optional<RunAs>& run_as) {
  const char* base = std::getenv("TMPDIR");
  const std::string root = std::string(base && *base ? base : "/tmp");
  const std::string version = std::filesystem::path(bin).parent_path().filename().string();
  const std::string target =
      root + "/outlive-pg-template-" + version + "-" + std::to_string(geteuid());
  if (std::filesystem::exists(target + "/PG_VERSION")) return target;
  const std::string work = make_temp_dir("outlive-pg-initdb-");
  if (run_as) (void)chown(work.c_str(), run_as->uid, run_as->gid);
  const std::string data = work + "/data";
  run_checked({bin + "/initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8",
               "--locale=C", "--no-sync", "--no-instructions"},
              work + "/initdb.log", run_as);
  std::error_code ec;
  std::filesystem::rename(data, target, ec);  // fails harmlessly when another process won the race
  remove_tree(work);
  if (!std::filesystem::exists(target + "/PG_VERSION")) {
    throw Error(Errc::internal, "could not prepare the PostgreSQL template cluster in " + target);
  }
  return target;
}

void copy_cluster(const std::string& from, const std::string& to,
                  const std::optional<RunAs>& run_as) {
  std::filesystem::copy(from, to, std::filesystem::copy_options::recursive);
  if (run_as) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(to)) {
      (void)lchown(entry.path().c_str(), run_as->uid, run_as->gid);
    }
    (void)chown(to.c_str(), run_as->uid, run_as->gid);
  }
  std::filesystem::permissions(to, std::filesystem::perms::owner_all,
                               std::filesystem::perm_options::replace);
}

}  // namespace

std::string postgres_bin_dir() {
  for (const char* dir : {"/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin"}) {
    if (std::filesystem::exists(std::string(dir) + "/initdb")) return dir;
  }
  throw Error(Errc::internal, "PostgreSQL server binaries not found (apt-get install postgresql)");
}

EmbeddedPostgres::EmbeddedPostgres(PostgresOptions options) : options_(std::move(options)) {
  const auto run_as = postgres_user_if_root();
  const std::string bin = postgres_bin_dir();
  owns_dir_ = options_.data_dir.empty();
  dir_ = owns_dir_ ? make_temp_dir("outlive-pg-") : options_.data_dir;
  std::filesystem::create_directories(dir_);
  if (run_as) {
    if (chown(dir_.c_str(), run_as->uid, run_as->gid) != 0) {
      throw Error(Errc::internal, "cannot chown " + dir_ + " to postgres");
    }
  }
  chmod(dir_.c_str(), 0700);
  const std::string data = dir_ + "/data";
  const std::string log = dir_ + "/postgres.log";
  if (!std::filesystem::exists(data + "/PG_VERSION")) {
    if (options_.durable) {
      run_checked({bin + "/initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8",
                   "--locale=C", "--no-sync", "--no-instructions"},
                  dir_ + "/initdb.log", run_as);
    } else {
      copy_cluster(cluster_template(bin, run_as), data, run_as);
    }
  }
  for (int attempt = 0;; ++attempt) {
    port_ = options_.port != 0 ? options_.port : free_port();
    std::vector<std::string> argv = {bin + "/postgres",
                                     "-D",
                                     data,
                                     "-p",
                                     std::to_string(port_),
                                     "-k",
                                     dir_,
                                     "-c",
                                     "listen_addresses=127.0.0.1",
                                     "-c",
                                     "max_connections=" + std::to_string(options_.max_connections),
                                     "-c",
                                     "shared_buffers=128MB"};
    if (!options_.durable) {
      for (const char* opt : {"fsync=off", "synchronous_commit=off", "full_page_writes=off"}) {
        argv.insert(argv.end(), {"-c", opt});
      }
    }
    server_ = ChildProcess(argv, log, run_as);
    try {
      wait_ready();
      return;
    } catch (const Error&) {
      server_.stop(SIGKILL);
      if (attempt >= 2 || options_.port != 0) throw;  // a fixed port cannot be retried
    }
  }
}

void EmbeddedPostgres::wait_ready() {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  const std::string info = conninfo(port_, "postgres");
  while (std::chrono::steady_clock::now() < deadline) {
    if (!server_.running()) {
      throw Error(Errc::internal,
                  "postgres exited at start:\n" + tail_of_file(dir_ + "/postgres.log"));
    }
    if (PQping(info.c_str()) == PQPING_OK) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  throw Error(Errc::timeout, "postgres did not accept connections within 30 s:\n" +
                                 tail_of_file(dir_ + "/postgres.log"));
}

std::string EmbeddedPostgres::url(const std::string& database) const {
  return "postgresql://postgres@127.0.0.1:" + std::to_string(port_) + "/" + database;
}

std::string EmbeddedPostgres::create_database(const std::string& name) {
  PGconn* conn = PQconnectdb(conninfo(port_, "postgres").c_str());
  const std::string sql = "CREATE DATABASE \"" + name + "\"";
  PGresult* res = PQexec(conn, sql.c_str());
  const bool ok = PQresultStatus(res) == PGRES_COMMAND_OK;
  const std::string err = ok ? "" : PQerrorMessage(conn);
  PQclear(res);
  PQfinish(conn);
  if (!ok) throw Error(Errc::database, "create database " + name + ": " + err);
  return url(name);
}

void EmbeddedPostgres::stop() {
  server_.stop(SIGINT, std::chrono::seconds(10));  // fast shutdown
  if (owns_dir_ && !dir_.empty()) remove_tree(dir_);
  dir_.clear();
}

EmbeddedPostgres::~EmbeddedPostgres() { stop(); }

}  // namespace outlive::harness
