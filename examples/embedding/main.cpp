// notes_app: the smallest embedding. The app's own note service decides who reads a note; the
// channel "note" asks it through keys() and authorize(), in this process. The app writes an update
// of note "welcome" every 200 ms with the writer API, and prints its port and a cursor read first
// (as server-side rendering would) so a client can subscribe from it.
//
//   notes_app DATABASE_URL NATS_URL   (the database migrated with `outlive migrate`)
#include <chrono>
#include <csignal>
#include <iostream>
#include <map>
#include <mutex>
#include <outlive/outlive.hpp>
#include <set>
#include <thread>

namespace {

// The application's own service: which subjects may read which note.
class NoteService {
 public:
  bool exists(const std::string& note) const {
    std::lock_guard lock(mutex_);
    return readers_.count(note) > 0;
  }
  bool may_read(const std::string& note, const std::string& subject) const {
    std::lock_guard lock(mutex_);
    auto it = readers_.find(note);
    return it != readers_.end() && it->second.count(subject) > 0;
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::set<std::string>> readers_{{"welcome", {"user:ada"}}};
};

volatile std::sig_atomic_t stop_requested = 0;

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: notes_app DATABASE_URL NATS_URL\n";
    return 2;
  }
  const std::string database = argv[1], nats = argv[2];
  std::signal(SIGTERM, [](int) { stop_requested = 1; });
  std::signal(SIGINT, [](int) { stop_requested = 1; });
  try {
    {  // the app's sessions table, which the replica's credential query reads
      pqxx::connection conn(database);
      pqxx::work tx(conn);
      tx.exec(
          "CREATE SCHEMA IF NOT EXISTS notes; CREATE TABLE IF NOT EXISTS notes.sessions "
          "(token text PRIMARY KEY, subject text NOT NULL)");
      tx.exec(
          "INSERT INTO notes.sessions VALUES (encode(sha256('ada-token'), 'hex'), 'user:ada') "
          "ON CONFLICT DO NOTHING");
      tx.commit();
    }
    NoteService notes;
    outlive::CodeChannel note;
    note.app = "notes";
    note.name = "note";
    note.scope = {{"type", "object"},
                  {"properties", {{"note", {{"type", "string"}}}}},
                  {"required", {"note"}}};
    note.keys = outlive::blocking_keys(
        [&notes](const nlohmann::json& scope, const nlohmann::json&) -> outlive::KeysResult {
          const std::string id = scope["note"];
          if (!notes.exists(id)) return std::nullopt;
          return std::vector<std::string>{"note:" + id};
        });
    note.authorize = outlive::blocking_authorize(
        [&notes](const std::string& key, const nlohmann::json& viewers) {
          outlive::AllowedViewers allowed;
          for (const auto& v : viewers) {
            if (notes.may_read(key.substr(5), v["accessSubject"])) allowed.push_back(v["id"]);
          }
          return allowed;
        });
    const nlohmann::json config = {
        {"listen", "127.0.0.1:0"},
        {"database", database},
        {"nats", {nats}},
        {"publisher", {{"poll_ms", 100}}},
        {"auth",
         {{"sessions",
           "SELECT subject, subject AS actor, NULL::text[] AS scopes, false AS app_session "
           "FROM notes.sessions WHERE token = $1"}}},
        {"apps", {{"notes", {{"allowed_origins", {"http://localhost:8080"}}}}}}};
    outlive::Replica replica(config, {note});

    outlive::LiveDefinition live("notes", {{"type", "object"}});
    live.use_topic({nats});
    std::cout << "cursor=" << live.cursor() << "\nport=" << replica.port() << std::endl;

    pqxx::connection conn(database);
    for (int n = 1; !stop_requested; ++n) {
      pqxx::work tx(conn);
      live.publish(tx, {"note:welcome", {{"n", n}}});
      tx.commit();
      live.wake(conn);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    replica.stop();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "notes_app: " << e.what() << "\n";
    return 1;
  }
}
