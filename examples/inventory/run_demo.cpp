// outlive_demo_run: the README's run command. Starts the whole demo on this machine:
//
//   PostgreSQL 15 (durable, <data>/postgres) and NATS JetStream (<data>/nats), the migrations and
//   examples/inventory/schema.sql, two replicas (inventory_replica: `outlive serve` plus the app's
//   channel declared in C++), the inventory demo app, and
//   nginx (or HAProxy) as the gateway on http://localhost:8080/ (websockets to the replicas, the
//   rest to the app).
//
//   outlive_demo_run [--port 8080] [--data .outlive-dev] [--bind 127.0.0.1] [--origin URL]...
//   outlive_demo_run --gateway haproxy ...  HAProxy (deploy/haproxy) instead of nginx
//                                           (deploy/nginx)
//   outlive_demo_run --auth jwt ...         the sockets authenticate with JWTs the app signs (its
//                                           JWKS is the replicas' auth.jwt.jwks_url) instead of
//                                           the session cookie
//   outlive_demo_run --app-server ts ...    the app is the TypeScript server of
//                                           examples/inventory-ts (built with its build.sh, run
//                                           with node) instead of inventory_demo, and the
//                                           replicas' channels warehouse and my_warehouses are
//                                           hook channels it answers (@outlive/server routes())
//   outlive_demo_run --check [--port 0]     start everything in a temp dir, send one update end to
//                                           end through the gateway, print OK, stop (the smoke
//                                           test)
//   outlive_demo_run --state FILE ...       also write the URL, ports and PIDs as JSON to FILE once
//                                           everything answers (tests/e2e stops a replica by its
//                                           PID)
//   outlive_demo_run --test-gateway-config  render the gateway's template with sample addresses
//                                           into a temp dir, let the gateway check it (nginx -t,
//                                           haproxy -c), print OK; starts nothing
//
// Ctrl-C or SIGTERM stops everything (gateway, app, replicas, NATS, Postgres, in that order).
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <pqxx/pqxx>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "harness/embedded_nats.hpp"
#include "harness/embedded_postgres.hpp"
#include "harness/process.hpp"
#include "outbox/migrate.hpp"
#include "web.hpp"

#ifndef OUTLIVE_SOURCE_DIR
#define OUTLIVE_SOURCE_DIR "."
#endif
#ifndef INVENTORY_REPLICA_BINARY
#define INVENTORY_REPLICA_BINARY "inventory_replica"
#endif
#ifndef INVENTORY_DEMO_BINARY
#define INVENTORY_DEMO_BINARY "inventory_demo"
#endif

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;
using outlive::harness::ChildProcess;

