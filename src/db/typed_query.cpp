#include "db/typed_query.hpp"

#include <atomic>
#include <cctype>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

namespace outlive::db {
namespace {

// The statements prepared on each connection, keyed by its address and checked against its
// backend pid: a reopened connection (pqxx 6 reconnects on its own) has none of them.
struct Statements {
  int pid = 0;
  std::unordered_map<std::string, std::string> names;  // types + sql -> statement name
};

struct Registry {
  std::mutex mutex;
  std::unordered_map<const pqxx::connection*, Statements> connections;
  // Process-wide, so a name is never reused on a connection even when its bookkeeping was
  // dropped (below): preparing again then costs a statement, never "already exists".
  std::atomic<uint64_t> counter{0};
};

Registry& registry() {
  static Registry r;
  return r;
}

// Connections that are gone leave their entry behind (pqxx cannot tell us); past this many an
// entry is dropped, at worst making a live connection prepare again.
constexpr size_t kMaxConnections = 1024;

std::string known(const pqxx::connection& conn, int pid, const std::string& key) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.connections.find(&conn);
  if (it == r.connections.end()) return {};
  if (it->second.pid != pid) {
    it->second = Statements{pid, {}};
    return {};
  }
  auto s = it->second.names.find(key);
  return s == it->second.names.end() ? std::string() : s->second;
}

void remember(const pqxx::connection& conn, int pid, const std::string& key,
              const std::string& name) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.connections.find(&conn);
  if (it == r.connections.end()) {
    if (r.connections.size() >= kMaxConnections) r.connections.erase(r.connections.begin());
    it = r.connections.emplace(&conn, Statements{pid, {}}).first;
  } else if (it->second.pid != pid) {
    it->second = Statements{pid, {}};
  }
  it->second.names[key] = name;
}

void forget(const pqxx::connection& conn, const std::string& key) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.connections.find(&conn);
  if (it != r.connections.end()) it->second.names.erase(key);
}

// Type names are written into the PREPARE, so only what a type name can hold is let through.
void check_type(const std::string& type) {
  bool ok = !type.empty() && (std::isalpha(static_cast<unsigned char>(type[0])) || type[0] == '_');
  for (char c : type) {
    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ' ' || c == '.' ||
                c == '[' || c == ']');
  }
  if (!ok) throw std::invalid_argument("not a parameter type: \"" + type + "\"");
}

// The statement's name on `conn`, prepared now when it is not yet (or no longer) there.
std::string prepared(pqxx::connection& conn, pqxx::transaction_base& tx, const std::string& key,
                     const std::string& sql, const std::vector<std::string>& types) {
  const int pid = conn.backendpid();  // after tx: pqxx may have reconnected
  std::string name = known(conn, pid, key);
  if (!name.empty()) return name;
  std::string list;
  for (const auto& t : types) {
    check_type(t);
    list += (list.empty() ? "" : ", ") + t;
  }
  name = "outlive_typed_" + std::to_string(++registry().counter);
  tx.exec("PREPARE " + name + (list.empty() ? "" : "(" + list + ")") + " AS " + sql);
  remember(conn, pid, key, name);
  return name;
}

std::string execute_call(pqxx::transaction_base& tx, const std::string& name,
                         const std::vector<std::string>& params) {
  std::string call = "EXECUTE " + name;
  for (size_t i = 0; i < params.size(); ++i) call += (i ? ", " : "(") + tx.quote(params[i]);
  if (!params.empty()) call += ")";
  return call;
}

std::string statement_key(const std::string& sql, const std::vector<std::string>& types) {
  std::string key;
  for (const auto& t : types) key += t + ",";
  return key + "\n" + sql;
}

void check_counts(const char* what, const std::vector<std::string>& types,
                  const std::vector<std::string>& params) {
  if (types.size() != params.size()) {
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(types.size()) +
                                " types for " + std::to_string(params.size()) + " parameters");
  }
}

// 26000: the statement is gone (a DISCARD ALL, or a reused pid's fresh backend). 0A000: "cached
// plan must not change result type", a table changed under it. Both heal by preparing again, once.
bool heals_by_preparing_again(const pqxx::sql_error& e) {
  return e.sqlstate() == "26000" || e.sqlstate() == "0A000";
}

}  // namespace

pqxx::result exec_typed(pqxx::connection& conn, const std::string& sql,
                        const std::vector<std::string>& types,
                        const std::vector<std::string>& params) {
  check_counts("exec_typed", types, params);
  const std::string key = statement_key(sql, types);
  for (int attempt = 0;; ++attempt) {
    pqxx::nontransaction tx(conn);
    const std::string name = prepared(conn, tx, key, sql, types);
    try {
      return tx.exec(execute_call(tx, name, params));
    } catch (const pqxx::sql_error& e) {
      if (attempt > 0 || !heals_by_preparing_again(e)) throw;
      forget(conn, key);
      if (e.sqlstate() != "26000") tx.exec("DEALLOCATE " + name);
    }
  }
}

std::vector<pqxx::result> exec_typed_batch(pqxx::connection& conn, const std::string& sql,
                                           const std::vector<std::string>& types,
                                           const std::vector<std::vector<std::string>>& rows) {
  for (const auto& params : rows) check_counts("exec_typed_batch", types, params);
  std::vector<pqxx::result> out;
  if (rows.empty()) return out;
  const std::string key = statement_key(sql, types);
  for (int attempt = 0;; ++attempt) {
    pqxx::nontransaction tx(conn);
    const std::string name = prepared(conn, tx, key, sql, types);
    try {
      pqxx::pipeline pipe(tx);
      pipe.retain(static_cast<int>(rows.size()));  // all of them in one round trip
      std::vector<pqxx::pipeline::query_id> ids;
      ids.reserve(rows.size());
      for (const auto& params : rows) ids.push_back(pipe.insert(execute_call(tx, name, params)));
      pipe.resume();
      out.reserve(rows.size());
      for (auto id : ids) out.push_back(pipe.retrieve(id));
      pipe.complete();
      return out;
    } catch (const pqxx::sql_error& e) {
      out.clear();
      if (attempt > 0 || !heals_by_preparing_again(e)) throw;
      forget(conn, key);
      if (e.sqlstate() != "26000") tx.exec("DEALLOCATE " + name);
    }
  }
}

}  // namespace outlive::db
