#pragma once
// Real services for integration tests: one PostgreSQL per test binary (a fresh database per test)
// and nats-servers per test. All are child processes torn down at exit, also when a test fails.
#include <chrono>
#include <functional>
#include <string>

#include "harness/embedded_nats.hpp"
#include "harness/embedded_postgres.hpp"

namespace outlive::testing {

harness::EmbeddedPostgres& postgres();
// A new, empty database; migrated unless `migrated` is false.
std::string fresh_database(bool migrated = true);

std::string source_path(const std::string& relative);  // a file of the repository
std::string outlive_binary();

// Polls `condition` until it holds or `timeout` passes; returns whether it held.
bool eventually(const std::function<bool()>& condition,
                std::chrono::milliseconds timeout = std::chrono::seconds(10),
                std::chrono::milliseconds step = std::chrono::milliseconds(10));

// Writes a replica config for `apps` to a temp file and returns its path.
std::string write_config(const std::string& database_url, const std::vector<std::string>& nats_urls,
                         const std::string& replica, const std::vector<std::string>& apps,
                         const std::string& publisher_json = "{}", int topic_replicas = 1);

}  // namespace outlive::testing