namespace {

constexpr int kReplicas = 2;
// --auth jwt: the `aud` of the app's tokens, which the replicas check (`iss` is the app's URL).
constexpr const char* kJwtAudience = "outlive-demo";
// --auth jwt: the session cookie the replicas look for. The replica reads a session cookie before
// anything else (SPEC 5.1), and the page's socket still carries the app's `session` cookie (it is
// the app's own sign-in): a name the app never sets leaves the socket to its JWT.
constexpr const char* kJwtModeSessionCookie = "outlive_demo_no_session";

const char* kUsage =
    "usage: outlive_demo_run [--port 8080] [--data .outlive-dev] [--bind 127.0.0.1] [--origin "
    "URL]...\n"
    "                        [--check] [--state FILE] [--source DIR] [--replica FILE] [--app FILE] "
    "[--nginx FILE]\n"
    "                        [--gateway nginx|haproxy] [--haproxy FILE] [--test-gateway-config]\n"
    "                        [--auth session|jwt] [--app-server cpp|ts]\n"
    "  --port N     the gateway's port (0: a free one); the page is http://localhost:N/\n"
    "  --data DIR   Postgres, NATS, configs and logs (kept between runs); with --check a temp dir\n"
    "  --bind ADDR  the gateway's address (127.0.0.1); add --origin http://HOST:PORT for other "
    "hosts\n"
    "  --check      start, send one update end to end through the gateway, print OK and stop\n"
    "  --state FILE once everything answers, write the gateway URL and the ports and PIDs of the\n"
    "               gateway, app and replicas as JSON to FILE (removed when the demo stops)\n"
    "  --gateway G  nginx (deploy/nginx, the default) or haproxy (deploy/haproxy)\n"
    "  --auth A     how the live sockets authenticate: session (the app's cookie, the default) or\n"
    "               jwt (ES256 tokens from the app's POST /api/token, its JWKS for the replicas)\n"
    "  --app-server S  cpp (inventory_demo, the default) or ts (examples/inventory-ts on\n"
    "               node: its routes publish with @outlive/server, the channels are hooks it\n"
    "               answers)\n"
    "  --test-gateway-config  check the gateway's rendered template (nginx -t, haproxy -c) and "
    "stop\n";

std::atomic<int> g_signal{0};
void on_signal(int sig) { g_signal = sig; }

struct Options {
  int port = 8080;
  std::string data;
  std::string bind = "127.0.0.1";
  std::vector<std::string> origins;
  bool check = false;
  std::string state_file;
  fs::path source = OUTLIVE_SOURCE_DIR;
  // Run as `<replica> serve --config FILE`: inventory_replica, or `outlive` (no C++ channel).
  std::string replica = INVENTORY_REPLICA_BINARY;
  std::string app = INVENTORY_DEMO_BINARY;
  std::string nginx;
  std::string gateway = "nginx";
  std::string haproxy;
  bool test_gateway_config = false;
  std::string auth = "session";
  std::string app_server = "cpp";
};

Options parse_options(const std::vector<std::string>& args) {
  Options o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw std::invalid_argument(a + " needs a value");
      return args[++i];
    };
    if (a == "--port")
      o.port = std::stoi(value());
    else if (a == "--data")
      o.data = value();
    else if (a == "--bind")
      o.bind = value();
    else if (a == "--origin")
      o.origins.push_back(value());
    else if (a == "--check")
      o.check = true;
    else if (a == "--state")
      o.state_file = value();
    else if (a == "--source")
      o.source = value();
    else if (a == "--replica")
      o.replica = value();
    else if (a == "--app")
      o.app = value();
    else if (a == "--nginx")
      o.nginx = value();
    else if (a == "--gateway")
      o.gateway = value();
    else if (a == "--haproxy")
      o.haproxy = value();
    else if (a == "--test-gateway-config")
      o.test_gateway_config = true;
    else if (a == "--auth")
      o.auth = value();
    else if (a == "--app-server")
      o.app_server = value();
    else
      throw std::invalid_argument("unknown option " + a);
  }
  if (o.port < 0 || o.port > 65535) throw std::invalid_argument("--port must be 0..65535");
  if (o.gateway != "nginx" && o.gateway != "haproxy")
    throw std::invalid_argument("--gateway must be nginx or haproxy, not " + o.gateway);
  if (o.auth != "session" && o.auth != "jwt")
    throw std::invalid_argument("--auth must be session or jwt, not " + o.auth);
  if (o.app_server != "cpp" && o.app_server != "ts")
    throw std::invalid_argument("--app-server must be cpp or ts, not " + o.app_server);
  // The TypeScript server signs no tokens: its sockets use the session cookie.
  if (o.app_server == "ts" && o.auth == "jwt")
    throw std::invalid_argument("--app-server ts runs with --auth session only");
  return o;
}

std::string find_program(const std::string& name, const std::string& given,
                         std::initializer_list<const char*> places) {
  if (!given.empty()) return given;
  for (const char* p : places) {
    if (fs::exists(p)) return p;
  }
  throw std::runtime_error(name + " not found (apt-get install " + name + ", or pass --" + name +
                           " FILE)");
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size())
    s.replace(pos, from.size(), to);
}

bool http_ok(int port, const std::string& path) {
  try {
    return inventory::web::request("127.0.0.1", port, "GET", path, {}, {}, 2s).status == 200;
  } catch (const std::exception&) {
    return false;
  }
}

// --- the gateway -------------------------------------------------------------------------------

// What a gateway's template is filled in with. The replicas and the app listen on 127.0.0.1.
struct GatewayAddresses {
  std::string listen;  // address:port browsers connect to
  std::vector<int> replica_ports;
  int app_port = 0;
};

// A rendered gateway: the command that checks its configuration and the one that runs it in the
// foreground.
struct Gateway {
  fs::path config;
  std::vector<std::string> test;
  std::vector<std::string> run;
  std::string error_log;  // empty: the gateway writes its errors to stdout
};

// The unprivileged user a gateway started as root switches to: the first of `names` that exists.
const passwd& gateway_user(const std::string& gateway, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (const passwd* pw = getpwnam(name)) return *pw;
  }
  throw std::runtime_error("running as root, but there is no user for " + gateway + " to run as");
}

// Empty when the user's group has no name: the gateway then takes the user's own.
std::string group_name(const passwd& pw) {
  const group* gr = getgrgid(pw.pw_gid);
  return gr ? gr->gr_name : "";
}

