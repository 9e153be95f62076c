// compose:schema: validates compose.yaml against the Compose Specification's JSON Schema (draft 7,
// ../shared/data/compose-spec.json) with the project's validator, then checks the deployment the
// project relies on (SPEC 6): Postgres, a 3-node JetStream cluster, a one-shot migrate, two
// replicas that start after it, the demo's tables, the demo app and the nginx gateway, and the
// files they mount.
//
//   compose_check --source DIR --spec compose-spec.json [--compose FILE] [--python python3]
//
// YAML is read by tests/compose/yaml_to_json.py (python3-yaml): there is no YAML library among the
// C++ dependencies. Exit 0: valid; 1: a failure (each one printed); 2: usage; 77: the schema file
// is missing (CTest SKIP_RETURN_CODE).
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "schema/validator.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kSkip = 77;

std::vector<std::string> failures;

void fail(const std::string& what) { failures.push_back(what); }

std::optional<std::string> read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs the converter; stderr (the YAML error, with line and column) goes to the test output.
std::optional<json> yaml_to_json(const std::string& python, const fs::path& converter,
                                 const fs::path& yaml) {
  const std::string cmd = shell_quote(python) + " " + shell_quote(converter.string()) + " " +
                          shell_quote(yaml.string());
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) return std::nullopt;
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  const int status = ::pclose(pipe);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  try {
    return json::parse(out);
  } catch (const json::exception& e) {
    std::cerr << "the converter printed something that is not JSON: " << e.what() << "\n";
    return std::nullopt;
  }
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// A command or healthcheck test, as a list of words (the string form is split on spaces).
std::vector<std::string> words(const json& value) {
  std::vector<std::string> out;
  if (value.is_string()) {
    std::stringstream ss(value.get<std::string>());
    for (std::string w; ss >> w;) out.push_back(w);
  } else if (value.is_array()) {
    for (const auto& w : value) out.push_back(w.is_string() ? w.get<std::string>() : w.dump());
  }
  return out;
}

bool contains(const std::vector<std::string>& list, const std::string& word) {
  for (const auto& w : list) {
    if (w == word) return true;
  }
  return false;
}

// The value after `flag` (any of its spellings) in a command.
std::optional<std::string> flag_value(const std::vector<std::string>& cmd,
                                      std::initializer_list<const char*> flags) {
  for (size_t i = 0; i + 1 < cmd.size(); ++i) {
    for (const char* f : flags) {
      if (cmd[i] == f) return cmd[i + 1];
    }
  }
  return std::nullopt;
}

std::string joined(const std::vector<std::string>& list) {
  std::string out;
  for (const auto& w : list) out += (out.empty() ? "" : " ") + w;
  return out;
}

std::optional<std::string> env(const json& service, const std::string& name) {
  if (!service.contains("environment")) return std::nullopt;
  const auto& e = service["environment"];
  if (e.is_object()) {
    if (e.contains(name) && e[name].is_string()) return e[name].get<std::string>();
    if (e.contains(name) && e[name].is_number()) return e[name].dump();
    return std::nullopt;
  }
  for (const auto& item : e) {
    if (!item.is_string()) continue;
    const auto s = item.get<std::string>();
    if (s.rfind(name + "=", 0) == 0) return s.substr(name.size() + 1);
  }
  return std::nullopt;
}

// depends_on in either form; the list form means condition service_started.
std::map<std::string, std::string> depends_on(const json& service) {
  std::map<std::string, std::string> out;
  if (!service.contains("depends_on")) return out;
  const auto& d = service["depends_on"];
  if (d.is_array()) {
    for (const auto& name : d) out[name.get<std::string>()] = "service_started";
  } else if (d.is_object()) {
    for (const auto& [name, spec] : d.items())
      out[name] = spec.value("condition", "service_started");
  }
  return out;
}

struct Mount {
  std::string type;  // "bind" or "volume"
  std::string source;
  std::string target;
};

std::vector<Mount> mounts(const json& service) {
  std::vector<Mount> out;
  if (!service.contains("volumes")) return out;
  for (const auto& v : service["volumes"]) {
    if (v.is_object()) {
      out.push_back({v.value("type", "volume"), v.value("source", ""), v.value("target", "")});
      continue;
    }
    const auto parts = split(v.get<std::string>(), ':');
    if (parts.size() < 2) {
      out.push_back({"volume", "", parts.empty() ? "" : parts[0]});  // anonymous volume
      continue;
    }
    const bool path =
        parts[0].rfind(".", 0) == 0 || parts[0].rfind("/", 0) == 0 || parts[0].rfind("~", 0) == 0;
    out.push_back({path ? "bind" : "volume", parts[0], parts[1]});
  }
  return out;
}

