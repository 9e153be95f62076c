// NATS credentials and TLS (SPEC 6, rev 3): topic::Client and a whole in-process replica against
// real nats-servers that require a user and password, a token, or TLS with client certificates
// from a CA the test makes with the openssl CLI.
#include <catch2/catch.hpp>
#include <fstream>
#include <future>
#include <pqxx/pqxx>

#include "common/error.hpp"
#include "config/config.hpp"
#include "harness/embedded_nats.hpp"
#include "harness/process.hpp"
#include "replica/replica.hpp"
#include "support/inventory.hpp"
#include "support/services.hpp"
#include "topic/client.hpp"

using namespace outlive;
using namespace outlive::testing;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

// A throwaway CA, a server certificate for 127.0.0.1 and a client certificate it signed, plus a
// second CA that signed nothing the server knows.
struct Pki {
  Pki() : dir(harness::make_temp_dir("outlive-pki-")) {
    std::ofstream(dir + "/server.ext") << "subjectAltName=IP:127.0.0.1\n"
                                       << "extendedKeyUsage=serverAuth\n";
    std::ofstream(dir + "/client.ext") << "extendedKeyUsage=clientAuth\n";
    make_ca("ca");
    make_ca("other-ca");
    make_leaf("server", "ca");
    make_leaf("client", "ca");
    make_leaf("stranger", "other-ca");
  }
  ~Pki() { harness::remove_tree(dir); }
  std::string file(const std::string& name) const { return dir + "/" + name; }

  void run(std::vector<std::string> argv) const {
    argv.insert(argv.begin(), "openssl");
    harness::run_checked(argv, dir + "/openssl.log");
  }
  void make_ca(const std::string& name) const {
    run({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", file(name + ".key"), "-out", file(name + ".pem"), "-days", "2", "-subj",
         "/CN=outlive-test-" + name});
  }
  void make_leaf(const std::string& name, const std::string& ca) const {
    run({"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
         file(name + ".key"), "-out", file(name + ".csr"), "-subj", "/CN=" + name});
    const std::string ext = name == "server" ? "server.ext" : "client.ext";
    run({"x509", "-req", "-in", file(name + ".csr"), "-CA", file(ca + ".pem"), "-CAkey",
         file(ca + ".key"), "-CAcreateserial", "-out", file(name + ".pem"), "-days", "2",
         "-extfile", file(ext)});
  }

  std::string dir;
};

harness::NatsOptions tls_server(const Pki& pki, bool verify) {
  harness::NatsOptions o;
  o.tls_cert_file = pki.file("server.pem");
  o.tls_key_file = pki.file("server.key");
  o.tls_ca_file = pki.file("ca.pem");
  o.tls_verify = verify;
  return o;
}

topic::ConnectOptions tls_client(const Pki& pki, const std::string& cert = "client") {
  topic::ConnectOptions o;
  o.tls_ca_file = pki.file("ca.pem");
  if (!cert.empty()) {
    o.tls_cert_file = pki.file(cert + ".pem");
    o.tls_key_file = pki.file(cert + ".key");
  }
  return o;
}

struct Refusal {
  std::string message;
  std::chrono::milliseconds took{0};
};

// Connects with a generous timeout by default: a refusal that is retried until it runs out shows
// as `took`.
Refusal refusal_of(const std::vector<std::string>& urls, const topic::ConnectOptions& options,
                   std::chrono::milliseconds timeout = 20s) {
  const auto start = std::chrono::steady_clock::now();
  try {
    topic::Client client(urls, "test-refused", options, timeout);
  } catch (const Error& e) {
    CHECK(e.code() == Errc::nats);
    return {e.what(), std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now() - start)};
  }
  FAIL("the connection was accepted");
  return {};
}