// deploy/nginx/outlive.conf.template. Every file nginx writes is inside `prefix`.
Gateway render_nginx(const Options& o, const fs::path& prefix, const GatewayAddresses& a) {
  for (const char* dir :
       {"logs", "temp/client_body", "temp/proxy", "temp/fastcgi", "temp/uwsgi", "temp/scgi"}) {
    fs::create_directories(prefix / dir);
  }
  std::string user_line = "# (not root: the workers run as we do)";
  if (geteuid() == 0) {
    // nginx started as root switches its workers to this user; they write the temp files.
    const passwd& pw = gateway_user("nginx", {"www-data", "nobody"});
    const std::string group = group_name(pw);
    user_line = std::string("user ") + pw.pw_name + (group.empty() ? "" : " " + group) + ";";
    for (const auto& entry : fs::recursive_directory_iterator(prefix / "temp")) {
      (void)chown(entry.path().c_str(), pw.pw_uid, pw.pw_gid);
    }
    (void)chown((prefix / "temp").c_str(), pw.pw_uid, pw.pw_gid);
    chmod(prefix.c_str(), 0755);
  }
  std::string replicas;
  for (const int port : a.replica_ports)
    replicas += "    server 127.0.0.1:" + std::to_string(port) + ";\n";
  std::string conf = read_file(o.source / "deploy/nginx/outlive.conf.template");
  replace_all(conf, "@USER_LINE@", user_line);
  replace_all(conf, "@PREFIX@", prefix.string());
  replace_all(conf, "@LISTEN@", a.listen);
  replace_all(conf, "@REPLICAS@\n", replicas);
  replace_all(conf, "@APP@", "127.0.0.1:" + std::to_string(a.app_port));
  Gateway g;
  g.config = prefix / "nginx.conf";
  write_file(g.config, conf);
  g.error_log = (prefix / "logs/error.log").string();
  const std::string nginx = find_program("nginx", o.nginx,
                                         {"/usr/sbin/nginx", "/usr/local/sbin/nginx",
                                          "/usr/local/nginx/sbin/nginx", "/usr/bin/nginx"});
  const std::vector<std::string> common = {
      nginx, "-p", prefix.string() + "/", "-c", g.config.string(), "-e", g.error_log};
  g.test = common;
  g.test.insert(g.test.begin() + 1, {"-t", "-q"});
  g.run = common;
  g.run.insert(g.run.end(), {"-g", "daemon off;"});
  return g;
}

// deploy/haproxy/outlive.cfg.template. HAProxy writes no files: it logs to stdout.
Gateway render_haproxy(const Options& o, const fs::path& prefix, const GatewayAddresses& a) {
  fs::create_directories(prefix);
  std::string user_line = "# (not root: it runs as we do)";
  std::string group_line = "#";
  if (geteuid() == 0) {
    // Dropped to after binding; Debian's package creates the haproxy user.
    const passwd& pw = gateway_user("haproxy", {"haproxy", "nobody"});
    const std::string group = group_name(pw);
    user_line = std::string("user ") + pw.pw_name;
    if (!group.empty()) group_line = "group " + group;
  }
  std::string replicas;
  for (size_t i = 0; i < a.replica_ports.size(); ++i)
    replicas += "  server demo-r" + std::to_string(i + 1) +
                " 127.0.0.1:" + std::to_string(a.replica_ports[i]) + "\n";
  std::string conf = read_file(o.source / "deploy/haproxy/outlive.cfg.template");
  replace_all(conf, "@USER_LINE@", user_line);
  replace_all(conf, "@GROUP_LINE@", group_line);
  replace_all(conf, "@PREFIX@", prefix.string());
  replace_all(conf, "@LISTEN@", a.listen);
  replace_all(conf, "@REPLICAS@\n", replicas);
  replace_all(conf, "@APP@", "127.0.0.1:" + std::to_string(a.app_port));
  Gateway g;
  g.config = prefix / "haproxy.cfg";
  write_file(g.config, conf);
  const std::string haproxy =
      find_program("haproxy", o.haproxy, {"/usr/sbin/haproxy", "/usr/local/sbin/haproxy"});
  // -dW: a warning fails the check, so a template that HAProxy reads differently than meant
  // does not start.
  g.test = {haproxy, "-c", "-dW", "-f", g.config.string()};
  // -db: in the foreground, so it stops with the demo and its log goes to the demo's log file.
  g.run = {haproxy, "-db", "-f", g.config.string()};
  return g;
}

Gateway render_gateway(const Options& o, const fs::path& prefix, const GatewayAddresses& a) {
  return o.gateway == "haproxy" ? render_haproxy(o, prefix, a) : render_nginx(o, prefix, a);
}

// A process of the demo, with its log file.
struct Proc {
  std::string name;
  std::string log;
  ChildProcess child;
  int port = 0;
};

std::string exit_text(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by ") + strsignal(WTERMSIG(status));
  return "stopped";
}

void wait_ready(Proc& p, int port, const std::string& path, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (g_signal) throw std::runtime_error("interrupted");
    if (!p.child.running()) {
      const auto status = p.child.wait_for(0ms).value_or(0);
      throw std::runtime_error(p.name + " " + exit_text(status) + " at start; its log (" + p.log +
                               "):\n" + outlive::harness::tail_of_file(p.log));
    }
    if (http_ok(port, path)) return;
    std::this_thread::sleep_for(100ms);
  }
  throw std::runtime_error(p.name + " did not answer GET " + path + " on port " +
                           std::to_string(port) + " within " + std::to_string(timeout.count()) +
                           " s; its log (" + p.log + "):\n" +
                           outlive::harness::tail_of_file(p.log));
}

