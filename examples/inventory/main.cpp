// inventory_demo: a small application that writes live updates with outlive's C++ writer API the
// way SPEC 2.2 / 2.3 says applications do, and serves the page that reads them.
//
//   inventory_demo --listen 127.0.0.1:PORT --database URL --nats URL[,URL] --static DIR
//                  [--client clients/js/outlive.js] [--event-schema schemas/inventory.event.json]
//                  [--auth jwt --jwt-issuer ISS --jwt-audience AUD]
//
// With --auth jwt the live sockets authenticate with a JWT the app signs (token_issuer.hpp) instead
// of the session cookie: the app is the replicas' JWKS endpoint (auth.jwt.jwks_url) and hands the
// signed-in page short-lived tokens. The app's own routes keep the session cookie either way.
//
// Routes (the gateway sends /api/<app>/live and /api/<app>/live/cursor to the replicas instead):
//   GET  /  /app.js  /style.css           the page (from --static)
//   GET  /outlive.js                      the browser client (clients/js/outlive.js)
//   GET  /healthz
//   POST /api/signin                      a session for the demo user ada (cookie `session`)
//   POST /api/signout
//   GET  /api/me                          {"subject"} or 401 (--auth jwt: and "socketAuth":"jwt")
//   POST /api/token                       --auth jwt: {"token","expiresIn"}, for the signed-in user
//   GET  /.well-known/jwks.json           --auth jwt: the public key the tokens verify with
//   GET  /api/warehouses                  {"cursor", "warehouses"}: the warehouses I can read
//   GET  /api/warehouses/<public_id>      {"cursor", "warehouse", "items"}: cursor read FIRST
//   POST /api/items/<short_id>/quantity   {"quantity": n}: C++ API publish() in the transaction
//   POST /api/items/<short_id>/name       {"name": s}: the trigger path (events.enqueue)
//   POST /api/warehouses/<public_id>/members/remove|add  {"subject"}: publish_access()
#include <signal.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <pqxx/pqxx>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "common/log.hpp"
#include "outbox/live.hpp"
#include "services.hpp"
#include "token_issuer.hpp"
#include "topic/client.hpp"
#include "web.hpp"

#ifndef OUTLIVE_SOURCE_DIR
#define OUTLIVE_SOURCE_DIR "."
#endif

namespace {

using inventory::web::Request;
using inventory::web::Response;
using nlohmann::json;

constexpr const char* kApp = "inventory";
constexpr const char* kDemoSubject = "user:ada";
constexpr const char* kSessionCookie = "session";
// id_prefix of the replicas' auth.jwt: the token's `sub` is the subject without it.
constexpr std::string_view kJwtIdPrefix = "user:";
// Short, so the page shows the refresh (auth_expiring, 30 s before exp) every few minutes.
constexpr std::chrono::seconds kTokenLifetime{300};

const char* kUsage =
    "usage: inventory_demo --listen HOST:PORT --database URL --nats URL[,URL...] --static DIR\n"
    "                      [--client FILE] [--event-schema FILE]\n"
    "                      [--auth session|jwt] [--jwt-issuer ISS] [--jwt-audience AUD]\n";

// A few Postgres connections shared by the request threads.
class ConnectionPool {
 public:
  explicit ConnectionPool(std::string url) : url_(std::move(url)) {}

  class Lease {
   public:
    Lease(ConnectionPool* pool, std::unique_ptr<pqxx::connection> conn)
        : pool_(pool), conn_(std::move(conn)) {}
    Lease(Lease&&) = default;
    ~Lease() {
      if (conn_ && conn_->is_open()) pool_->give_back(std::move(conn_));
    }
    pqxx::connection& operator*() { return *conn_; }
    pqxx::connection* operator->() { return conn_.get(); }

   private:
    ConnectionPool* pool_;
    std::unique_ptr<pqxx::connection> conn_;
  };

  Lease get() {
    {
      std::lock_guard lock(mutex_);
      if (!idle_.empty()) {
        auto conn = std::move(idle_.back());
        idle_.pop_back();
        return Lease(this, std::move(conn));
      }
    }
    return Lease(this, std::make_unique<pqxx::connection>(url_));
  }