// The connection works for what a replica does with it: a stream, a publish, a read.
void round_trip(topic::Client& client) {
  client.ensure_stream("inventory", {});
  std::promise<topic::PublishResult> acked;
  client.set_publish_handler([&](const topic::PublishResult& r) { acked.set_value(r); });
  REQUIRE_FALSE(client.publish_async(topic::subject_for("inventory"), R"({"k":1})", "m1", 1, 5s));
  auto future = acked.get_future();
  REQUIRE(future.wait_for(10s) == std::future_status::ready);
  const auto result = future.get();
  CHECK(result.ok);
  const auto read = client.read("inventory", 1, 10);
  REQUIRE(read.size() == 1);
  CHECK(read[0].data == R"({"k":1})");
  client.set_publish_handler({});
}

std::string write_file(const std::string& path, const std::string& content) {
  std::ofstream(path) << content;
  return path;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// An nkey as `nk -gen user` writes it: base32 (no padding) of the prefix, the 32 key bytes and a
// CRC-16/XMODEM of both, little-endian.
std::string nkey_encode(std::string raw) {
  uint16_t crc = 0;
  for (unsigned char byte : raw) {
    crc ^= static_cast<uint16_t>(byte << 8);
    for (int i = 0; i < 8; ++i) crc = (crc & 0x8000) ? (crc << 1) ^ 0x1021 : crc << 1;
  }
  raw += static_cast<char>(crc & 0xff);
  raw += static_cast<char>(crc >> 8);
  static const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
  std::string out;
  uint32_t buffer = 0;
  int bits = 0;
  for (unsigned char byte : raw) {
    buffer = (buffer << 8) | byte;
    bits += 8;
    while (bits >= 5) out += alphabet[(buffer >> (bits -= 5)) & 31];
  }
  if (bits > 0) out += alphabet[(buffer << (5 - bits)) & 31];
  return out;
}

// A user nkey pair from an Ed25519 key made by openssl: {public "U...", seed "SU..."}.
std::pair<std::string, std::string> make_user_nkey(const Pki& pki) {
  pki.run({"genpkey", "-algorithm", "ed25519", "-out", pki.file("nkey.pem")});
  pki.run({"pkey", "-in", pki.file("nkey.pem"), "-outform", "DER", "-out", pki.file("nkey.der")});
  pki.run({"pkey", "-in", pki.file("nkey.pem"), "-pubout", "-outform", "DER", "-out",
           pki.file("nkey.pub.der")});
  // The DER forms end with the raw 32-byte seed and public key.
  const std::string seed = read_bytes(pki.file("nkey.der")).substr(16);
  const std::string key = read_bytes(pki.file("nkey.pub.der")).substr(12);
  REQUIRE(seed.size() == 32);
  REQUIRE(key.size() == 32);
  constexpr unsigned char kUser = 20 << 3, kSeed = 18 << 3;
  const std::string seed_prefix{static_cast<char>(kSeed | (kUser >> 5)),
                                static_cast<char>((kUser & 31) << 3)};
  return {nkey_encode(std::string(1, static_cast<char>(kUser)) + key),
          nkey_encode(seed_prefix + seed)};
}

}  // namespace

TEST_CASE(
    "a NATS that requires a user and password: the right ones connect, wrong ones are "
    "refused at once naming NATS authorization") {
  harness::NatsOptions server;
  server.user = "outlive";
  server.password = "s3cret-pass";
  harness::EmbeddedNats nats(server);

  topic::ConnectOptions right;
  right.user = "outlive";
  right.password = "s3cret-pass";
  {
    topic::Client client({nats.url()}, "test-auth", right);
    CHECK(client.connected());
    round_trip(client);
  }

  // In the URL, as compose.yaml gives them to the demo app, whose --nats takes URLs only.
  {
    topic::Client client({"nats://outlive:s3cret-pass@127.0.0.1:" + std::to_string(nats.port())},
                         "test-auth-url");
    CHECK(client.connected());
  }

  // The password from a file, its trailing newline (as editors and `echo` leave it) dropped.
  const std::string dir = harness::make_temp_dir("outlive-secret-");
  topic::ConnectOptions from_file;
  from_file.user = "outlive";
  from_file.password_file = write_file(dir + "/password", "s3cret-pass\n");
  {
    topic::Client client({nats.url()}, "test-auth-file", from_file);
    CHECK(client.connected());
  }

  topic::ConnectOptions wrong = right;
  wrong.password = "s3cret-pas";
  for (const auto& options : {wrong, topic::ConnectOptions{}}) {
    const auto refused = refusal_of({nats.url()}, options);
    CHECK_THAT(refused.message, Catch::Contains("NATS authorization failed"));
    CHECK(refused.took < 5s);  // not retried until the 20 s connect timeout
  }

  topic::ConnectOptions missing_file = from_file;
  missing_file.password_file = dir + "/absent";
  try {
    topic::Client client({nats.url()}, "test-auth-missing", missing_file);
    FAIL("connected without the password file");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_input);
    CHECK_THAT(e.what(), Catch::Contains(dir + "/absent"));
  }
  harness::remove_tree(dir);
}