// Everything the demo runs. stop() ends it in reverse order, also on a failed start.
class Demo {
 public:
  explicit Demo(Options options) : o_(std::move(options)) {}
  ~Demo() { stop(); }

  void start();
  void stop();
  void print_banner() const;
  // The machine-readable side of the banner, for tests: written to a temp file, then renamed.
  void write_state(const std::string& file);
  // Returns a problem text when a process that must run has exited.
  std::optional<std::string> watch();
  // The gateway's port on 127.0.0.1 (chosen by start() for --port 0).
  int gateway_port() const { return gateway_port_; }
  // --check --app-server ts, after the check: the replicas' /metrics show answered calls to the
  // TypeScript server's hooks (keys and authorize of channel warehouse), so the check's
  // subscriptions and revocation went through them. Throws when they do not.
  void check_ts_hooks();

 private:
  void prepare_data_dir();
  void start_services();
  void write_replica_configs();
  void start_replicas();
  void start_app();
  void start_gateway();
  void prepare_ts_app();
  bool jwt() const { return o_.auth == "jwt"; }
  bool ts() const { return o_.app_server == "ts"; }
  fs::path ts_dir() const { return o_.source / "examples/inventory-ts"; }
  std::string hooks_url() const {
    return "http://127.0.0.1:" + std::to_string(hooks_port_) + "/outlive/hooks";
  }
  std::string app_url() const { return "http://127.0.0.1:" + std::to_string(app_port_); }
  std::string jwks_url() const { return app_url() + "/.well-known/jwks.json"; }
  void use_jwt(json& config) const;
  std::string gateway_url(const std::string& host) const {
    return "http://" + host + ":" + std::to_string(gateway_port_) + "/";
  }

  Options o_;
  fs::path data_;
  bool temp_data_ = false;
  fs::path logs_;
  std::unique_ptr<outlive::harness::EmbeddedPostgres> postgres_;
  std::unique_ptr<outlive::harness::EmbeddedNats> nats_;
  std::string database_url_;
  std::string nats_password_;  // the demo's NATS requires the user "outlive" (docs/NATS.md)
  std::vector<fs::path> replica_configs_;
  std::vector<std::unique_ptr<Proc>> replicas_;
  std::unique_ptr<Proc> app_;
  std::unique_ptr<Proc> gateway_;
  std::string gateway_error_log_;
  int gateway_port_ = 0;
  int app_port_ = 0;  // 0 until chosen: by start() with --auth jwt, else by start_app()
  // --app-server ts: the loopback port of its routes() (out of the gateway's reach), the channels'
  // section that its replicaConfig() printed, and the secret that signs the hook calls.
  int hooks_port_ = 0;
  json ts_channels_;
  fs::path hook_secret_file_;
  std::vector<std::string> dead_reported_;
  fs::path state_file_;
};

void Demo::prepare_data_dir() {
  if (o_.data.empty() && o_.check) {
    data_ = outlive::harness::make_temp_dir("outlive-demo-");
    temp_data_ = true;
  } else {
    data_ = fs::absolute(o_.data.empty() ? ".outlive-dev" : o_.data).lexically_normal();
    fs::create_directories(data_);
  }
  // Postgres runs as user postgres and nginx workers as an unprivileged user when we are root:
  // both must be able to enter the folder.
  chmod(data_.c_str(), 0755);
  logs_ = data_ / "logs";
  fs::create_directories(logs_);
}

void Demo::start_services() {
  outlive::harness::PostgresOptions pg;
  pg.durable = true;
  pg.data_dir = (data_ / "postgres").string();
  postgres_ = std::make_unique<outlive::harness::EmbeddedPostgres>(pg);
  database_url_ = postgres_->url();

  outlive::harness::NatsOptions nats;
  nats.store_dir = (data_ / "nats").string();
  // A new password each run: the server and every client of it are started by this run.
  std::ifstream random("/dev/urandom", std::ios::binary);
  unsigned char bytes[16];
  random.read(reinterpret_cast<char*>(bytes), sizeof bytes);
  static const char* hex = "0123456789abcdef";
  for (unsigned char b : bytes) nats_password_ += {hex[b >> 4], hex[b & 15]};
  write_file(data_ / "nats_password", nats_password_ + "\n");
  fs::permissions(data_ / "nats_password", fs::perms::owner_read | fs::perms::owner_write);
  nats.user = "outlive";
  nats.password = nats_password_;
  nats_ = std::make_unique<outlive::harness::EmbeddedNats>(nats);

  outlive::outbox::migrate(database_url_);
  const std::string schema = read_file(o_.source / "examples/inventory/schema.sql");
  pqxx::connection conn(database_url_);
  pqxx::work tx(conn);
  tx.exec(schema);
  tx.commit();
}

