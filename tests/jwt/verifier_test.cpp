// The replica's JWT verifier (SPEC 5.1 rev 4) against a JWKS endpoint the test runs on loopback
// (tests/support/jwks_server): the fetch at start, rotation through an unknown kid, the 60 s limit
// on those refetches, max-age and its clamp, a failing or hanging endpoint, the 24 h a stale set is
// kept; and the HMAC secret files. Time is a ManualTime moved by the test, never waited for,
// except the 2 s fetch timeout, which is real.
#include <arpa/inet.h>
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "common/error.hpp"
#include "jwt/verifier.hpp"
#include "jwt/verifier_time.hpp"
#include "metrics/metrics.hpp"
#include "support/jwks_server.hpp"
#include "support/jwt_signer.hpp"

using namespace outlive::jwt;
using namespace std::chrono_literals;
using outlive::testing::claims;
using outlive::testing::JwksServer;
using outlive::testing::jwks;
using outlive::testing::TestKey;

namespace {

const TestKey& key_a() {
  static const TestKey k = TestKey::rsa("key-a");
  return k;
}
const TestKey& key_b() {
  static const TestKey k = TestKey::ec("key-b");
  return k;
}
const TestKey& key_c() {
  static const TestKey k = TestKey::ed25519("key-c");
  return k;
}

outlive::config::Jwt jwks_settings(const std::string& url) {
  outlive::config::Jwt s;
  s.jwks_url = url;
  s.algorithms = {"RS256", "ES256", "EdDSA"};
  return s;
}

std::string result_of(const Answer& a) {
  if (std::holds_alternative<Verified>(a)) return "ok";
  return name_of(std::get<Failure>(a));
}

// Polls `done` every 10 ms until it holds or `timeout` passes.
template <class Predicate>
bool eventually(Predicate done, std::chrono::milliseconds timeout = 5s) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

// For what must NOT happen (no request): nothing to await, so a short look.
void settle() { std::this_thread::sleep_for(300ms); }

struct Callback {
  std::promise<std::pair<Answer, std::thread::id>> promise;
  std::future<std::pair<Answer, std::thread::id>> future = promise.get_future();
  std::function<void(Answer)> done() {
    return [this](Answer a) { promise.set_value({std::move(a), std::this_thread::get_id()}); };
  }
  bool answered() const { return future.wait_for(0s) == std::future_status::ready; }
};

std::string metric_line(const outlive::metrics::Registry& m, const std::string& series) {
  const std::string text = "\n" + m.render();
  const size_t found = text.find("\n" + series + " ");
  if (found == std::string::npos) return "";
  const size_t at = found + 1;
  return text.substr(at, text.find('\n', at) - at);
}

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "outlive-jwt-XXXXXX").string();
    path = mkdtemp(pattern.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path / name, std::ios::binary) << bytes;
    return (path / name).string();
  }
};

}  // namespace

TEST_CASE("the JWKS is fetched at start and its keys verify tokens") {
  JwksServer server;
  server.set_document(jwks({&key_a(), &key_b()}));
  outlive::metrics::Registry metrics;
  auto settings = jwks_settings(server.url());
  settings.audience = "outlive";
  Verifier v(settings, &metrics);
  CHECK(server.requests() == 0);  // the constructor does not fetch
  v.start();
  CHECK(server.requests() == 1);
  const int64_t now = outlive::testing::unix_now();

  const Answer a = v.verify_now(key_a().sign(claims("ada", now, 300, {{"aud", "outlive"}, {"scope", "b a"}})));
  REQUIRE(result_of(a) == "ok");
  CHECK(std::get<Verified>(a).viewer.id == "user:ada:a,b");
  CHECK(std::get<Verified>(a).expires_at == now + 300);
  CHECK(std::get<Verified>(a).issued_at == now);

  // verify() answers inline when it can.
  Callback cb;
  v.verify(key_b().sign(claims("bob", now, 300, {{"aud", "outlive"}})), cb.done());
  REQUIRE(cb.answered());
  const auto [answer, thread] = cb.future.get();
  CHECK(result_of(answer) == "ok");
  CHECK(thread == std::this_thread::get_id());
  CHECK(result_of(v.verify_now(key_b().sign(claims("bob", now, 300, {{"aud", "other"}})))) == "audience");

  CHECK(metric_line(metrics, R"(outlive_jwt_verifications_total{result="ok"})") ==
        R"(outlive_jwt_verifications_total{result="ok"} 2)");
  CHECK(metric_line(metrics, R"(outlive_jwt_verifications_total{result="audience"})") ==
        R"(outlive_jwt_verifications_total{result="audience"} 1)");
  CHECK(metric_line(metrics, R"(outlive_jwt_verifications_total{result="signature"})") ==
        R"(outlive_jwt_verifications_total{result="signature"} 0)");
  CHECK(metric_line(metrics, R"(outlive_jwks_fetches_total{result="ok"})") ==
        R"(outlive_jwks_fetches_total{result="ok"} 1)");
  CHECK(metric_line(metrics, "outlive_jwks_keys") == "outlive_jwks_keys 2");
}