TEST_CASE("a NATS that requires a token: the token from a file connects, another is refused") {
  harness::NatsOptions server;
  server.token = "tok-8f2a";
  harness::EmbeddedNats nats(server);
  const std::string dir = harness::make_temp_dir("outlive-secret-");

  topic::ConnectOptions right;
  right.token_file = write_file(dir + "/token", "tok-8f2a\n");
  {
    topic::Client client({nats.url()}, "test-token", right);
    CHECK(client.connected());
  }
  topic::ConnectOptions wrong;
  wrong.token = "tok-8f2b";
  CHECK_THAT(refusal_of({nats.url()}, wrong).message, Catch::Contains("NATS authorization failed"));
  harness::remove_tree(dir);
}

TEST_CASE(
    "a NATS that requires TLS and client certificates: the CA and a client certificate "
    "connect, anything less is refused naming TLS") {
  const Pki pki;
  harness::EmbeddedNats nats(tls_server(pki, true));
  REQUIRE(nats.url().rfind("tls://", 0) == 0);

  {
    topic::Client client({nats.url()}, "test-tls", tls_client(pki));
    CHECK(client.connected());
    round_trip(client);
  }

  // Under TLS 1.3 the server refuses a client certificate only after the handshake, by closing
  // the connection: to nats.c that looks like a restarting server, so it is retried until the
  // connect timeout, then named.
  SECTION("without a client certificate") {
    const auto refused = refusal_of({nats.url()}, tls_client(pki, ""), 2s);
    CHECK_THAT(refused.message,
               Catch::Contains("NATS TLS") && Catch::Contains("refuses the client certificate"));
  }
  SECTION("with a client certificate of another CA") {
    const auto refused = refusal_of({nats.url()}, tls_client(pki, "stranger"), 2s);
    CHECK_THAT(refused.message,
               Catch::Contains("NATS TLS") && Catch::Contains("refuses the client certificate"));
  }
  SECTION("without the CA: the server's certificate is not trusted") {
    auto options = tls_client(pki);
    options.tls_ca_file.clear();
    const auto refused = refusal_of({nats.url()}, options);
    CHECK_THAT(refused.message, Catch::Contains("NATS TLS handshake failed"));
    CHECK(refused.took < 5s);
  }
  SECTION("in plaintext") {
    // nats.c answers the server's tls_required by starting TLS itself, which then fails on the
    // certificate it has no CA for.
    const std::string plain = "nats://127.0.0.1:" + std::to_string(nats.port());
    const auto refused = refusal_of({plain}, topic::ConnectOptions{});
    CHECK_THAT(refused.message, Catch::Contains("NATS TLS"));
    CHECK(refused.took < 5s);
  }
}

TEST_CASE(
    "a TLS NATS without client verification: the CA alone connects, also with a nats:// "
    "URL when nats_options has tls") {
  const Pki pki;
  harness::EmbeddedNats nats(tls_server(pki, false));
  topic::Client by_scheme({nats.url()}, "test-tls-scheme", tls_client(pki, ""));
  CHECK(by_scheme.connected());
  auto options = tls_client(pki, "");
  options.tls = true;
  topic::Client by_option({"nats://127.0.0.1:" + std::to_string(nats.port())}, "test-tls-option",
                          options);
  CHECK(by_option.connected());
}

