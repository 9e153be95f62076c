#pragma once
// Shared pieces of the publisher tests: writers that commit numbered updates per key in commit
// order, a replica run as a real `outlive serve` process, and reading a topic back per key.
#include <atomic>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "harness/process.hpp"
#include "support/services.hpp"
#include "topic/client.hpp"

namespace outlive::testing {

// Each update carries {"n": N}; N comes from a counter row of its key locked in the same
// transaction, so N increases in commit order per key.
inline void create_counters(const std::string& url, const std::vector<std::string>& keys) {
  pqxx::connection c(url);
  pqxx::work tx(c);
  tx.exec("CREATE TABLE IF NOT EXISTS counters (key text PRIMARY KEY, n integer NOT NULL)");
  for (const auto& k : keys)
    tx.exec_params("INSERT INTO counters VALUES ($1, 0) ON CONFLICT DO NOTHING", k);
  tx.commit();
}

inline int write_numbered(pqxx::connection& c, const std::string& app, const std::string& key,
                          bool wake) {
  pqxx::work tx(c);
  const int n =
      tx.exec_params1("UPDATE counters SET n = n + 1 WHERE key = $1 RETURNING n", key)[0].as<int>();
  tx.exec_params("SELECT events.publish_live($1, $2, jsonb_build_object('n', $3::int))", app, key,
                 n);
  tx.commit();
  if (wake) pqxx::nontransaction(c).exec_params("SELECT events.wake($1)", app);
  return n;
}

// `writers` threads commit `total` updates spread over `keys` at random.
class Writers {
 public:
  Writers(std::string url, std::string app, std::vector<std::string> keys, int writers, int total)
      : url_(std::move(url)), app_(std::move(app)), keys_(std::move(keys)) {
    for (int w = 0; w < writers; ++w) {
      const int share = total / writers + (w < total % writers ? 1 : 0);
      threads_.emplace_back([this, w, share] {
        pqxx::connection c(url_);
        std::mt19937 rng(w + 1);
        for (int i = 0; i < share && !stop_; ++i) {
          write_numbered(c, app_, keys_[rng() % keys_.size()], i % 25 == 0);
          committed_++;
        }
      });
    }
  }
  ~Writers() {
    stop_ = true;
    join();
  }
  void join() {
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  int committed() const { return committed_; }

 private:
  std::string url_, app_;
  std::vector<std::string> keys_;
  std::vector<std::thread> threads_;
  std::atomic<int> committed_{0};
  std::atomic<bool> stop_{false};
};

struct TopicContents {
  std::map<std::string, std::vector<int>> numbers_by_key;  // in stream order
  size_t messages = 0;
  std::map<std::string, int> copies_of_msg_id;
};

inline TopicContents read_topic(topic::Client& client, const std::string& app) {
  TopicContents out;
  for (const auto& m : client.read(app, 1, 1'000'000)) {
    const auto envelope = nlohmann::json::parse(m.data);
    out.messages++;
    out.copies_of_msg_id[m.msg_id]++;
    if (envelope.contains("d") && envelope["d"].contains("n")) {
      out.numbers_by_key[envelope["k"].get<std::string>()].push_back(envelope["d"]["n"].get<int>());
    }
  }
  return out;
}

inline int64_t outbox_count(const std::string& url, const std::string& where = "true") {
  pqxx::connection c(url);
  pqxx::nontransaction tx(c);
  return tx.exec("SELECT count(*) FROM events.outbox WHERE " + where)[0][0].as<int64_t>();
}

inline uint64_t stream_messages(topic::Client& client, const std::string& app) {
  try {
    return client.stream_state(app).messages;
  } catch (const std::exception&) {
    return 0;
  }
}

// Every committed update is on the topic exactly once, and each key's numbers run 1, 2, 3, ...
inline void require_complete_and_ordered(const TopicContents& t, const std::string& url, size_t expected) {
  pqxx::connection c(url);
  pqxx::nontransaction tx(c);
  size_t total = 0;
  for (const auto& row : tx.exec("SELECT key, n FROM counters ORDER BY key")) {
    const auto key = row[0].as<std::string>();
    const int n = row[1].as<int>();
    total += n;
    const auto it = t.numbers_by_key.find(key);
    const std::vector<int> got = it == t.numbers_by_key.end() ? std::vector<int>{} : it->second;
    std::vector<int> want(n);
    for (int i = 0; i < n; ++i) want[i] = i + 1;
    INFO("key " << key);
    REQUIRE(got.size() == want.size());
    REQUIRE(got == want);
  }
  CHECK(total == expected);
  CHECK(t.messages == expected);
  for (const auto& [id, copies] : t.copies_of_msg_id) REQUIRE(copies == 1);
}

// A replica as a real `outlive serve` process.
class ReplicaProcess {
 public:
  ReplicaProcess(const std::string& config_path, const std::string& name)
      : log_(harness::make_temp_dir("outlive-replica-") + "/" + name + ".log"),
        process_({outlive_binary(), "serve", "--config", config_path}, log_) {}
  harness::ChildProcess& process() { return process_; }
  std::string log_tail() const { return harness::tail_of_file(log_, 6000); }
  const std::string& log_path() const { return log_; }

 private:
  std::string log_;
  harness::ChildProcess process_;
};

// Backend pids that own partitions of `app`, with how many each (sql/005 events.partition_owners).
inline std::map<int, int> owners_by_pid(const std::string& url, const std::string& app) {
  pqxx::connection c(url);
  std::map<int, int> out;
  for (const auto& r : pqxx::nontransaction(c).exec_params(
           "SELECT owner_pid FROM events.partition_owners($1) WHERE owner_pid IS NOT NULL", app))
    out[r[0].as<int>()]++;
  return out;
}

// The HTTP port a replica logged when it started listening.
inline int port_of_replica(const ReplicaProcess& r) {
  std::ifstream in(r.log_path());
  for (std::string line; std::getline(in, line);) {
    const auto doc = nlohmann::json::parse(line, nullptr, false);
    if (doc.is_object() && doc.value("msg", "") == "listening") return doc.value("port", 0);
  }
  return 0;
}

}  // namespace outlive::testing