// The replicas' configurations: examples/inventory/outlive.json with this run's addresses.
void Demo::write_replica_configs() {
  const fs::path example = o_.source / "examples/inventory/outlive.json";
  const json base = json::parse(read_file(example));
  std::vector<std::string> origins = {"http://localhost:" + std::to_string(gateway_port_),
                                      "http://127.0.0.1:" + std::to_string(gateway_port_)};
  if (o_.bind != "127.0.0.1" && o_.bind != "0.0.0.0")
    origins.push_back("http://" + o_.bind + ":" + std::to_string(gateway_port_));
  for (const auto& o : o_.origins) origins.push_back(o);
  for (int i = 1; i <= kReplicas; ++i) {
    json config = base;
    const int port = outlive::harness::free_port();
    config["replica"] = "demo-r" + std::to_string(i);
    config["listen"] = "127.0.0.1:" + std::to_string(port);
    config["database"] = database_url_;
    config["nats"] = json::array({nats_->url()});
    config["nats_options"] = {{"user", "outlive"},
                              {"password_file", (data_ / "nats_password").string()}};
    if (ts()) {
      // The channels are the TypeScript server's hooks (its replicaConfig()), signed with the
      // run's secret; auth stays the SQL of outlive.json (the server writes the same sessions).
      config["apps"]["inventory"]["channels"] = ts_channels_;
      config["hook_secret_file"] = hook_secret_file_.string();
    }
    for (auto& [id, app] : config["apps"].items()) {
      app["allowed_origins"] = origins;
      if (app.contains("event_schema")) {
        fs::path schema = app["event_schema"].get<std::string>();
        if (schema.is_relative())
          schema = fs::absolute(example.parent_path() / schema).lexically_normal();
        app["event_schema"] = schema.string();
      }
    }
    if (jwt()) use_jwt(config);
    const fs::path path = data_ / ("replica-" + std::to_string(i) + ".json");
    write_file(path, config.dump(2) + "\n");
    replica_configs_.push_back(path);
    auto proc = std::make_unique<Proc>();
    proc->name = "replica demo-r" + std::to_string(i);
    proc->port = port;
    replicas_.push_back(std::move(proc));
  }
}

// --auth jwt: the sockets authenticate with the app's tokens (SPEC 5.1 rev 4), verified with the
// app's JWKS; API keys and OAuth tokens stay (curl with the demo key still works), sessions go.
void Demo::use_jwt(json& config) const {
  json& auth = config["auth"];
  auth.erase("sessions");
  auth["session_cookie"] = kJwtModeSessionCookie;
  auth["jwt"] = {{"jwks_url", jwks_url()},
                 {"algorithms", {"ES256"}},
                 {"issuer", app_url()},
                 {"audience", kJwtAudience}};
}

void Demo::start_replicas() {
  for (size_t i = 0; i < replicas_.size(); ++i) {
    auto& r = *replicas_[i];
    r.log = (logs_ / ("replica-" + std::to_string(i + 1) + ".log")).string();
    // The environment would override the generated files: clear what outlive reads.
    r.child = ChildProcess({o_.replica, "serve", "--config", replica_configs_[i].string()}, r.log,
                           std::nullopt,
                           {"OUTLIVE_DATABASE_URL=", "OUTLIVE_NATS_URL=", "OUTLIVE_LISTEN="});
  }
  for (auto& r : replicas_) wait_ready(*r, r->port, "/readyz", 90s);
}

// --app-server ts: builds examples/inventory-ts (npm ci when its lock changed, tsc when a source
// did), makes the hook secret, and asks the server for its channels' section of the replica
// configuration (`replica-config`: @outlive/server's replicaConfig()).
void Demo::prepare_ts_app() {
  const std::string build_log = (logs_ / "inventory-ts-build.log").string();
  std::cout << "building examples/inventory-ts (npm ci, tsc; log " << build_log << ")\n"
            << std::flush;
  outlive::harness::run_checked({(ts_dir() / "build.sh").string()}, build_log);
  std::ifstream random("/dev/urandom", std::ios::binary);
  unsigned char bytes[32];
  random.read(reinterpret_cast<char*>(bytes), sizeof bytes);
  static const char* hex = "0123456789abcdef";
  std::string secret;
  for (unsigned char b : bytes) secret += {hex[b >> 4], hex[b & 15]};
  hook_secret_file_ = data_ / "hook_secret";
  write_file(hook_secret_file_, secret + "\n");
  fs::permissions(hook_secret_file_, fs::perms::owner_read | fs::perms::owner_write);
  app_port_ = outlive::harness::free_port();
  hooks_port_ = outlive::harness::free_port();
  const fs::path section = data_ / "inventory-ts-channels.json";
  outlive::harness::run_checked({"node", (ts_dir() / "dist/server.js").string(), "replica-config",
                                 "--hook-url", hooks_url(), "--out", section.string()},
                                build_log);
  ts_channels_ = json::parse(read_file(section)).at("channels");
}

