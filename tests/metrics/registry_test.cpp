// The registry and its text format, hermetic: types, exact integers, cumulative buckets, names
// Prometheus rejects, and the process_* figures of this test process.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <map>
#include <regex>
#include <sstream>

#include "metrics/metrics.hpp"
#include "metrics/process.hpp"

using namespace outlive::metrics;
using Catch::Contains;

namespace {

// `series value` lines of the exposition, by series (name and labels as printed).
std::map<std::string, std::string> samples(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.rfind(' ');
    out[line.substr(0, space)] = line.substr(space + 1);
  }
  return out;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

TEST_CASE("counters are typed counter and print every digit") {
  Registry r;
  auto& frames = r.counter("outlive_frames_sent_total", "Frames", {{"app", "inventory"}});
  frames = 33554432;  // 2^25: six significant digits printed it as 3.35544e+07
  r.counter("outlive_published_total", "Published", {{"app", "inventory"}},
            [] { return 9007199254740992.0; });  // 2^53, the last integer a double holds exactly
  const auto text = r.render();
  CHECK_THAT(text, Contains("# TYPE outlive_frames_sent_total counter\n"));
  CHECK_THAT(text, Contains("# TYPE outlive_published_total counter\n"));
  const auto s = samples(text);
  CHECK(s.at(R"(outlive_frames_sent_total{app="inventory"})") == "33554432");
  CHECK(s.at(R"(outlive_published_total{app="inventory"})") == "9007199254740992");
  frames++;
  CHECK(samples(r.render()).at(R"(outlive_frames_sent_total{app="inventory"})") == "33554433");
}

TEST_CASE("the same name and labels are the same counter, other labels another") {
  Registry r;
  auto& a = r.counter("outlive_socket_closes_total", "Closes", {{"code", "1001"}});
  CHECK(&a == &r.counter("outlive_socket_closes_total", "Closes", {{"code", "1001"}}));
  CHECK(&a != &r.counter("outlive_socket_closes_total", "Closes", {{"code", "1011"}}));
  a += 2;
  const auto s = samples(r.render());
  CHECK(s.at(R"(outlive_socket_closes_total{code="1001"})") == "2");
  CHECK(s.at(R"(outlive_socket_closes_total{code="1011"})") == "0");
}

TEST_CASE("gauges are read when rendered and keep fractions") {
  Registry r;
  double value = -1;
  r.gauge("outlive_lease_heartbeat_age_seconds", "Age", {}, [&] { return value; });
  CHECK_THAT(r.render(), Contains("# TYPE outlive_lease_heartbeat_age_seconds gauge\n"));
  CHECK(samples(r.render()).at("outlive_lease_heartbeat_age_seconds") == "-1");
  value = 0.123456789;
  CHECK(samples(r.render()).at("outlive_lease_heartbeat_age_seconds") == "0.123456789");
}

TEST_CASE("histogram buckets are cumulative, inclusive at their bound, and end with +Inf") {
  Registry r;
  auto& h = r.histogram("outlive_commit_to_send_seconds", "Delay", {{"app", "inventory"}});
  // Each side of the first bound (1 ms), of a middle one (1 s) and of the last (10 s).
  for (double v : {0.001, 0.0011, 1.0, 1.0001, 10.0, 10.5}) h.observe(v);
  r.observe("outlive_commit_to_send_seconds", "Delay", {{"app", "inventory"}}, 0.0002);
  const auto text = r.render();
  CHECK_THAT(text, Contains("# TYPE outlive_commit_to_send_seconds histogram\n"));
  const auto s = samples(text);
  const auto bucket = [&](const std::string& le) {
    return s.at(R"(outlive_commit_to_send_seconds_bucket{app="inventory",le=")" + le + "\"}");
  };
  CHECK(bucket("0.001") == "2");  // 0.0002 and 0.001
  CHECK(bucket("0.0025") == "3");
  CHECK(bucket("0.5") == "3");
  CHECK(bucket("1") == "4");
  CHECK(bucket("2.5") == "5");
  CHECK(bucket("10") == "6");
  CHECK(bucket("+Inf") == "7");
  CHECK(s.at(R"(outlive_commit_to_send_seconds_count{app="inventory"})") == "7");
  CHECK(std::stod(s.at(R"(outlive_commit_to_send_seconds_sum{app="inventory"})")) ==
        Approx(0.001 + 0.0011 + 1.0 + 1.0001 + 10.0 + 10.5 + 0.0002));
  // Every documented bound is there, in order, cumulative.
  double last = 0;
  for (double bound : latency_buckets()) {
    std::ostringstream le;
    le << bound;
    const double n = std::stod(bucket(le.str()));
    CHECK(n >= last);
    last = n;
  }
  CHECK(latency_buckets().front() == 0.001);
  CHECK(latency_buckets().back() == 10);
  CHECK(text.find("quantile") == std::string::npos);
}

