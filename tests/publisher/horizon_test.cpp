// The owner's cursor (publisher/horizon.hpp), pure: it passes a read's positions only once the
// writers that held them have ended, and a full read never lets it pass what it did not return.
#include <catch2/catch.hpp>

#include "publisher/horizon.hpp"

using outlive::outbox::ReadResult;
using outlive::publisher::Horizon;

namespace {

ReadResult read_of(int64_t handed_out, uint64_t xid_bound, uint64_t writers_xmin) {
  ReadResult r;
  r.handed_out = handed_out;
  r.xid_bound = xid_bound;
  r.writers_xmin = writers_xmin;
  return r;
}

}  // namespace

TEST_CASE("the cursor passes a read's positions once every writer below its id has ended") {
  Horizon h;
  // Positions up to 10 handed out below id 100; a writer with id 90 is still running.
  h.advance(read_of(10, 100, 90), 9, false);
  CHECK(h.cursor() == 0);
  // Later reads: the writer is still there; then it has ended, but one with id 101 runs, which
  // may hold a position handed out before the second read (bound 105); then that one has ended.
  h.advance(read_of(12, 105, 90), 12, false);
  CHECK(h.cursor() == 0);
  h.advance(read_of(12, 106, 101), 12, false);
  CHECK(h.cursor() == 10);
  h.advance(read_of(12, 107, 108), 12, false);
  CHECK(h.cursor() == 12);
}

TEST_CASE("a writer exactly at the bound still holds the cursor, one above it does not") {
  Horizon at;
  at.advance(read_of(10, 100, 100), 10, false);
  CHECK(at.cursor() == 0);
  Horizon above;
  above.advance(read_of(10, 100, 101), 10, false);
  CHECK(above.cursor() == 10);
}

TEST_CASE("a full read moves the cursor no further than the last position it returned") {
  Horizon h;
  h.advance(read_of(500, 100, 101), 100, true);
  CHECK(h.cursor() == 100);
  h.advance(read_of(500, 101, 102), 200, true);
  CHECK(h.cursor() == 200);
  h.advance(read_of(500, 102, 103), 450, false);
  CHECK(h.cursor() == 500);
}

TEST_CASE("reset starts the cursor from the beginning and forgets what was waiting") {
  Horizon h;
  h.advance(read_of(10, 100, 50), 10, false);
  h.reset();
  h.advance(read_of(20, 200, 201), 20, false);
  CHECK(h.cursor() == 20);
  h.advance(read_of(30, 300, 301), 30, false);
  CHECK(h.cursor() == 30);
}