void Demo::start_app() {
  app_ = std::make_unique<Proc>();
  app_->name = ts() ? "inventory-ts (node)" : "inventory_demo";
  if (app_port_ == 0) app_port_ = outlive::harness::free_port();
  app_->port = app_port_;
  app_->log = (logs_ / (ts() ? "inventory-ts.log" : "inventory_demo.log")).string();
  if (ts()) {
    std::string replicas;
    for (const auto& r : replicas_)
      replicas += (replicas.empty() ? "" : ",") + std::string("http://127.0.0.1:") +
                  std::to_string(r->port);
    app_->child =
        ChildProcess({"node", "--enable-source-maps", (ts_dir() / "dist/server.js").string(),
                      "serve", "--listen", "127.0.0.1:" + std::to_string(app_->port),
                      "--hooks-listen", "127.0.0.1:" + std::to_string(hooks_port_), "--database",
                      database_url_, "--static", (o_.source / "examples/inventory/web").string(),
                      "--client", (o_.source / "clients/js/outlive.js").string(), "--replicas",
                      replicas, "--hook-secret-file", hook_secret_file_.string()},
                     app_->log);
    wait_ready(*app_, app_->port, "/healthz", 30s);
    return;
  }
  auto command = std::vector<std::string>(
      {o_.app, "--listen", "127.0.0.1:" + std::to_string(app_->port), "--database", database_url_,
       "--nats", "nats://outlive:" + nats_password_ + "@127.0.0.1:" + std::to_string(nats_->port()),
       "--static", (o_.source / "examples/inventory/web").string(), "--client",
       (o_.source / "clients/js/outlive.js").string(), "--event-schema",
       (o_.source / "schemas/inventory.event.json").string()});
  if (jwt()) {
    command.insert(command.end(),
                   {"--auth", "jwt", "--jwt-issuer", app_url(), "--jwt-audience", kJwtAudience});
  }
  app_->child = ChildProcess(command, app_->log);
  wait_ready(*app_, app_->port, "/healthz", 30s);
}

void Demo::start_gateway() {
  GatewayAddresses addresses{o_.bind + ":" + std::to_string(gateway_port_), {}, app_->port};
  for (const auto& r : replicas_) addresses.replica_ports.push_back(r->port);
  const Gateway g = render_gateway(o_, data_ / o_.gateway, addresses);

  gateway_ = std::make_unique<Proc>();
  gateway_->name = o_.gateway;
  gateway_->port = gateway_port_;
  gateway_->log = (logs_ / (o_.gateway + ".log")).string();
  gateway_error_log_ = g.error_log.empty() ? gateway_->log : g.error_log;
  outlive::harness::run_checked(g.test, gateway_->log);
  gateway_->child = ChildProcess(g.run, gateway_->log);
  wait_ready(*gateway_, gateway_port_, "/healthz", 30s);                    // through to the app
  wait_ready(*gateway_, gateway_port_, "/api/inventory/live/cursor", 30s);  // through to a replica
}

void Demo::start() {
  prepare_data_dir();
  gateway_port_ = o_.port != 0 ? o_.port : outlive::harness::free_port();
  if (outlive::harness::port_accepts(gateway_port_)) {
    throw std::runtime_error("port " + std::to_string(gateway_port_) +
                             " is in use on 127.0.0.1; stop what uses it or pass --port N");
  }
  std::cout << "starting the outlive demo in " << data_.string() << " (logs in " << logs_.string()
            << ")\n"
            << std::flush;
  start_services();
  // --auth jwt: the replicas' configs name the app's JWKS URL, so its port is chosen first.
  if (jwt()) app_port_ = outlive::harness::free_port();
  // --app-server ts: its channels' section and its ports go into the replicas' configs.
  if (ts()) prepare_ts_app();
  write_replica_configs();
  if (jwt() || ts()) {
    // A replica with auth.jwt fetches the key set before it serves (it does not start without
    // one): the app, its JWKS endpoint, runs first. The TypeScript server answers the replicas'
    // channel hooks: it runs first too.
    start_app();
    start_replicas();
  } else {
    start_replicas();
    start_app();
  }
  start_gateway();
}