TEST_CASE("names and labels Prometheus rejects, and a name of two types, are refused") {
  Registry r;
  CHECK_THROWS_AS(r.counter("outlive-bad", "h"), std::logic_error);
  CHECK_THROWS_AS(r.counter("outlive_ok_total", "h", {{"bad-label", "x"}}), std::logic_error);
  CHECK_THROWS_AS(r.histogram("outlive_h_seconds", "h", {{"le", "1"}}), std::logic_error);
  r.counter("outlive_kind_total", "h");
  CHECK_THROWS_AS(r.gauge("outlive_kind_total", "h", {}, [] { return 1.0; }), std::logic_error);
  CHECK_THROWS_AS(r.histogram("outlive_kind_total", "h", {}), std::logic_error);
  // A valid one next to them is fine, and the refused ones left nothing behind.
  r.gauge("outlive_ok", "h", {{"app", "a"}}, [] { return 1.0; });
  const auto text = r.render();
  CHECK(text.find("outlive-bad") == std::string::npos);
  CHECK(text.find("outlive_h_seconds") == std::string::npos);
  CHECK_THAT(text, Contains(R"(outlive_ok{app="a"} 1)"));
}

TEST_CASE("label values are escaped") {
  Registry r;
  r.counter("outlive_x_total", "h", {{"v", "a\"b\\c\nd"}}) += 1;
  CHECK_THAT(r.render(), Contains(R"(outlive_x_total{v="a\"b\\c\nd"} 1)"));
}

TEST_CASE("process metrics read this process, build info names the version and the commit") {
  Registry r;
  auto process = ProcessMetrics::register_on(r);
  const auto text = r.render();
  for (const char* type :
       {"# TYPE process_cpu_seconds_total counter", "# TYPE process_resident_memory_bytes gauge",
        "# TYPE process_virtual_memory_bytes gauge", "# TYPE process_open_fds gauge",
        "# TYPE process_max_fds gauge", "# TYPE process_start_time_seconds gauge",
        "# TYPE outlive_build_info gauge"})
    CHECK_THAT(text, Contains(type));
  const auto s = samples(text);
  // A short hash, or "unknown" outside a git checkout.
  CHECK(std::regex_match(OUTLIVE_TEST_COMMIT, std::regex("[0-9a-f]{4,40}|unknown")));
  CHECK(s.at("outlive_build_info{version=\"" OUTLIVE_TEST_VERSION "\",commit=\"" OUTLIVE_TEST_COMMIT
             "\"}") == "1");
  const auto stat = read_process_stat();
  REQUIRE(stat);
  CHECK(stat->resident_bytes > 1e6);
  CHECK(stat->virtual_bytes >= stat->resident_bytes);
  CHECK(stat->cpu_seconds >= 0);
  // Started before now and after the test binary could have (this run).
  CHECK(stat->start_time_seconds <= now_seconds() + 1);
  CHECK(stat->start_time_seconds > now_seconds() - 3600);
  CHECK(std::stod(s.at("process_max_fds")) >= 64);
  // A descriptor more shows once sampled, and goes with its close.
  const double before = count_open_fds();
  const int fd = ::open("/dev/null", O_RDONLY);
  REQUIRE(fd >= 0);
  CHECK(count_open_fds() == before + 1);
  process->sample_open_fds();
  CHECK(std::stod(samples(r.render()).at("process_open_fds")) == before + 1);
  ::close(fd);
  CHECK(count_open_fds() == before);
  // CPU time grows with work.
  const double cpu = read_process_stat()->cpu_seconds;
  volatile double x = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (std::chrono::steady_clock::now() < until) x = x + std::sqrt(x + 1);
  CHECK(read_process_stat()->cpu_seconds > cpu);
}