TEST_CASE("start() throws naming the URL when the JWKS cannot be fetched") {
  JwksServer server;
  server.set_document(jwks({&key_a()}));
  const std::string url = server.url();
  auto start_error = [&](outlive::Errc* code = nullptr) -> std::string {
    Verifier v(jwks_settings(url), nullptr);
    try {
      v.start();
    } catch (const outlive::Error& e) {
      if (code != nullptr) *code = e.code();
      return e.what();
    }
    return "";
  };
  SECTION("a 500") {
    server.set_status(500);
    const std::string error = start_error();
    CHECK_THAT(error, Catch::Contains(url) && Catch::Contains("500"));
  }
  SECTION("a document without a usable key") {
    server.set_document(R"({"keys":[{"kty":"oct","k":"AAAA"}]})");
    CHECK_THAT(start_error(), Catch::Contains(url) && Catch::Contains("no usable key"));
  }
  SECTION("not JSON") {
    server.set_document("<html>sign in</html>");
    CHECK_THAT(start_error(), Catch::Contains(url) && Catch::Contains("not JSON"));
  }
  SECTION("nothing listening") {
    server.stop();
    CHECK_THAT(start_error(), Catch::Contains(url) && Catch::Contains("connecting"));
  }
  SECTION("https:// to a server that speaks plain HTTP: the TLS handshake fails") {
    for (const std::string& tls_url : {"https://127.0.0.1:" + std::to_string(server.port()) + "/jwks",
                                       "https://localhost:" + std::to_string(server.port()) + "/jwks"}) {
      CAPTURE(tls_url);
      Verifier v(jwks_settings(tls_url), nullptr);
      try {
        v.start();
        FAIL("start() did not throw");
      } catch (const outlive::Error& e) {
        CHECK_THAT(e.what(), Catch::Contains(tls_url) && Catch::Contains("TLS handshake"));
      }
    }
  }
  SECTION("no answer: the 2 s timeout") {
    server.set_hang(true);
    outlive::Errc code = outlive::Errc::internal;
    const auto t0 = std::chrono::steady_clock::now();
    const std::string error = start_error(&code);
    const auto took = std::chrono::steady_clock::now() - t0;
    CHECK_THAT(error, Catch::Contains(url) && Catch::Contains("timeout"));
    CHECK(code == outlive::Errc::timeout);
    CHECK(took >= 1900ms);
    CHECK(took < 4s);
  }
}

TEST_CASE("settings the verifier cannot work with are refused when it is made") {
  outlive::config::Jwt s = jwks_settings("http://127.0.0.1:9/jwks");
  s.hmac_secret_file = "/dev/null";
  CHECK_THROWS_AS(Verifier(s, nullptr), outlive::Error);  // both sources
  s = jwks_settings("");
  CHECK_THROWS_AS(Verifier(s, nullptr), outlive::Error);  // neither
  s = jwks_settings("ftp://example.com/jwks");
  CHECK_THROWS_AS(Verifier(s, nullptr), outlive::Error);
  for (const char* alg : {"none", "HS512", "rs256"}) {
    s = jwks_settings("http://127.0.0.1:9/jwks");
    s.algorithms = {"RS256", alg};
    CHECK_THROWS_AS(Verifier(s, nullptr), outlive::Error);
  }
  s = jwks_settings("http://127.0.0.1:9/jwks");
  s.algorithms.clear();
  CHECK_THROWS_AS(Verifier(s, nullptr), outlive::Error);
}

