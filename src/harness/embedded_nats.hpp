#pragma once
#include <memory>
#include <string>
#include <vector>

#include "harness/process.hpp"

namespace outlive::harness {

struct NatsOptions {
  int port = 0;             // 0: a free port
  std::string store_dir;    // empty: a temp dir removed with the server
  std::string server_name;  // empty: derived from the port
  int max_payload = 0;      // 0: server default (1 MiB)
  // cluster: our route port and the route ports of the peers ("nats-route://127.0.0.1:P")
  std::string cluster_name;
  int cluster_port = 0;
  std::vector<int> peer_cluster_ports;
  // Clients must authenticate (`authorization {}`): with this user and password, this token or
  // the seed of this nkey.
  std::string user;
  std::string password;
  std::string token;
  std::string nkey;  // a user's public nkey (U...): `authorization { users: [{nkey}] }`
  // Clients must speak TLS with this certificate; with `tls_verify` they must also present a
  // certificate signed by `tls_ca_file`.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_ca_file;
  bool tls_verify = false;
};

// A real nats-server with JetStream on 127.0.0.1, ready when the constructor returns.
class EmbeddedNats {
 public:
  explicit EmbeddedNats(NatsOptions options = {});
  ~EmbeddedNats();
  EmbeddedNats(const EmbeddedNats&) = delete;
  EmbeddedNats& operator=(const EmbeddedNats&) = delete;

  int port() const { return options_.port; }
  std::string url() const {
    return (options_.tls_cert_file.empty() ? "nats://127.0.0.1:" : "tls://127.0.0.1:") +
           std::to_string(options_.port);
  }
  bool running() { return server_.running(); }
  pid_t pid() const { return server_.pid(); }  // (SIGSTOP: a server that stops answering)
  // Stops the server (SIGTERM, or SIGKILL when `kill`), keeping its store and port.
  void stop(bool kill = false);
  // Starts it again on the same port with the same store.
  void start();

 private:
  NatsOptions options_;
  std::string dir_;
  std::string config_;
  ChildProcess server_;
};

// Three (or n) nats-server processes on loopback forming one JetStream cluster.
class EmbeddedNatsCluster {
 public:
  explicit EmbeddedNatsCluster(int size = 3);
  EmbeddedNats& node(int i) { return *nodes_.at(i); }
  int size() const { return static_cast<int>(nodes_.size()); }
  std::vector<std::string> urls() const;

 private:
  std::vector<std::unique_ptr<EmbeddedNats>> nodes_;
};

}  // namespace outlive::harness