void Demo::stop() {
  // The gateway first (fast shutdown closes the browsers' sockets), then the app, then the
  // replicas (SIGTERM: they release their claims and close sockets with 1012), then NATS and
  // Postgres.
  if (gateway_) gateway_->child.stop(SIGTERM, 10s);
  if (app_) app_->child.stop(SIGTERM, 10s);
  for (auto& r : replicas_) {
    if (r->child.pid() > 0 && r->child.running())
      kill(r->child.pid(), SIGTERM);  // both stop at once
  }
  for (auto& r : replicas_) r->child.stop(SIGTERM, 20s);
  gateway_.reset();
  app_.reset();
  replicas_.clear();
  nats_.reset();
  if (postgres_) postgres_->stop();
  postgres_.reset();
  if (!state_file_.empty()) {
    std::error_code ec;
    fs::remove(state_file_, ec);
    state_file_.clear();
  }
  if (temp_data_) {
    outlive::harness::remove_tree(data_.string());
    temp_data_ = false;
  }
}

std::optional<std::string> Demo::watch() {
  auto dead = [&](Proc& p) -> std::optional<std::string> {
    if (p.child.running()) return std::nullopt;
    return p.name + " " + exit_text(p.child.wait_for(0ms).value_or(0)) + "; its log (" + p.log +
           "):\n" + outlive::harness::tail_of_file(p.log, 2000);
  };
  if (gateway_) {
    if (auto d = dead(*gateway_)) return d;
  }
  if (app_) {
    if (auto d = dead(*app_)) return d;
  }
  int alive = 0;
  for (auto& r : replicas_) {
    if (auto d = dead(*r)) {
      if (std::find(dead_reported_.begin(), dead_reported_.end(), r->name) ==
          dead_reported_.end()) {
        dead_reported_.push_back(r->name);
        std::cerr << "warning: " << *d << "\nthe gateway sends the sockets to the other replica\n";
      }
    } else {
      ++alive;
    }
  }
  if (alive == 0 && !replicas_.empty()) return std::string("every replica has exited");
  return std::nullopt;
}

void Demo::check_ts_hooks() {
  std::cout << "check: the replicas called the TypeScript server's hooks (their /metrics) ... "
            << std::flush;
  std::map<std::string, double> ok;  // op -> calls answered 200 for channel warehouse
  for (const auto& r : replicas_) {
    const auto res = inventory::web::request("127.0.0.1", r->port, "GET", "/metrics", {}, {}, 5s);
    std::istringstream lines(res.body);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("outlive_hook_calls_total{", 0) != 0) continue;
      const auto close = line.rfind('}');
      const std::string labels = line.substr(0, close);
      if (labels.find("app=\"inventory\"") == std::string::npos ||
          labels.find("channel=\"warehouse\"") == std::string::npos ||
          labels.find("result=\"ok\"") == std::string::npos)
        continue;
      for (const char* op : {"keys", "authorize"}) {
        if (labels.find(std::string("op=\"") + op + "\"") != std::string::npos)
          ok[op] += std::stod(line.substr(close + 1));
      }
    }
  }
  if (ok["keys"] < 1 || ok["authorize"] < 1) {
    std::cout << "FAILED\n";
    throw std::runtime_error(
        "expected answered keys and authorize hook calls of channel warehouse, got keys " +
        std::to_string(ok["keys"]) + ", authorize " + std::to_string(ok["authorize"]));
  }
  std::cout << "ok (warehouse: keys " << ok["keys"] << ", authorize " << ok["authorize"] << ")\n";
}

void Demo::write_state(const std::string& file) {
  json replicas = json::array();
  for (size_t i = 0; i < replicas_.size(); ++i) {
    const auto& r = *replicas_[i];
    replicas.push_back({{"replica", "demo-r" + std::to_string(i + 1)},
                        {"pid", r.child.pid()},
                        {"port", r.port},
                        {"log", r.log}});
  }
  const json state = {
      {"pid", getpid()},
      {"url", gateway_url(o_.bind == "0.0.0.0" ? "127.0.0.1" : o_.bind)},
      {"gateway",
       {{"name", o_.gateway},
        {"port", gateway_port_},
        {"pid", gateway_->child.pid()},
        {"log", gateway_error_log_}}},
      {"app",
       {{"port", app_->port},
        {"pid", app_->child.pid()},
        {"log", app_->log},
        {"server", o_.app_server},
        {"hooks", ts() ? json(hooks_url()) : json(nullptr)}}},
      {"replicas", replicas},
      {"database", database_url_},
      {"nats", nats_->url()},
      {"data", data_.string()},
      {"logs", logs_.string()},
  };
  const fs::path path = fs::absolute(file);
  const fs::path tmp = path.string() + ".tmp";
  write_file(tmp, state.dump(2) + "\n");
  fs::rename(tmp, path);
  state_file_ = path;
}