TEST_CASE("key rotation: a token with a new kid verifies after one refetch, answered on the verifier's thread") {
  JwksServer server;
  server.set_document(jwks({&key_a()}));
  auto time = std::make_shared<ManualTime>();
  outlive::metrics::Registry metrics;
  Verifier v(jwks_settings(server.url()), &metrics, time);
  v.start();
  REQUIRE(server.requests() == 1);
  const int64_t now = time->unix_seconds();
  CHECK(result_of(v.verify_now(key_a().sign(claims("ada", now)))) == "ok");

  // The provider rotates: key B joins the set.
  server.set_document(jwks({&key_a(), &key_b()}));
  Callback rotated;
  v.verify(key_b().sign(claims("bob", now)), rotated.done());
  REQUIRE(rotated.future.wait_for(5s) == std::future_status::ready);
  const auto [answer, thread] = rotated.future.get();
  REQUIRE(result_of(answer) == "ok");
  CHECK(std::get<Verified>(answer).viewer.id == "user:bob");
  CHECK(thread != std::this_thread::get_id());
  CHECK(server.requests() == 2);
  CHECK(metric_line(metrics, "outlive_jwks_keys") == "outlive_jwks_keys 2");
  // Key B now verifies inline.
  CHECK(result_of(v.verify_now(key_b().sign(claims("bob", now)))) == "ok");

  // Another unknown kid within 60 s of that refetch: unknown_kid at once, no request.
  server.set_document(jwks({&key_a(), &key_b(), &key_c()}));
  time->advance(59s);
  Callback too_soon;
  v.verify(key_c().sign(claims("cy", time->unix_seconds())), too_soon.done());
  REQUIRE(too_soon.answered());
  CHECK(result_of(too_soon.future.get().first) == "unknown_kid");
  CHECK(result_of(v.verify_now(key_c().sign(claims("cy", time->unix_seconds())))) == "unknown_kid");
  settle();
  CHECK(server.requests() == 2);

  // Past the 60 s: the next unknown kid refetches again, and finds key C.
  time->advance(2s);
  Callback later;
  v.verify(key_c().sign(claims("cy", time->unix_seconds())), later.done());
  REQUIRE(later.future.wait_for(5s) == std::future_status::ready);
  CHECK(result_of(later.future.get().first) == "ok");
  CHECK(server.requests() == 3);
  CHECK(metric_line(metrics, R"(outlive_jwt_verifications_total{result="unknown_kid"})") ==
        R"(outlive_jwt_verifications_total{result="unknown_kid"} 2)");
}

TEST_CASE("a kid still unknown after its refetch is answered unknown_kid by the callback") {
  JwksServer server;
  server.set_document(jwks({&key_a()}));
  auto time = std::make_shared<ManualTime>();
  Verifier v(jwks_settings(server.url()), nullptr, time);
  v.start();
  Callback cb;
  v.verify(key_b().sign(claims("bob", time->unix_seconds())), cb.done());
  REQUIRE(cb.future.wait_for(5s) == std::future_status::ready);
  CHECK(result_of(cb.future.get().first) == "unknown_kid");
  CHECK(server.requests() == 2);
}

TEST_CASE("tokens of a new kid arriving together share one refetch") {
  JwksServer server;
  server.set_document(jwks({&key_a()}));
  auto time = std::make_shared<ManualTime>();
  Verifier v(jwks_settings(server.url()), nullptr, time);
  v.start();
  server.set_document(jwks({&key_a(), &key_b()}));
  std::vector<std::unique_ptr<Callback>> callbacks;
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      for (int j = 0; j < 10; ++j) {
        auto cb = std::make_unique<Callback>();
        auto done = cb->done();
        {
          static std::mutex m;
          std::lock_guard lock(m);
          callbacks.push_back(std::move(cb));
        }
        v.verify(key_b().sign(claims("bob" + std::to_string(i * 10 + j), time->unix_seconds())), done);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& cb : callbacks) {
    REQUIRE(cb->future.wait_for(5s) == std::future_status::ready);
    CHECK(result_of(cb->future.get().first) == "ok");
  }
  CHECK(server.requests() == 2);
}

