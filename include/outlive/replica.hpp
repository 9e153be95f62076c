#pragma once
// A replica run inside the application's process: what `outlive serve` runs (publisher, one
// window per app, the websocket server at /api/<app>/live), from the same configuration, plus the
// channels the application declares in code (outlive/channel.hpp).
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <outlive/channel.hpp>
#include <outlive/error.hpp>

namespace outlive {
namespace replica {
class Replica;
}

// Started by the constructor, stopped by stop() or the destructor. Not copyable; movable.
class Replica {
 public:
  // Starts a replica from a configuration file (SPEC 6.1; relative paths against its folder, then
  // OUTLIVE_DATABASE_URL, OUTLIVE_NATS_URL and OUTLIVE_LISTEN), serving `channels` beside the
  // file's SQL channels. Makes every start check of `outlive serve` (the outbox migrated, the
  // topics set up) and refuses code channels of an app the configuration does not list, or named
  // like a channel it declares: throws Error (invalid_input, not_migrated, database, nats) and
  // starts nothing.
  static Replica from_file(const std::string& config_path, std::vector<CodeChannel> channels = {});
  // The same from a configuration document (relative paths against the working directory);
  // `source` names it in error messages.
  explicit Replica(const nlohmann::json& config, std::vector<CodeChannel> channels = {},
                   const std::string& source = "config");
  Replica(Replica&&) noexcept;
  Replica& operator=(Replica&&) noexcept;
  ~Replica();  // stop()

  // The port the websocket server listens on (the configured one, or the one chosen for port 0).
  unsigned short port() const;
  // The topic's current position of `app` as a cursor, as LiveDefinition::cursor() reads it.
  std::string cursor(const std::string& app) const;
  // The SIGTERM path: stops claiming from the outbox and releases claims, closes every socket with
  // 1012 (the tabs reconnect elsewhere), waits for the code channels' running functions.
  // Idempotent.
  void stop();

 private:
  explicit Replica(std::unique_ptr<replica::Replica> impl);
  std::unique_ptr<replica::Replica> impl_;
};

}  // namespace outlive