 private:
  void give_back(std::unique_ptr<pqxx::connection> conn) {
    std::lock_guard lock(mutex_);
    if (idle_.size() < 8) idle_.push_back(std::move(conn));
  }
  std::string url_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<pqxx::connection>> idle_;
};

using SnapshotTx = pqxx::transaction<pqxx::repeatable_read, pqxx::read_only>;

struct App {
  ConnectionPool pool;
  outlive::topic::Client topic;
  std::mutex topic_mutex;
  outlive::outbox::LiveDefinition live;
  std::filesystem::path static_dir;
  std::filesystem::path client_file;
  std::unique_ptr<inventory::TokenIssuer> tokens;  // --auth jwt; null: sockets use the session

  App(const std::string& database, const std::vector<std::string>& nats,
      const std::string& event_schema, std::filesystem::path static_dir_,
      std::filesystem::path client_file_)
      : pool(database),
        topic(nats, "inventory-demo"),
        live(outlive::outbox::LiveDefinition::from_schema_file(kApp, event_schema)),
        static_dir(std::move(static_dir_)),
        client_file(std::move(client_file_)) {}

  // SPEC 2.2 cursor(): the topic's current position.
  std::string cursor() {
    std::lock_guard lock(topic_mutex);
    return topic.head_cursor(kApp);
  }
};

Response json_response(int status, const json& body) {
  return Response{status, "application/json", body.dump(), {}};
}

Response error_response(int status, const std::string& code, const std::string& message) {
  return json_response(status, {{"error", code}, {"message", message}});
}

Response file_response(const std::filesystem::path& path, const std::string& type) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return error_response(404, "not_found", "no such file");
  std::stringstream ss;
  ss << in.rdbuf();
  return Response{200, type, ss.str(), {}};
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  size_t pos = 1;
  while (pos <= path.size()) {
    size_t end = path.find('/', pos);
    if (end == std::string::npos) end = path.size();
    if (end > pos) parts.push_back(path.substr(pos, end - pos));
    pos = end + 1;
  }
  return parts;
}

std::string random_token() {
  std::random_device rd;  // the kernel's random source
  std::string out;
  char buf[9];
  for (int i = 0; i < 8; ++i) {
    std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(rd()));
    out += buf;
  }
  return out;  // 256 bits, hex
}

// The signed-in subject of the request: the session cookie (or ada's API key as a Bearer token).
std::optional<std::string> viewer_subject(pqxx::transaction_base& tx, const Request& req) {
  const std::string token = req.cookie(kSessionCookie);
  if (!token.empty()) {
    auto r = tx.exec_params(
        "SELECT subject FROM auth.sessions"
        " WHERE token_sha256 = encode(sha256(convert_to($1, 'UTF8')), 'hex') AND expires_at > "
        "now()",
        token);
    if (!r.empty()) return r[0][0].as<std::string>();
  }
  const std::string authorization = req.header("authorization");
  if (authorization.rfind("Bearer ", 0) == 0) {
    auto r = tx.exec_params(
        "SELECT subject FROM auth.api_keys"
        " WHERE key_sha256 = encode(sha256(convert_to($1, 'UTF8')), 'hex') AND revoked_at IS NULL",
        authorization.substr(7));
    if (!r.empty()) return r[0][0].as<std::string>();
  }
  return std::nullopt;
}