TEST_CASE("an unknown kid while the endpoint hangs is answered when the 2 s fetch times out") {
  JwksServer server;
  server.set_document(jwks({&key_a()}));
  auto time = std::make_shared<ManualTime>();
  Verifier v(jwks_settings(server.url()), nullptr, time);
  v.start();
  server.set_hang(true);
  Callback cb;
  const auto t0 = std::chrono::steady_clock::now();
  v.verify(key_b().sign(claims("bob", time->unix_seconds())), cb.done());
  CHECK_FALSE(cb.answered());
  // Meanwhile the known keys verify inline, not behind the fetch.
  CHECK(result_of(v.verify_now(key_a().sign(claims("ada", time->unix_seconds())))) == "ok");
  REQUIRE(cb.future.wait_for(5s) == std::future_status::ready);
  CHECK(std::chrono::steady_clock::now() - t0 >= 1900ms);
  CHECK(result_of(cb.future.get().first) == "unknown_kid");
}

TEST_CASE("the endpoint failing: the last good set serves for 24 h, then every token fails no_keys") {
  JwksServer server;
  server.set_document(jwks({&key_a()}));
  auto time = std::make_shared<ManualTime>();
  outlive::metrics::Registry metrics;
  Verifier v(jwks_settings(server.url()), &metrics, time);
  v.start();
  server.set_status(500);
  // The default max-age (no Cache-Control): 300 s.
  time->advance(301s);
  v.time_moved();
  REQUIRE(server.wait_for_requests(2, 5s));
  REQUIRE(eventually([&] {
    return metric_line(metrics, R"(outlive_jwks_fetches_total{result="failed"})") ==
           R"(outlive_jwks_fetches_total{result="failed"} 1)";
  }));
  CHECK(result_of(v.verify_now(key_a().sign(claims("ada", time->unix_seconds())))) == "ok");

  // Retried 30 s after a failure, still failing; still served.
  time->advance(31s);
  v.time_moved();
  REQUIRE(server.wait_for_requests(3, 5s));
  REQUIRE(eventually([&] {  // taken as a failure (the next try is due 30 s from now)
    return metric_line(metrics, R"(outlive_jwks_fetches_total{result="failed"})") ==
           R"(outlive_jwks_fetches_total{result="failed"} 2)";
  }));
  CHECK(result_of(v.verify_now(key_a().sign(claims("ada", time->unix_seconds())))) == "ok");

  // 24 h after the last good fetch.
  time->advance(24h - 332s);
  CHECK(result_of(v.verify_now(key_a().sign(claims("ada", time->unix_seconds())))) == "ok");
  time->advance(2s);
  CHECK(result_of(v.verify_now(key_a().sign(claims("ada", time->unix_seconds())))) == "no_keys");
  CHECK(metric_line(metrics, R"(outlive_jwt_verifications_total{result="no_keys"})") ==
        R"(outlive_jwt_verifications_total{result="no_keys"} 1)");

  // The endpoint back: the next fetch restores the set.
  server.set_status(200);
  const int before = server.requests();
  v.time_moved();
  REQUIRE(server.wait_for_requests(before + 1, 5s));
  CHECK(eventually([&] {
    return result_of(v.verify_now(key_a().sign(claims("ada", time->unix_seconds())))) == "ok";
  }));
}

TEST_CASE("the endpoint hanging: the last good set keeps verifying while the fetch times out") {
  JwksServer server;
  server.set_document(jwks({&key_a()}));
  auto time = std::make_shared<ManualTime>();
  outlive::metrics::Registry metrics;
  Verifier v(jwks_settings(server.url()), &metrics, time);
  v.start();
  server.set_hang(true);
  time->advance(301s);
  v.time_moved();
  REQUIRE(server.wait_for_requests(2, 5s));
  CHECK(result_of(v.verify_now(key_a().sign(claims("ada", time->unix_seconds())))) == "ok");
  REQUIRE(eventually([&] {
    return metric_line(metrics, R"(outlive_jwks_fetches_total{result="failed"})") ==
           R"(outlive_jwks_fetches_total{result="failed"} 1)";
  }));
  CHECK(result_of(v.verify_now(key_a().sign(claims("ada", time->unix_seconds())))) == "ok");
}

