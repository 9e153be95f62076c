#include "harness/embedded_nats.hpp"

#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/error.hpp"

namespace outlive::harness {
namespace {

std::string nats_server_binary() {
  for (const char* path :
       {"/usr/bin/nats-server", "/usr/sbin/nats-server", "/usr/local/bin/nats-server"}) {
    if (std::filesystem::exists(path)) return path;
  }
  throw Error(Errc::internal, "nats-server not found (apt-get install nats-server)");
}

}  // namespace

EmbeddedNats::EmbeddedNats(NatsOptions options) : options_(std::move(options)) {
  dir_ = make_temp_dir("outlive-nats-");
  if (options_.store_dir.empty()) options_.store_dir = dir_ + "/store";
  if (options_.port == 0) options_.port = free_port();
  if (options_.server_name.empty()) options_.server_name = "n" + std::to_string(options_.port);
  config_ = dir_ + "/nats.conf";
  std::ofstream conf(config_);
  conf << "server_name: \"" << options_.server_name << "\"\n"
       << "listen: \"127.0.0.1:" << options_.port << "\"\n"
       << "jetstream { store_dir: \"" << options_.store_dir << "\" }\n";
  if (options_.max_payload > 0) conf << "max_payload: " << options_.max_payload << "\n";
  if (!options_.user.empty()) {
    conf << "authorization { user: \"" << options_.user << "\", password: \"" << options_.password
         << "\" }\n";
  } else if (!options_.token.empty()) {
    conf << "authorization { token: \"" << options_.token << "\" }\n";
  } else if (!options_.nkey.empty()) {
    conf << "authorization { users: [ { nkey: " << options_.nkey << " } ] }\n";
  }
  if (!options_.tls_cert_file.empty()) {
    conf << "tls {\n  cert_file: \"" << options_.tls_cert_file << "\"\n  key_file: \""
         << options_.tls_key_file << "\"\n";
    if (!options_.tls_ca_file.empty()) conf << "  ca_file: \"" << options_.tls_ca_file << "\"\n";
    if (options_.tls_verify) conf << "  verify: true\n";
    conf << "  timeout: 5\n}\n";
  }
  if (!options_.cluster_name.empty()) {
    conf << "cluster {\n  name: \"" << options_.cluster_name
         << "\"\n  listen: \"127.0.0.1:" << options_.cluster_port << "\"\n  routes: [\n";
    for (int peer : options_.peer_cluster_ports)
      conf << "    \"nats-route://127.0.0.1:" << peer << "\"\n";
    conf << "  ]\n}\n";
  }
  conf.close();
  start();
}

void EmbeddedNats::start() {
  server_ = ChildProcess({nats_server_binary(), "-c", config_}, dir_ + "/nats.log");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!port_accepts(options_.port)) {
    if (!server_.running()) {
      throw Error(Errc::internal,
                  "nats-server exited at start:\n" + tail_of_file(dir_ + "/nats.log"));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      throw Error(Errc::timeout,
                  "nats-server did not listen within 20 s:\n" + tail_of_file(dir_ + "/nats.log"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void EmbeddedNats::stop(bool kill) {
  server_.stop(kill ? SIGKILL : SIGTERM, std::chrono::seconds(10));
}

EmbeddedNats::~EmbeddedNats() {
  server_.stop(SIGKILL);
  remove_tree(dir_);
}

EmbeddedNatsCluster::EmbeddedNatsCluster(int size) {
  std::vector<int> route_ports;
  for (int i = 0; i < size; ++i) route_ports.push_back(free_port());
  const std::string name = "outlive-test-" + std::to_string(route_ports.front());
  for (int i = 0; i < size; ++i) {
    NatsOptions o;
    o.cluster_name = name;
    o.cluster_port = route_ports[i];
    o.server_name = "node" + std::to_string(i);
    for (int j = 0; j < size; ++j) {
      if (j != i) o.peer_cluster_ports.push_back(route_ports[j]);
    }
    nodes_.push_back(std::make_unique<EmbeddedNats>(o));
  }
}

std::vector<std::string> EmbeddedNatsCluster::urls() const {
  std::vector<std::string> out;
  for (const auto& n : nodes_) out.push_back(n->url());
  return out;
}

}  // namespace outlive::harness