TEST_CASE("a tls:// URL without a CA file trusts the system's CAs (OpenSSL's default paths)") {
  const Pki pki;
  harness::EmbeddedNats nats(tls_server(pki, false));
  // OpenSSL's default verify paths honour SSL_CERT_FILE: the test's CA stands in for the system's.
  ::setenv("SSL_CERT_FILE", pki.file("ca.pem").c_str(), 1);
  topic::Client client({nats.url()}, "test-tls-system-ca", topic::ConnectOptions{});
  ::unsetenv("SSL_CERT_FILE");
  CHECK(client.connected());
}

TEST_CASE(
    "a replica configured with nats_options publishes through a NATS that requires a "
    "password and client certificates") {
  const Pki pki;
  auto server = tls_server(pki, true);
  server.user = "outlive";
  server.password = "replica-pass";
  harness::EmbeddedNats nats(server);
  const std::string db = fresh_database();
  {
    pqxx::connection c(db);
    pqxx::work tx(c);
    tx.exec(kInventoryTables);
    tx.commit();
  }
  write_file(pki.file("nats_password"), "replica-pass\n");
  json config = inventory_replica_config(db, nats.url(), "r1", json::object());
  config["nats_options"] = {{"user", "outlive"},
                            {"password_file", pki.file("nats_password")},
                            {"tls",
                             {{"ca_file", pki.file("ca.pem")},
                              {"cert_file", pki.file("client.pem")},
                              {"key_file", pki.file("client.key")}}}};
  auto parsed = config::parse(config);

  SECTION("with the credentials it publishes the outbox to the stream") {
    replica::Replica replica(parsed);
    {
      pqxx::connection c(db);
      pqxx::work tx(c);
      tx.exec_params("SELECT events.publish_live('inventory', $1, $2::jsonb)", kNorth,
                     R"({"type": "item.changed"})");
      tx.commit();
      pqxx::nontransaction(c).exec("SELECT events.wake('inventory')");
    }
    topic::ConnectOptions reader = tls_client(pki);
    reader.user = "outlive";
    reader.password = "replica-pass";
    topic::Client client({nats.url()}, "test-reader", reader);
    CHECK(eventually([&] { return client.stream_state("inventory").last_sequence >= 1; }, 20s));
  }
  SECTION("with a wrong password it refuses to start, naming NATS authorization") {
    write_file(pki.file("nats_password"), "wrong-pass\n");
    try {
      replica::Replica replica(parsed);
      FAIL("the replica started");
    } catch (const Error& e) {
      CHECK_THAT(e.what(), Catch::Contains("NATS authorization failed"));
    }
  }
}

TEST_CASE(
    "a NATS that knows the user by an nkey: its seed file connects, another seed is "
    "refused naming NATS authorization") {
  const Pki pki;
  const auto [user_key, seed] = make_user_nkey(pki);
  REQUIRE(user_key.size() == 56);
  REQUIRE(seed.rfind("SU", 0) == 0);
  const auto [other_key, other_seed] = make_user_nkey(pki);
  harness::NatsOptions server;
  server.nkey = user_key;
  harness::EmbeddedNats nats(server);

  topic::ConnectOptions right;
  right.nkey = user_key;
  right.nkey_seed_file = write_file(pki.file("user.nk"), seed + "\n");
  {
    topic::Client client({nats.url()}, "test-nkey", right);
    CHECK(client.connected());
  }
  topic::ConnectOptions wrong;
  wrong.nkey = other_key;
  wrong.nkey_seed_file = write_file(pki.file("other.nk"), other_seed + "\n");
  const auto refused = refusal_of({nats.url()}, wrong);
  CHECK_THAT(refused.message, Catch::Contains("NATS authorization failed"));
  CHECK(refused.took < 5s);
}