TEST_CASE("the refetch follows the response's max-age, clamped to 60 s - 1 h") {
  struct Case {
    std::string cache_control;
    std::chrono::seconds due;
  };
  const Case c = GENERATE(values<Case>({{"", 300s},
                                        {"public, max-age=120", 120s},
                                        {"max-age=5", 60s},
                                        {"no-store", 60s},
                                        {"max-age=86400, must-revalidate", 3600s}}));
  CAPTURE(c.cache_control);
  JwksServer server;
  server.set_document(jwks({&key_a()}), c.cache_control);
  auto time = std::make_shared<ManualTime>();
  outlive::metrics::Registry metrics;
  Verifier v(jwks_settings(server.url()), &metrics, time);
  v.start();
  time->advance(c.due - 2s);
  v.time_moved();
  settle();
  CHECK(server.requests() == 1);
  time->advance(3s);
  v.time_moved();
  CHECK(server.wait_for_requests(2, 5s));
  // The next one is due the same max-age after that fetch (once the verifier has taken it).
  REQUIRE(eventually([&] {
    return metric_line(metrics, R"(outlive_jwks_fetches_total{result="ok"})") ==
           R"(outlive_jwks_fetches_total{result="ok"} 2)";
  }));
  time->advance(c.due - 2s);
  v.time_moved();
  settle();
  CHECK(server.requests() == 2);
  time->advance(3s);
  v.time_moved();
  CHECK(server.wait_for_requests(3, 5s));
}

TEST_CASE("HS256 secrets from files: trailing newlines dropped, the previous secret accepted") {
  TempDir dir;
  const std::string current = "current-secret-of-thirty-two-bytes-or-more";
  const std::string previous = "previous-secret-of-thirty-two-bytes-or-more";
  outlive::config::Jwt s;
  s.algorithms = {"HS256"};
  s.hmac_secret_file = dir.write("current", current + "\n");
  s.hmac_previous_secret_file = dir.write("previous", previous + "\r\n\n");
  outlive::metrics::Registry metrics;
  Verifier v(s, &metrics);
  v.start();
  const int64_t now = outlive::testing::unix_now();
  CHECK(result_of(v.verify_now(TestKey::hmac(current).sign(claims("ada", now)))) == "ok");
  CHECK(result_of(v.verify_now(TestKey::hmac(previous).sign(claims("ada", now)))) == "ok");
  // The newline is not part of the secret.
  CHECK(result_of(v.verify_now(TestKey::hmac(current + "\n").sign(claims("ada", now)))) == "signature");
  CHECK(result_of(v.verify_now(TestKey::hmac("another-secret-of-thirty-two-bytes!!").sign(claims("ada", now)))) ==
        "signature");
  // An RSA token against secrets: the algorithm is not configured.
  CHECK(result_of(v.verify_now(key_a().sign(claims("ada", now))))  == "algorithm");
  CHECK(metric_line(metrics, "outlive_jwks_keys") == "outlive_jwks_keys 2");

  SECTION("a missing, empty or short file: start() throws naming it") {
    for (const std::string& file : {(dir.path / "missing").string(), dir.write("empty", "\n"),
                                    dir.write("short", "tiny\n")}) {
      CAPTURE(file);
      outlive::config::Jwt bad = s;
      bad.hmac_secret_file = file;
      Verifier w(bad, nullptr);
      try {
        w.start();
        FAIL("start() did not throw");
      } catch (const outlive::Error& e) {
        CHECK_THAT(e.what(), Catch::Contains(file));
        if (file.find("short") != std::string::npos) CHECK_THAT(e.what(), Catch::Contains("32 bytes"));
      }
    }
  }
}

TEST_CASE("verify before start() answers no_keys") {
  Verifier v(jwks_settings("http://127.0.0.1:9/jwks"), nullptr);
  CHECK(result_of(v.verify_now(key_a().sign(claims("ada", outlive::testing::unix_now())))) == "no_keys");
}

