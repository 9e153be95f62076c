#pragma once
// A NATS connection with JetStream, and what outlive does with it: set up each app's stream,
// read it, publish to it asynchronously. nats.c stays behind this header.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "topic/connect_options.hpp"
#include "topic/cursor.hpp"

namespace outlive::topic {

// Fixed stream configuration (SPEC 4); only the replica count varies with the NATS deployment.
struct StreamSettings {
  int replicas = 1;
  int64_t max_bytes = 64ll * 1024 * 1024;
  std::chrono::seconds max_age = std::chrono::hours(24);
  std::chrono::seconds duplicate_window = std::chrono::minutes(2);
};

std::string subject_for(const std::string& app_id);      // cloud:live:<app>
std::string stream_name_for(const std::string& app_id);  // CLOUD_LIVE_<app>

struct StreamState {
  TopicIdentity identity;
  uint64_t first_sequence = 0;
  uint64_t last_sequence = 0;
  uint64_t messages = 0;
  uint64_t bytes = 0;
  int replicas = 0;
  int64_t max_bytes = 0;
  int64_t max_age_ns = 0;
  int64_t duplicate_window_ns = 0;
  bool file_storage = false;
  std::string leader;     // cluster only
  int current_peers = 0;  // cluster only: replicas (besides the leader) that are caught up
};

struct StoredMessage {
  uint64_t sequence = 0;
  std::string data;
  std::string msg_id;
};

struct PublishResult {
  uint64_t token = 0;
  bool ok = false;
  uint64_t sequence = 0;  // when ok
  std::string error;      // when not ok
  // NATS answered (an ack, or a refusal of the server), as opposed to nats.c giving up waiting.
  bool answered = false;
  // When the acknowledgement (or the error) reached this process, before any handler ran.
  std::chrono::system_clock::time_point acked_at{};
};

class Client {
 public:
  // Connects to any of `urls` (retrying while none answers up to `connect_timeout`), then
  // reconnects forever: an outage only delays publishing.
  Client(const std::vector<std::string>& urls, const std::string& name,
         std::chrono::milliseconds connect_timeout = std::chrono::seconds(10));
  // The same with credentials and TLS. A refusal that waiting cannot cure (authorization, TLS)
  // throws Error(nats) at once, naming it, instead of retrying until `connect_timeout`.
  Client(const std::vector<std::string>& urls, const std::string& name,
         const ConnectOptions& options,
         std::chrono::milliseconds connect_timeout = std::chrono::seconds(10));
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Creates the app's stream, or updates it to the fixed configuration. Retries while JetStream
  // is not ready (a cluster electing its leader) up to `timeout`.
  StreamState ensure_stream(const std::string& app_id, const StreamSettings& settings,
                            std::chrono::milliseconds timeout = std::chrono::seconds(30));
  // The stream's state. With `retry_for`, retried as ensure_stream is while JetStream cannot
  // answer yet (a cluster electing its leader answers the first call with a timeout).
  StreamState stream_state(const std::string& app_id,
                           std::chrono::milliseconds retry_for = std::chrono::milliseconds(0));
  void delete_stream(const std::string& app_id);
  // The topic's head as a cursor (SPEC 2.2 cursor()).
  std::string head_cursor(const std::string& app_id);
  // Messages from `from_sequence` on (skipping deleted ones), at most `max`.
  std::vector<StoredMessage> read(const std::string& app_id, uint64_t from_sequence, size_t max);

  // Asynchronous JetStream publishing. `on_result` runs on a nats.c thread, once per publish that
  // returned true, unless the publish was forgotten first (see forget()).
  using ResultHandler = std::function<void(const PublishResult&)>;
  void set_publish_handler(ResultHandler on_result);
  // Returns an error text when the publish failed at once (nothing will be reported for it).
  std::optional<std::string> publish_async(
      const std::string& subject, std::string_view data, const std::string& msg_id, uint64_t token,
      std::chrono::milliseconds timeout,
      const std::vector<std::pair<std::string, std::string>>& headers = {});
  // Drops a pending publish (it timed out on our side): a late answer is not reported.
  void forget(const std::string& msg_id);
  bool connected() const;
  // How many times the connection was lost and made again. nats.c does not send a publish again
  // on a new connection: one written to the old one just before it broke never gets its answer
  // (docs/ARCHITECTURE.md "The publisher loop").
  uint64_t reconnects() const;

  struct Impl;

 private:
  // Shared so that ~Client can leave it to a callback nats.c may still be running (see there).
  std::shared_ptr<Impl> impl_;
};

// Waits up to `timeout` for nats.c's own threads (message dispatchers, timers, reconnects) to
// end; call once every Client is destroyed, just before the process exits. Without it the exit
// runs nats.c's teardown (atexit) while those threads may still be unwinding. False when they
// did not end in time.
bool close_library(std::chrono::milliseconds timeout);

}  // namespace outlive::topic