void Demo::print_banner() const {
  std::string replicas;
  for (const auto& r : replicas_)
    replicas +=
        (replicas.empty() ? "" : ", ") + std::string("127.0.0.1:") + std::to_string(r->port);
  const fs::path cwd = fs::current_path();
  auto shown = [&](const fs::path& p) {
    const auto rel = p.lexically_relative(cwd);
    return (!rel.empty() && rel.native().rfind("..", 0) != 0) ? rel.string() : p.string();
  };
  const std::string host = o_.bind == "127.0.0.1" || o_.bind == "0.0.0.0" ? "localhost" : o_.bind;
  std::cout << "\n"
            << "outlive demo is running\n"
            << "\n"
            << "  open      " << gateway_url(host) << "\n"
            << "  sign in   one click on \"Sign in as ada (demo)\": a session for user:ada, member "
               "of the\n"
            << "            warehouses north and south. Open a second tab, press +1 in one, watch "
               "the other;\n"
            << "            \"Remove my access\" shows `revoked`.\n"
            << (jwt()
                    ? "  sockets   authenticate with a JWT from the app (POST /api/token: ES256, 5 "
                      "min), sent as\n            the socket's first message; the replicas "
                      "verify it with the app's key set,\n            " +
                          jwks_url() + "\n"
                    : "")
            << (ts() ? "  app       the TypeScript server of examples/inventory-ts (node): its "
                       "routes publish with\n            @outlive/server; the channels warehouse "
                       "and my_warehouses are hooks it\n            answers at " +
                           hooks_url() + "\n"
                     : "")
            << "  API key   curl -H 'Authorization: Bearer outlive-demo-key-ada' "
            << gateway_url(host) << "api/warehouses/north\n"
            << "\n"
            << "  gateway   " << o_.gateway << " on " << o_.bind << ":" << gateway_port_
            << ": /api/inventory/live -> replicas " << replicas << "; the rest -> "
            << (ts() ? "inventory-ts" : "inventory_demo")
            << " on 127.0.0.1:" << (app_ ? app_->port : 0) << "\n"
            << "  Postgres  " << database_url_ << "   (data in " << shown(data_ / "postgres")
            << ")\n"
            << "  NATS      " << (nats_ ? nats_->url() : "") << "   (store in "
            << shown(data_ / "nats") << ")\n"
            << "  logs      " << shown(logs_) << "/\n"
            << "\n"
            << "  Ctrl-C stops everything.\n"
            << std::endl;
}

// --test-gateway-config: the template rendered as the demo renders it, checked by the gateway
// itself (nginx -t, haproxy -c parse all of it and open no port, so nothing needs to listen at the
// sample addresses).
int test_gateway_config(const Options& o) {
  const fs::path dir = outlive::harness::make_temp_dir("outlive-gateway-");
  const std::string log = (dir / "check.log").string();
  int status = 0;
  try {
    const Gateway g = render_gateway(o, dir / o.gateway, {"127.0.0.1:8080", {8081, 8082}, 9000});
    outlive::harness::run_checked(g.test, log);
    std::cout << read_file(log) << o.gateway << ": the rendered " << g.config.filename().string()
              << " is valid\nOK\n";
  } catch (const std::exception& e) {
    std::cerr << "outlive_demo_run --test-gateway-config: " << e.what() << "\n";
    status = 1;
  }
  outlive::harness::remove_tree(dir.string());
  return status;
}

int run(const std::vector<std::string>& args) {
  Options options;
  try {
    options = parse_options(args);
  } catch (const std::exception& e) {
    std::cerr << "outlive_demo_run: " << e.what() << "\n" << kUsage;
    return 2;
  }
  if (options.test_gateway_config) return test_gateway_config(options);
  Demo demo(options);
  try {
    demo.start();
  } catch (const std::exception& e) {
    std::cerr << "\noutlive_demo_run: could not start: " << e.what() << "\n";
    demo.stop();
    return g_signal ? 130 : 1;
  }
  if (!options.state_file.empty()) {
    try {
      demo.write_state(options.state_file);
    } catch (const std::exception& e) {
      std::cerr << "outlive_demo_run: --state " << options.state_file << ": " << e.what() << "\n";
      demo.stop();
      return 1;
    }
  }
  if (options.check) {
    int status = 0;
    try {
      inventory::check_demo(demo.gateway_port(), options.auth == "jwt");
      if (options.app_server == "ts") demo.check_ts_hooks();
      std::cout << "OK\n" << std::flush;
    } catch (const std::exception& e) {
      std::cout << "FAILED\n" << std::flush;
      std::cerr << "outlive_demo_run --check: " << e.what() << "\n";
      status = 1;
    }
    demo.stop();
    return status;
  }
  demo.print_banner();
  while (!g_signal) {
    if (auto problem = demo.watch()) {
      std::cerr << "outlive_demo_run: " << *problem << "\nstopping\n";
      demo.stop();
      return 1;
    }
    std::this_thread::sleep_for(200ms);
  }
  std::cout << "\nstopping (" << strsignal(g_signal) << ") ..." << std::endl;
  demo.stop();
  std::cout << "stopped" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    std::cout << kUsage;
    return 0;
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return run(std::vector<std::string>(argv + 1, argv + argc));
}