namespace {

// `openssl s_server -WWW` serving the JWKS from `dir` over TLS with a certificate for `names`
// (subjectAltName entries), signed by a throwaway CA (`dir`/ca.pem). Killed by its pid.
struct TlsServer {
  pid_t pid = -1;
  int port = 0;
  TlsServer(const TempDir& dir, const std::string& names) {
    const std::string d = dir.path.string();
    const std::string script =
        "set -e; cd '" + d + "'; "
        "[ -f ca.pem ] || openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
        "-keyout ca.key -out ca.pem -days 2 -subj /CN=outlive-test-ca 2>/dev/null; "
        "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout server.key "
        "-out server.csr -subj /CN=jwks 2>/dev/null; "
        "printf 'subjectAltName=" + names + "\\nextendedKeyUsage=serverAuth\\n' > server.ext; "
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem "
        "-days 2 -extfile server.ext 2>/dev/null";
    REQUIRE(std::system(("bash -c \"" + script + "\"").c_str()) == 0);
    // A free port: bound by the kernel, then released for s_server.
    const int probe = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in at{};
    at.sin_family = AF_INET;
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(probe, reinterpret_cast<sockaddr*>(&at), sizeof at) == 0);
    socklen_t len = sizeof at;
    ::getsockname(probe, reinterpret_cast<sockaddr*>(&at), &len);
    port = ntohs(at.sin_port);
    ::close(probe);
    pid = ::fork();
    if (pid == 0) {
      if (::chdir(d.c_str()) != 0) _exit(127);
      const int null = ::open("/dev/null", O_RDWR);
      ::dup2(null, 0);
      ::dup2(null, 1);
      ::dup2(null, 2);
      const std::string accept = "127.0.0.1:" + std::to_string(port);
      ::execlp("openssl", "openssl", "s_server", "-accept", accept.c_str(), "-cert", "server.pem", "-key",
               "server.key", "-WWW", "-quiet", static_cast<char*>(nullptr));
      _exit(127);
    }
    REQUIRE(pid > 0);
    // Ready once it accepts.
    REQUIRE(eventually([&] {
      const int s = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in to = at;
      to.sin_port = htons(static_cast<uint16_t>(port));
      const bool ok = ::connect(s, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0;
      ::close(s);
      return ok;
    }));
  }
  ~TlsServer() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

// SSL_CERT_FILE while in scope: OpenSSL's default verify paths (the system CA store) read it.
struct CaStore {
  explicit CaStore(const std::string& file) { ::setenv("SSL_CERT_FILE", file.c_str(), 1); }
  ~CaStore() { ::unsetenv("SSL_CERT_FILE"); }
};

std::string start_error(const std::string& url) {
  Verifier v(jwks_settings(url), nullptr);
  try {
    v.start();
  } catch (const outlive::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("https: the certificate is checked against the CA store and the host name") {
  TempDir dir;
  dir.write("jwks.json", jwks({&key_a()}));
  SECTION("a certificate for localhost and 127.0.0.1") {
    TlsServer server(dir, "DNS:localhost,IP:127.0.0.1");
    const std::string port = std::to_string(server.port);
    {
      CaStore store((dir.path / "ca.pem").string());
      CHECK(start_error("https://localhost:" + port + "/jwks.json") == "");
      CHECK(start_error("https://127.0.0.1:" + port + "/jwks.json") == "");
    }
    // Without the test's CA in the store the same server is not trusted.
    CHECK_THAT(start_error("https://localhost:" + port + "/jwks.json"),
               Catch::Contains("TLS handshake") && Catch::Contains("certificate verify failed"));
  }
  SECTION("a certificate for another name") {
    TlsServer server(dir, "DNS:other.example");
    CaStore store((dir.path / "ca.pem").string());
    const std::string port = std::to_string(server.port);
    CHECK_THAT(start_error("https://localhost:" + port + "/jwks.json"),
               Catch::Contains("certificate verify failed"));
    CHECK_THAT(start_error("https://127.0.0.1:" + port + "/jwks.json"),
               Catch::Contains("certificate verify failed"));
  }
}
