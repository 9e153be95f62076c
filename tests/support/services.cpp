#include "support/services.hpp"

#include <atomic>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "harness/process.hpp"
#include "outbox/migrate.hpp"

namespace outlive::testing {

harness::EmbeddedPostgres& postgres() {
  static harness::EmbeddedPostgres instance;
  return instance;
}

std::string fresh_database(bool migrated) {
  static std::atomic<int> counter{0};
  const std::string name = "t" + std::to_string(getpid()) + "_" + std::to_string(++counter);
  const std::string url = postgres().create_database(name);
  if (migrated) outbox::migrate(url);
  return url;
}

std::string source_path(const std::string& relative) {
  return std::string(OUTLIVE_SOURCE_DIR) + "/" + relative;
}
std::string outlive_binary() { return OUTLIVE_BINARY; }

bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout,
                std::chrono::milliseconds step) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (condition()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(step);
  }
}

std::string write_config(const std::string& database_url, const std::vector<std::string>& nats_urls,
                         const std::string& replica, const std::vector<std::string>& apps,
                         const std::string& publisher_json, int topic_replicas) {
  nlohmann::json doc = {{"replica", replica},
                        {"listen", "127.0.0.1:0"},  // any free port: several replicas run at once
                        {"database", database_url},
                        {"nats", nats_urls},
                        {"topic", {{"replicas", topic_replicas}}},
                        {"publisher", nlohmann::json::parse(publisher_json)},
                        {"apps", nlohmann::json::object()}};
  for (const auto& app : apps) doc["apps"][app] = nlohmann::json::object();
  static std::atomic<int> counter{0};
  static const std::string dir = harness::make_temp_dir("outlive-test-config-");
  const std::string path = dir + "/" + replica + "-" + std::to_string(++counter) + ".json";
  std::ofstream(path) << doc.dump(2);
  return path;
}

}  // namespace outlive::testing