std::optional<Mount> mount_at(const json& service, const std::string& target) {
  for (const auto& m : mounts(service)) {
    if (m.target == target) return m;
  }
  return std::nullopt;
}

void expect_condition(const std::string& who, const json& service, const std::string& dep,
                      const std::string& condition) {
  const auto deps = depends_on(service);
  const auto it = deps.find(dep);
  if (it == deps.end()) {
    fail(who + ": must depend on " + dep + " (condition " + condition + ")");
  } else if (it->second != condition) {
    fail(who + ": depends on " + dep + " with condition " + it->second + ", expected " + condition);
  }
}

std::string image(const json& service) { return service.value("image", ""); }

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
  if (argc % 2 == 0 || !args.count("--source") || !args.count("--spec")) {
    std::cerr << "usage: compose_check --source DIR --spec compose-spec.json [--compose FILE] "
                 "[--python python3]\n";
    return 2;
  }
  const fs::path source = args["--source"];
  const fs::path spec_path = args["--spec"];
  const fs::path compose_path =
      args.count("--compose") ? fs::path(args["--compose"]) : source / "compose.yaml";
  const std::string python = args.count("--python") ? args["--python"] : "python3";

  if (!fs::exists(spec_path)) {
    std::cout << "SKIP: the Compose Specification schema is missing: " << spec_path.string()
              << " (compose.yaml is not validated)\n";
    return kSkip;
  }

  // 1. The Compose Specification.
  json spec;
  try {
    spec = json::parse(*read_text(spec_path));
  } catch (const std::exception& e) {
    std::cerr << spec_path.string() << ": not JSON: " << e.what() << "\n";
    return 1;
  }
  const auto compose_opt =
      yaml_to_json(python, source / "tests/compose/yaml_to_json.py", compose_path);
  if (!compose_opt) {
    std::cerr << "FAIL: " << compose_path.string() << " could not be read as YAML (see above)\n";
    return 1;
  }
  const json& compose = *compose_opt;
  try {
    const outlive::schema::Validator validator(spec);
    if (auto failure = validator.check(compose)) {
      std::cerr << "FAIL: " << compose_path.string()
                << " does not follow the Compose Specification: " << *failure << "\n";
      return 1;
    }
  } catch (const std::exception& e) {
    std::cerr << "FAIL: " << spec_path.string() << ": " << e.what() << "\n";
    return 1;
  }
  std::cout << compose_path.string() << ": valid against " << spec_path.filename().string() << "\n";

  // 2. What Compose checks beyond the schema: references between services, volumes, bind mounts.
  if (!compose.contains("services") || !compose["services"].is_object()) {
    std::cerr << "FAIL: no services\n";
    return 1;
  }
  const json& services = compose["services"];
  const json volumes = compose.value("volumes", json::object());
  for (const auto& [name, service] : services.items()) {
    for (const auto& [dep, _] : depends_on(service)) {
      if (!services.contains(dep)) fail(name + ": depends on " + dep + ", which is not a service");
    }
    for (const auto& m : mounts(service)) {
      if (m.type == "volume" && !m.source.empty() &&
          (volumes.is_null() || !volumes.contains(m.source))) {
        fail(name + ": volume " + m.source + " is not declared under the top-level volumes");
      }
      if (m.type == "bind" && m.source.rfind("./", 0) == 0 &&
          !fs::exists(compose_path.parent_path() / m.source)) {
        fail(name + ": mounts " + m.source + ", which does not exist");
      }
    }
    if (service.contains("build")) {
      const auto& b = service["build"];
      const fs::path context = compose_path.parent_path() /
                               (b.is_string() ? b.get<std::string>() : b.value("context", "."));
      const std::string dockerfile =
          b.is_object() ? b.value("dockerfile", "Dockerfile") : "Dockerfile";
      if (!fs::exists(context / dockerfile))
        fail(name + ": builds from " + (context / dockerfile).string() + ", which does not exist");
    }
  }

  // 3. The deployment (SPEC 6).
  for (const char* name : {"postgres", "nats-1", "nats-2", "nats-3", "migrate", "replica-1",
                           "replica-2", "demo-schema", "demo", "gateway"}) {
    if (!services.contains(name)) fail(std::string("service ") + name + " is missing");
  }
  if (!failures.empty()) {
    for (const auto& f : failures) std::cerr << "FAIL: " << f << "\n";
    return 1;
  }

  const json& postgres = services["postgres"];
  if (image(postgres).rfind("postgres:15", 0) != 0)
    fail("postgres: image must be postgres:15-*, not " + image(postgres));
  if (!contains(words(postgres.value("healthcheck", json::object()).value("test", json())),
                "pg_isready")) {
    fail("postgres: the healthcheck must run pg_isready");
  }

  // JetStream cluster: three nodes, one cluster name, unique server names, routes to the others.
  std::set<std::string> cluster_names, server_names;
  for (int i = 1; i <= 3; ++i) {
    const std::string node = "nats-" + std::to_string(i);
    const json& s = services[node];
    const auto cmd = words(s.value("command", json()));
    if (image(s).rfind("nats:2.9", 0) != 0)
      fail(node + ": image must be nats:2.9*, not " + image(s));
    if (!contains(cmd, "-js") && !contains(cmd, "--jetstream"))
      fail(node + ": JetStream is not enabled (-js)");
    const auto cluster = flag_value(cmd, {"--cluster_name"});
    if (!cluster)
      fail(node + ": no --cluster_name");
    else
      cluster_names.insert(*cluster);
    if (!flag_value(cmd, {"--cluster"})) fail(node + ": no --cluster listen URL");
    const auto name = flag_value(cmd, {"--name", "-n", "--server_name"});
    if (!name)
      fail(node + ": no server name (--name)");
    else
      server_names.insert(*name);
    const auto routes = flag_value(cmd, {"--routes", "-routes"});
    for (int j = 1; j <= 3; ++j) {
      const std::string other = "nats-" + std::to_string(j) + ":6222";
      const bool routed = routes && routes->find(other) != std::string::npos;
      if (j != i && !routed) fail(node + ": no route to " + other);
      if (j == i && routed) fail(node + ": routes to itself");
    }
    // Anyone who can publish to cloud:live:<app> injects updates (SPEC 6, rev 3).
    if (!flag_value(cmd, {"--user"}) || !flag_value(cmd, {"--pass"}))
      fail(node + ": NATS must require credentials (--user, --pass)");
    const auto store = flag_value(cmd, {"--store_dir", "-sd"});
    if (!store)
      fail(node + ": no --store_dir");
    else if (auto m = mount_at(s, *store); !m || m->type != "volume")
      fail(node + ": --store_dir " + *store + " is not on a named volume");
  }
  if (cluster_names.size() != 1) fail("nats: the three nodes must share one cluster name");
  if (server_names.size() != 3) fail("nats: the three nodes need three different server names");

  // migrate: one shot, before everything that uses the outbox.
  const json& migrate = services["migrate"];
  const auto migrate_cmd = words(migrate.value("command", json()));
  const auto database = flag_value(migrate_cmd, {"--database"});
  if (migrate_cmd.size() < 2 || migrate_cmd[0] != "outlive" || migrate_cmd[1] != "migrate" ||
      !database) {
    fail("migrate: the command must be `outlive migrate --database URL`, not `" +
         joined(migrate_cmd) + "`");
  }
  if (migrate.value("restart", "") != "no") fail("migrate: restart must be \"no\" (it runs once)");
  expect_condition("migrate", migrate, "postgres", "service_healthy");

  // The replicas.
  std::set<std::string> replica_names;
  for (const char* name : {"replica-1", "replica-2"}) {
    const std::string who = name;
    const json& r = services[who];
    const auto cmd = words(r.value("command", json()));
    if (cmd !=
        std::vector<std::string>{"outlive", "serve", "--config", "/etc/outlive/outlive.json"}) {
      fail(who + ": the command must be `outlive serve --config /etc/outlive/outlive.json`, not `" +
           joined(cmd) + "`");
    }
    expect_condition(who, r, "migrate", "service_completed_successfully");
    expect_condition(who, r, "postgres", "service_healthy");
    if (!contains(words(r.value("healthcheck", json::object()).value("test", json())),
                  "http://127.0.0.1:8080/readyz")) {
      fail(who + ": the healthcheck must GET http://127.0.0.1:8080/readyz");
    }
    const auto db = env(r, "OUTLIVE_DATABASE_URL");
    if (!db)
      fail(who + ": OUTLIVE_DATABASE_URL is not set");
    else if (database && *db != *database)
      fail(who + ": OUTLIVE_DATABASE_URL is not the database migrate prepares");
    const auto nats = env(r, "OUTLIVE_NATS_URL");
    if (!nats) {
      fail(who + ": OUTLIVE_NATS_URL is not set");
    } else {
      for (int i = 1; i <= 3; ++i) {
        if (!contains(split(*nats, ','), "nats://nats-" + std::to_string(i) + ":4222")) {
          fail(who + ": OUTLIVE_NATS_URL does not list nats://nats-" + std::to_string(i) + ":4222");
        }
      }
    }
    const auto listen = env(r, "OUTLIVE_LISTEN");
    if (listen != "0.0.0.0:8080")
      fail(who + ": OUTLIVE_LISTEN must be 0.0.0.0:8080 (the gateway's upstream port)");
    const auto config_mount = mount_at(r, "/etc/outlive/outlive.json");
    if (!config_mount || config_mount->type != "bind") {
      fail(who + ": no configuration file mounted at /etc/outlive/outlive.json");
      continue;
    }
    const fs::path config_path =
        (compose_path.parent_path() / config_mount->source).lexically_normal();
    const auto text = read_text(config_path);
    if (!text) {
      fail(who + ": cannot read " + config_path.string());
      continue;
    }
    try {
      const auto config = outlive::config::parse(json::parse(*text), config_path.string());
      replica_names.insert(config.replica);
      if (config.nats_options.user.empty() || config.nats_options.password_file.empty())
        fail(who + ": " + config_path.string() +
             ": nats_options must name the NATS user and its password_file");
      if (config.topic_replicas != 3)
        fail(who + ": " + config_path.string() + ": topic replicas must be 3 (a 3-node cluster)");
      for (const auto& [app, a] : config.apps) {
        bool origin = false;
        for (const auto& o : a.allowed_origins) origin = origin || o == "http://localhost:8080";
        if (!origin)
          fail(who + ": " + config_path.string() + ": app " + app +
               " does not allow the origin http://localhost:8080");
        if (!a.event_schema.empty() && a.event_schema.rfind("/opt/outlive/schemas/", 0) == 0 &&
            !fs::exists(source / "schemas" / fs::path(a.event_schema).filename())) {
          fail(who + ": " + config_path.string() + ": event_schema " + a.event_schema +
               " is not in schemas/ (the image copies schemas/ there)");
        }
      }
    } catch (const std::exception& e) {
      fail(who + ": " + e.what());
    }
  }
  if (replica_names.size() != 2)
    fail("replica-1 and replica-2 must have different `replica` names (claims are held per name)");

  // The demo's tables: examples/inventory/schema.sql, once, after the migrations.
  const json& demo_schema = services["demo-schema"];
  if (!contains(words(demo_schema.value("command", json())), "/opt/outlive/schema.sql") ||
      !mount_at(demo_schema, "/opt/outlive/schema.sql") ||
      mount_at(demo_schema, "/opt/outlive/schema.sql")->source !=
          "./examples/inventory/schema.sql") {
    fail(
        "demo-schema: must apply ./examples/inventory/schema.sql (mounted at "
        "/opt/outlive/schema.sql)");
  }
  if (demo_schema.value("restart", "") != "no")
    fail("demo-schema: restart must be \"no\" (it runs once)");
  expect_condition("demo-schema", demo_schema, "migrate", "service_completed_successfully");

  // The demo app.
  const json& demo = services["demo"];
  const auto demo_cmd = words(demo.value("command", json()));
  if (demo_cmd.empty() || demo_cmd[0] != "inventory_demo")
    fail("demo: the command must run inventory_demo");
  if (flag_value(demo_cmd, {"--listen"}) != "0.0.0.0:8081")
    fail("demo: --listen must be 0.0.0.0:8081");
  if (flag_value(demo_cmd, {"--database"}) != database)
    fail("demo: --database must be the database migrate prepares");
  if (!flag_value(demo_cmd, {"--nats"})) fail("demo: no --nats");
  if (flag_value(demo_cmd, {"--static"}) != "/opt/outlive/web")
    fail("demo: --static must be /opt/outlive/web");
  expect_condition("demo", demo, "migrate", "service_completed_successfully");
  expect_condition("demo", demo, "demo-schema", "service_completed_successfully");

  // The gateway.
  const json& gateway = services["gateway"];
  if (image(gateway).rfind("nginx", 0) != 0)
    fail("gateway: image must be nginx, not " + image(gateway));
  bool published = false;
  for (const auto& p : gateway.value("ports", json::array())) {
    published =
        published || (p.is_string() && p.get<std::string>() == "8080:80") ||
        (p.is_object() && p.value("published", json()).dump().find("8080") != std::string::npos &&
         p.value("target", 0) == 80);
  }
  if (!published)
    fail("gateway: must publish port 8080 (the allowed origin http://localhost:8080) to 80");
  expect_condition("gateway", gateway, "replica-1", "service_healthy");
  expect_condition("gateway", gateway, "replica-2", "service_healthy");
  if (const auto m = mount_at(gateway, "/etc/nginx/nginx.conf"); !m || m->type != "bind") {
    fail("gateway: no nginx.conf mounted at /etc/nginx/nginx.conf");
  } else if (const auto conf = read_text(compose_path.parent_path() / m->source); !conf) {
    fail("gateway: cannot read " + m->source);
  } else {
    // A block's text, from its opening line to its closing brace (these blocks nest nothing).
    const auto block = [&](const std::string& opening) -> std::optional<std::string> {
      const auto at = conf->find(opening);
      if (at == std::string::npos) return std::nullopt;
      return conf->substr(at, conf->find('}', at + opening.size()) - at);
    };
    const auto expect = [&](const std::string& opening, std::initializer_list<const char*> lines) {
      const auto text = block(opening);
      if (!text) return fail("gateway: " + m->source + " has no `" + opening + "`");
      for (const char* line : lines) {
        if (text->find(line) == std::string::npos)
          fail("gateway: " + m->source + ": `" + opening + "` lacks `" + line + "`");
      }
    };
    expect("upstream outlive_replicas {", {"server replica-1:8080", "server replica-2:8080"});
    expect("upstream outlive_app {", {"server demo:8081"});
    expect("location ~ \"^/api/[a-z0-9][a-z0-9-]{0,62}/live$\" {",
           {"proxy_pass http://outlive_replicas;", "proxy_http_version 1.1;",
            "proxy_set_header Upgrade $http_upgrade;",
            "proxy_set_header Connection $connection_upgrade;", "proxy_read_timeout 1h;"});
    expect("location ~ \"^/api/[a-z0-9][a-z0-9-]{0,62}/live/cursor$\" {",
           {"proxy_pass http://outlive_replicas;"});
    expect("location / {", {"proxy_pass http://outlive_app;"});
  }

  // The image builds every program the services run.
  if (const auto dockerfile = read_text(source / "Dockerfile"); !dockerfile) {
    fail("Dockerfile is missing");
  } else {
    size_t froms = 0;
    for (size_t at = 0;
         (at = dockerfile->find("FROM debian:bookworm-slim", at)) != std::string::npos; ++at)
      ++froms;
    if (froms < 2)
      fail("Dockerfile: build and runtime stages must both be FROM debian:bookworm-slim");
    const auto target = dockerfile->find("--target ");
    std::vector<std::string> targets;
    if (target != std::string::npos) {
      std::stringstream line(
          dockerfile->substr(target + 9, dockerfile->find('\n', target) - target - 9));
      for (std::string w; line >> w && w.rfind("-", 0) != 0;) targets.push_back(w);
    }
    for (const auto& [name, service] : services.items()) {
      if (!service.contains("build")) continue;
      const auto cmd = words(service.value("command", json()));
      if (!cmd.empty() && !contains(targets, cmd[0]))
        fail("Dockerfile: does not build " + cmd[0] + " (run by " + name + ")");
    }
  }

  if (!failures.empty()) {
    for (const auto& f : failures) std::cerr << "FAIL: " << f << "\n";
    return 1;
  }
  std::cout << compose_path.filename().string()
            << ": postgres, nats-1..3 (JetStream cluster), migrate, replica-1, replica-2, "
               "demo-schema, demo, gateway: ok\n";
  return 0;
}
