// The pool's rule for connections opened before one was found dead (db/liveness.hpp, issue 47
// item 6): hermetic, no server.
#include <catch2/catch.hpp>
#include <thread>
#include <vector>

#include "db/liveness.hpp"

using outlive::db::Generations;

TEST_CASE("generations: nothing is suspect until a connection is found dead") {
  Generations g;
  const auto a = g.current();
  const auto b = g.current();
  CHECK_FALSE(g.suspect(a));
  CHECK_FALSE(g.suspect(b));
}

TEST_CASE("generations: one dead connection makes every connection as old suspect, not newer ones") {
  Generations g;
  const auto before = g.current();  // opened before the outage
  g.failed(before);
  CHECK(g.suspect(before));
  const auto after = g.current();  // its replacement
  CHECK(after > before);
  CHECK_FALSE(g.suspect(after));
}

TEST_CASE("generations: the other dead connections of the same outage do not condemn replacements") {
  Generations g;
  const auto old = g.current();
  g.failed(old);
  const auto fresh = g.current();
  // Three more connections of the old generation are found dead while fresh ones are in use.
  for (int i = 0; i < 3; ++i) g.failed(old);
  CHECK(g.current() == fresh);
  CHECK_FALSE(g.suspect(fresh));
  // A fresh one dying is a new loss: everything as old as it goes too.
  g.failed(fresh);
  CHECK(g.suspect(fresh));
  CHECK(g.suspect(old));
}

TEST_CASE("generations: failures reported from many workers at once move it once per generation") {
  Generations g;
  const auto old = g.current();
  std::vector<std::thread> workers;
  for (int i = 0; i < 8; ++i) {
    workers.emplace_back([&] {
      for (int n = 0; n < 1000; ++n) g.failed(old);
    });
  }
  for (auto& w : workers) w.join();
  CHECK(g.current() == old + 1);
}