std::optional<json> json_body(const Request& req) {
  try {
    auto body = json::parse(req.body.empty() ? std::string("{}") : req.body);
    if (!body.is_object()) return std::nullopt;
    return body;
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

Response unauthorized() {
  return error_response(401, "unauthorized", "sign in first (POST /api/signin)");
}

class Routes {
 public:
  explicit Routes(App& app) : app_(app) {}

  Response handle(const Request& req) {
    try {
      return route(req);
    } catch (const outlive::Error& e) {
      if (e.code() == outlive::Errc::invalid_input)
        return error_response(400, "invalid_input", e.what());
      if (e.code() == outlive::Errc::nats || e.code() == outlive::Errc::timeout) {
        return error_response(503, "unavailable", e.what());
      }
      outlive::log::error(e.what(), {{"app", kApp}, {"path", req.path}});
      return error_response(500, "internal", e.what());
    } catch (const pqxx::broken_connection& e) {
      outlive::log::error(e.what(), {{"app", kApp}, {"path", req.path}});
      return error_response(503, "unavailable", "the database is unavailable");
    } catch (const std::exception& e) {
      outlive::log::error(e.what(), {{"app", kApp}, {"path", req.path}});
      return error_response(500, "internal", e.what());
    }
  }

 private:
  Response route(const Request& req) {
    const auto parts = split_path(req.path);
    const bool get = req.method == "GET";
    const bool post = req.method == "POST";
    if (get) {
      if (req.path == "/" || req.path == "/index.html") {
        return file_response(app_.static_dir / "index.html", "text/html; charset=utf-8");
      }
      if (req.path == "/app.js")
        return file_response(app_.static_dir / "app.js", "text/javascript; charset=utf-8");
      if (req.path == "/style.css")
        return file_response(app_.static_dir / "style.css", "text/css; charset=utf-8");
      if (req.path == "/outlive.js")
        return file_response(app_.client_file, "text/javascript; charset=utf-8");
      if (req.path == "/healthz") return Response{200, "text/plain", "ok\n", {}};
      if (req.path == "/favicon.ico") return Response{204, "text/plain", "", {}};
      if (req.path == "/.well-known/jwks.json" && app_.tokens) {
        // The replicas refetch after max-age (SPEC 5.1 rev 4 clamps it to 1 min..1 h).
        Response res{200, "application/json", app_.tokens->jwks(), {}};
        res.headers.emplace_back("Cache-Control", "public, max-age=300");
        return res;
      }
    }
    if (parts.empty() || parts[0] != "api")
      return error_response(404, "not_found", "no route " + req.path);
    // Writes come from the page's fetch() with a JSON body: a cross-site form cannot send that
    // without a CORS preflight, and the session cookie is SameSite=Lax anyway.
    if (post && req.header("content-type").rfind("application/json", 0) != 0) {
      return error_response(415, "invalid_input", "send Content-Type: application/json");
    }
    if (parts.size() == 2 && parts[1] == "signin" && post) return signin();
    if (parts.size() == 2 && parts[1] == "signout" && post) return signout(req);
    if (parts.size() == 2 && parts[1] == "me" && get) return me(req);
    if (parts.size() == 2 && parts[1] == "token" && post && app_.tokens) return token(req);
    if (parts.size() == 2 && parts[1] == "warehouses" && get) return my_warehouses(req);
    if (parts.size() == 3 && parts[1] == "warehouses" && get) return warehouse(req, parts[2]);
    if (parts.size() == 4 && parts[1] == "items" && parts[3] == "quantity" && post)
      return set_quantity(req, parts[2]);
    if (parts.size() == 4 && parts[1] == "items" && parts[3] == "name" && post)
      return rename(req, parts[2]);
    if (parts.size() == 5 && parts[1] == "warehouses" && parts[3] == "members" && post &&
        (parts[4] == "add" || parts[4] == "remove")) {
      return change_member(req, parts[2], parts[4] == "add");
    }
    return error_response(404, "not_found", "no route " + req.method + " " + req.path);
  }

  // The demo's one-click sign-in: a session row for ada with a random token (only its SHA-256 is
  // stored), handed to the browser as an HttpOnly cookie that the live socket presents too.
  Response signin() {
    const std::string token = random_token();
    auto conn = app_.pool.get();
    pqxx::work tx(*conn);
    tx.exec_params(
        "INSERT INTO auth.sessions (token_sha256, subject, actor, app_session, expires_at)"
        " VALUES (encode(sha256(convert_to($1, 'UTF8')), 'hex'), $2, $2, false, now() + interval "
        "'12 hours')",
        token, kDemoSubject);
    tx.commit();
    Response res = json_response(200, {{"subject", kDemoSubject}});
    res.headers.emplace_back("Set-Cookie", std::string(kSessionCookie) + "=" + token +
                                               "; Path=/; HttpOnly; SameSite=Lax; Max-Age=43200");
    return res;
  }

  Response signout(const Request& req) {
    const std::string token = req.cookie(kSessionCookie);
    if (!token.empty()) {
      auto conn = app_.pool.get();
      pqxx::work tx(*conn);
      tx.exec_params(
          "DELETE FROM auth.sessions WHERE token_sha256 = encode(sha256(convert_to($1, 'UTF8')), "
          "'hex')",
          token);
      tx.commit();
    }
    Response res = json_response(200, {{"signedOut", true}});
    res.headers.emplace_back(
        "Set-Cookie", std::string(kSessionCookie) + "=; Path=/; HttpOnly; SameSite=Lax; Max-Age=0");
    return res;
  }

  std::optional<std::string> authenticate(const Request& req) {
    auto conn = app_.pool.get();
    pqxx::nontransaction tx(*conn);
    return viewer_subject(tx, req);
  }

  Response me(const Request& req) {
    const auto subject = authenticate(req);
    if (!subject) return unauthorized();
    json body = {{"subject", *subject}};
    // The page passes its client a token() function when the sockets want a JWT.
    if (app_.tokens) body["socketAuth"] = "jwt";
    return json_response(200, body);
  }

  // --auth jwt: a token for the signed-in user, asked by the page's client for every socket and on
  // auth_expiring. {"lifetimeS": n} (1..300) asks for a shorter one: the smoke check's refresh.
  Response token(const Request& req) {
    const auto subject = authenticate(req);
    if (!subject) return unauthorized();
    if (subject->rfind(kJwtIdPrefix, 0) != 0) {
      return error_response(403, "forbidden", "tokens are for users, not " + *subject);
    }
    const auto body = json_body(req);
    if (!body) return error_response(400, "invalid_input", "send a JSON object");
    auto lifetime = kTokenLifetime;
    if (body->contains("lifetimeS")) {
      const auto& l = (*body)["lifetimeS"];
      if (!l.is_number_integer() || l.get<long long>() < 1 || l.get<long long>() > 300)
        return error_response(400, "invalid_input", "lifetimeS: 1 to 300");
      lifetime = std::chrono::seconds(l.get<long long>());
    }
    const std::string sub = subject->substr(kJwtIdPrefix.size());
    return json_response(
        200, {{"token", app_.tokens->issue(sub, lifetime)}, {"expiresIn", lifetime.count()}});
  }

  // The collection snapshot behind channel my_warehouses. Cursor first, then the snapshot.
  Response my_warehouses(const Request& req) {
    const auto subject = authenticate(req);
    if (!subject) return unauthorized();
    const std::string cursor = app_.cursor();
    auto conn = app_.pool.get();
    SnapshotTx tx(*conn);
    auto rows = tx.exec_params(
        "SELECT w.public_id, w.name, (SELECT count(*) FROM inventory.items i WHERE i.warehouse_id "
        "= w.id)"
        " FROM inventory.warehouses w JOIN inventory.members m ON m.warehouse_id = w.id AND "
        "m.subject = $1"
        " ORDER BY w.public_id",
        *subject);
    json list = json::array();
    for (const auto& row : rows) {
      list.push_back({{"publicId", row[0].as<std::string>()},
                      {"name", row[1].as<std::string>()},
                      {"items", row[2].as<long>()}});
    }
    // Every warehouse, with whether I may read it, so the page can offer "join" on the others.
    auto all = tx.exec("SELECT public_id, name FROM inventory.warehouses ORDER BY public_id");
    json others = json::array();
    for (const auto& row : all) {
      bool mine = false;
      for (const auto& w : list) mine = mine || w["publicId"] == row[0].as<std::string>();
      if (!mine)
        others.push_back(
            {{"publicId", row[0].as<std::string>()}, {"name", row[1].as<std::string>()}});
    }
    tx.commit();
    return json_response(200, {{"cursor", cursor}, {"warehouses", list}, {"others", others}});
  }

  // SPEC 5.6: read the cursor FIRST, then the snapshot, so a change made while the snapshot loads
  // is delivered to the tab afterwards (maybe twice: the page applies updates idempotently).
  Response warehouse(const Request& req, const std::string& public_id) {
    const auto subject = authenticate(req);
    if (!subject) return unauthorized();
    const std::string cursor = app_.cursor();
    auto conn = app_.pool.get();
    SnapshotTx tx(*conn);
    // The membership rule of services.hpp, which channel warehouse_code asks too.
    const auto id = inventory::find_warehouse(tx, public_id);
    if (!id) return error_response(404, "not_found", "no warehouse " + public_id);
    if (inventory::members_among(tx, *id, {*subject}).empty()) {
      return error_response(403, "forbidden",
                            *subject + " is not a member of warehouse " + public_id);
    }
    auto w = tx.exec_params("SELECT public_id, name FROM inventory.warehouses WHERE id = $1::uuid",
                            *id);
    auto rows = tx.exec_params(
        "SELECT short_id, name, quantity FROM inventory.items WHERE warehouse_id = $1::uuid ORDER "
        "BY short_id",
        *id);
    json items = json::array();
    for (const auto& row : rows) {
      items.push_back({{"id", row[0].as<std::string>()},
                       {"name", row[1].as<std::string>()},
                       {"quantity", row[2].as<int>()}});
    }
    tx.commit();
    return json_response(
        200, {{"cursor", cursor},
              {"warehouse",
               {{"publicId", w[0][0].as<std::string>()}, {"name", w[0][1].as<std::string>()}}},
              {"items", items}});
  }

  // The item (locked) and whether the subject may write to its warehouse. nullopt: no such item.
  struct LockedItem {
    std::string warehouse_id;
    bool member = false;
    int quantity = 0;
    std::string name;
  };
  std::optional<LockedItem> lock_item(pqxx::work& tx, const std::string& short_id,
                                      const std::string& subject) {
    auto r = tx.exec_params(
        "SELECT i.warehouse_id::text,"
        " EXISTS (SELECT 1 FROM inventory.members m WHERE m.warehouse_id = i.warehouse_id AND "
        "m.subject = $2),"
        " i.quantity, i.name"
        " FROM inventory.items i WHERE i.short_id = $1 FOR UPDATE OF i",
        short_id, subject);
    if (r.empty()) return std::nullopt;
    return LockedItem{r[0][0].as<std::string>(), r[0][1].as<bool>(), r[0][2].as<int>(),
                      r[0][3].as<std::string>()};
  }

  // SPEC 2.2: the change and its live update in one transaction; wake() after the commit.
  Response set_quantity(const Request& req, const std::string& short_id) {
    const auto body = json_body(req);
    if (!body || !body->contains("quantity") || !(*body)["quantity"].is_number_integer()) {
      return error_response(400, "invalid_input", "send {\"quantity\": <integer >= 0>}");
    }
    const auto quantity = (*body)["quantity"].get<long long>();
    if (quantity < 0 || quantity > INT_MAX)
      return error_response(400, "invalid_input", "quantity must be 0 or more");

    auto conn = app_.pool.get();
    pqxx::work tx(*conn);
    const auto subject = viewer_subject(tx, req);
    if (!subject) return unauthorized();
    const auto item = lock_item(tx, short_id, *subject);
    if (!item) return error_response(404, "not_found", "no item " + short_id);
    if (!item->member)
      return error_response(403, "forbidden", *subject + " may not change item " + short_id);
    if (item->quantity == quantity) {
      // Publish only when the transaction changed something.
      return json_response(200, {{"itemId", short_id}, {"quantity", quantity}, {"changed", false}});
    }
    tx.exec_params("UPDATE inventory.items SET quantity = $1 WHERE short_id = $2",
                   static_cast<int>(quantity), short_id);
    app_.live.publish(
        tx, {.key = item->warehouse_id,
             .data = {{"type", "item.changed"}, {"itemId", short_id}, {"quantity", quantity}}});
    tx.commit();
    app_.live.wake(*conn);
    return json_response(200, {{"itemId", short_id}, {"quantity", quantity}, {"changed", true}});
  }

  // The trigger path: the UPDATE fires inventory.publish_item_change(), which writes the live
  // update through events.enqueue in this same transaction. The application only wakes.
  Response rename(const Request& req, const std::string& short_id) {
    const auto body = json_body(req);
    if (!body || !body->contains("name") || !(*body)["name"].is_string()) {
      return error_response(400, "invalid_input", "send {\"name\": <text>}");
    }
    const auto name = (*body)["name"].get<std::string>();
    if (name.empty() || name.size() > 200)
      return error_response(400, "invalid_input", "name: 1 to 200 characters");
    auto conn = app_.pool.get();
    pqxx::work tx(*conn);
    const auto subject = viewer_subject(tx, req);
    if (!subject) return unauthorized();
    const auto item = lock_item(tx, short_id, *subject);
    if (!item) return error_response(404, "not_found", "no item " + short_id);
    if (!item->member)
      return error_response(403, "forbidden", *subject + " may not change item " + short_id);
    if (item->name == name)
      return json_response(200, {{"itemId", short_id}, {"name", name}, {"changed", false}});
    tx.exec_params("UPDATE inventory.items SET name = $1 WHERE short_id = $2", name, short_id);
    tx.commit();
    app_.live.wake(*conn);
    return json_response(200, {{"itemId", short_id}, {"name", name}, {"changed", true}});
  }

  // SPEC 2.3: a change that decides who may read the warehouse publishes an access update for its
  // key in the same transaction. Every replica then checks the key's subscribers again before it
  // delivers anything later: a removed member's tab receives `revoked`.
  // (A demo shortcut: any signed-in user may change the members; a real app would ask for a role.)
  Response change_member(const Request& req, const std::string& public_id, bool add) {
    const auto body = json_body(req);
    if (!body || !body->contains("subject") || !(*body)["subject"].is_string()) {
      return error_response(400, "invalid_input", "send {\"subject\": \"user:<id>\"}");
    }
    const auto member = (*body)["subject"].get<std::string>();
    if (member.empty() || member.size() > 200)
      return error_response(400, "invalid_input", "subject: 1 to 200 characters");
    auto conn = app_.pool.get();
    pqxx::work tx(*conn);
    const auto subject = viewer_subject(tx, req);
    if (!subject) return unauthorized();
    auto w = tx.exec_params(
        "SELECT id::text FROM inventory.warehouses WHERE public_id = $1 FOR UPDATE", public_id);
    if (w.empty()) return error_response(404, "not_found", "no warehouse " + public_id);
    const std::string warehouse_id = w[0][0].as<std::string>();
    const auto changed =
        add ? tx.exec_params(
                    "INSERT INTO inventory.members (warehouse_id, subject) VALUES ($1::uuid, $2)"
                    " ON CONFLICT DO NOTHING",
                    warehouse_id, member)
                  .affected_rows()
            : tx.exec_params(
                    "DELETE FROM inventory.members WHERE warehouse_id = $1::uuid AND subject = $2",
                    warehouse_id, member)
                  .affected_rows();
    if (changed == 0) {
      return json_response(200,
                           {{"warehouse", public_id}, {"subject", member}, {"changed", false}});
    }
    app_.live.publish_access(tx, warehouse_id);
    tx.commit();
    app_.live.wake(*conn);
    outlive::log::info(
        add ? "member added" : "member removed",
        {{"app", kApp}, {"warehouse", public_id}, {"subject", member}, {"by", *subject}});
    return json_response(200, {{"warehouse", public_id}, {"subject", member}, {"changed", true}});
  }

  App& app_;
};

std::optional<std::string> flag(const std::vector<std::string>& args, const std::string& name) {
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == name) return args[i + 1];
  }
  return std::nullopt;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) {
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    std::cout << kUsage;
    return 0;
  }
  const auto listen = flag(args, "--listen");
  const auto database = flag(args, "--database");
  const auto nats = flag(args, "--nats");
  const auto static_dir = flag(args, "--static");
  if (!listen || !database || !nats || !static_dir) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string client =
      flag(args, "--client").value_or(OUTLIVE_SOURCE_DIR "/clients/js/outlive.js");
  const std::string event_schema =
      flag(args, "--event-schema").value_or(OUTLIVE_SOURCE_DIR "/schemas/inventory.event.json");
  const auto colon = listen->rfind(':');
  if (colon == std::string::npos) {
    std::cerr << "inventory_demo: --listen must be HOST:PORT\n";
    return 2;
  }
  const std::string auth = flag(args, "--auth").value_or("session");
  if (auth != "session" && auth != "jwt") {
    std::cerr << "inventory_demo: --auth must be session or jwt\n";
    return 2;
  }
  if (!std::filesystem::exists(std::filesystem::path(*static_dir) / "index.html")) {
    std::cerr << "inventory_demo: no index.html in " << *static_dir << "\n";
    return 2;
  }

  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  try {
    App app(*database, split_commas(*nats), event_schema, *static_dir, client);
    if (auth == "jwt") {
      app.tokens = std::make_unique<inventory::TokenIssuer>(
          flag(args, "--jwt-issuer").value_or("inventory-demo"),
          flag(args, "--jwt-audience").value_or("outlive-demo"));
    }
    Routes routes(app);
    inventory::web::Server server(listen->substr(0, colon), std::stoi(listen->substr(colon + 1)),
                                  [&routes](const Request& req) { return routes.handle(req); });
    outlive::log::info("inventory demo listening", {{"app", kApp},
                                                    {"listen", listen->substr(0, colon) + ":" +
                                                                   std::to_string(server.port())}});
    int sig = 0;
    sigwait(&stop_signals, &sig);
    outlive::log::info("inventory demo stopping", {{"app", kApp}, {"signal", strsignal(sig)}});
    server.stop();
    std::cout.flush();
    std::cerr.flush();
    // Request threads may still hold pooled connections: leave without running destructors.
    std::_Exit(0);
  } catch (const std::exception& e) {
    std::cerr << "inventory_demo: " << e.what() << "\n";
    return 1;
  }
}
