// Per-address state (SPEC 5.7 rev 3): freed once an address is quiet, IPv6 counted per prefix.
#include <catch2/catch.hpp>
#include <chrono>
#include <string>

#include "admission/admission.hpp"
#include "admission/proxies.hpp"

using namespace outlive::admission;
using namespace std::chrono_literals;

TEST_CASE("IPv6 addresses count per /64 by default, IPv4 addresses each on their own") {
  CHECK(limit_key("2001:db8:1:2:aaaa:bbbb:cccc:dddd") == "2001:db8:1:2::/64");
  CHECK(limit_key("2001:db8:1:2::1") == limit_key("2001:db8:1:2:ffff::9"));
  CHECK(limit_key("2001:db8:1:3::1") != limit_key("2001:db8:1:2::1"));
  CHECK(limit_key("2001:db8:1:2:aaaa::1", 48) == "2001:db8:1::/48");
  CHECK(limit_key("2001:db8::1", 128) == "2001:db8::1/128");
  CHECK(limit_key("[2001:db8::1]") == "2001:db8::/64");
  CHECK(limit_key("10.1.2.3") == "10.1.2.3");
  CHECK(limit_key("10.1.2.4") != limit_key("10.1.2.3"));
  CHECK(limit_key("unknown") == "unknown");
  CHECK(limit_key("\xff\xfe") == "\xff\xfe");
}

TEST_CASE("failed lookups from one /64 share one budget of 5 per second") {
  Admission a("session", 5, 16);
  const auto t = Admission::Clock::now();
  for (int i = 0; i < 5; ++i) {
    const std::string address = "2001:db8:7:7::" + std::to_string(i + 1);
    REQUIRE(a.begin_lookup(address, t) == Admission::Gate::go);
    a.lookup_ended(address, false, t);
  }
  CHECK(a.begin_lookup("2001:db8:7:7::99", t) == Admission::Gate::refuse);
  CHECK(a.begin_lookup("2001:db8:7:8::1", t) == Admission::Gate::go);
}

TEST_CASE("the state of 50,000 addresses with failed lookups is freed once they are quiet") {
  Admission a("session", 5, 16);
  const auto t = Admission::Clock::now();
  for (int i = 0; i < 50000; ++i) {
    const std::string address = "10." + std::to_string(i >> 16) + "." +
                                std::to_string((i >> 8) & 255) + "." + std::to_string(i & 255);
    REQUIRE(a.begin_lookup(address, t) == Admission::Gate::go);
    a.lookup_ended(address, false, t);
    // Opens without a cookie count per address too.
    OpenRequest r{"inventory", "", "Bearer junk", "", address};
    (void)a.before_lookup(r, {}, t);
  }
  CHECK(a.tracked() >= 50000);
  a.forget_quiet(t + 500ms);  // still within their second
  CHECK(a.tracked() >= 50000);
  a.forget_quiet(t + 1500ms);
  CHECK(a.tracked() == 0);
}

TEST_CASE("an address still in its second keeps its count through a sweep") {
  Admission a("session", 5, 16);
  const auto t = Admission::Clock::now();
  for (int i = 0; i < 5; ++i) {
    REQUIRE(a.begin_lookup("10.0.0.1", t) == Admission::Gate::go);
    a.lookup_ended("10.0.0.1", false, t);
  }
  a.forget_quiet(t + 1100ms);  // (a sweep at most once a second: this one runs)
  CHECK(a.tracked() == 0);
  for (int i = 0; i < 5; ++i) {
    REQUIRE(a.begin_lookup("10.0.0.1", t + 1900ms) == Admission::Gate::go);
    a.lookup_ended("10.0.0.1", false, t + 1900ms);
  }
  a.forget_quiet(t + 2200ms);  // a sweep runs; these failures are 300 ms old
  CHECK(a.tracked() == 1);
  CHECK(a.begin_lookup("10.0.0.1", t + 2250ms) == Admission::Gate::refuse);
}
