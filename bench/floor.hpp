#pragma once
// The kernel's floor per frame (issue 13): what one `sendmsg` of a pre-framed websocket frame to
// each of N loopback TCP sockets costs the sending thread, with nothing else (no websocket code,
// no JSON, no queues). On loopback the receiver's TCP work runs inside the sender's `sendmsg`, so
// this is the least any server can spend per frame on this machine. loopback_floor prints it
// alone; fanout_bench measures it in the same run as the servers, with the same socket count,
// frame size and source addresses, so the servers' CPU per frame can be given as a ratio to it.
#include <string>
#include <vector>

namespace outlive::bench {

// The source address of socket i of a group: 127.<group + 1>.x.y, 4 sockets per address (outlive
// allows 5 socket opens per second per address for API keys). The load clients and the floor
// share it, so the floor's TCP connections look like the servers' to the kernel.
std::string source_address(int group, int i);

struct FloorResult {
  int sockets = 0;
  int frame_bytes = 0;
  int batch = 1;
  double cpu_seconds = 0;  // the sender thread's user + system time, best repeat
  double frames = 0;
  double calls = 0;
  double us_per_frame() const { return frames > 0 ? cpu_seconds / frames * 1e6 : 0; }
  double frames_per_cpu_s() const { return cpu_seconds > 0 ? frames / cpu_seconds : 0; }
};

// The least commit-to-frame latency this machine allows a fan-out (issue 13's p99 target): rounds
// `pause_ms` apart, each sent by `sender_threads` threads (as outlive's io threads share the
// sockets) with one sendmsg per socket and read back by one epoll thread (as fanout_bench's load
// client reads). Latency is from the round's scheduled start to a frame's arrival at the reader,
// on every `sample_every`'th socket: no database, no NATS, no websocket code, nothing but the
// kernel's work on both sides and the two cores' time it takes.
struct LatencyFloor {
  int sockets = 0, rounds = 0, sender_threads = 0, pause_ms = 0;
  double p50_ms = 0, p99_ms = 0, max_ms = 0;
  double sender_cpu_s = 0, reader_cpu_s = 0;  // per round, summed over threads
};

// N connected loopback pairs set up as outlive sets up its sockets (TCP_NODELAY, 64 KiB send
// buffer, non-blocking). Throws std::runtime_error when a socket cannot be made.
class FloorSockets {
 public:
  FloorSockets(int sockets, int source_group);
  ~FloorSockets();
  FloorSockets(const FloorSockets&) = delete;
  FloorSockets& operator=(const FloorSockets&) = delete;

  // `rounds` rounds of one sendmsg (of `batch` frames of `frame_bytes`) per socket, best of
  // `repeat` by CPU per frame. `pause_ms` between rounds (not counted: the thread sleeps) gives the
  // cadence of a server at a given update rate: after a pause the sockets' kernel state is no
  // longer in the caches that back-to-back rounds keep warm.
  FloorResult measure(int rounds, int frame_bytes, int batch, int repeat, int pause_ms = 0) {
    return best_of(rounds, frame_bytes, batch, repeat, pause_ms, false);
  }
  // The same frames through io_uring, as outlive writes a round (ws::SendBatch): one sendmsg per
  // socket, 128 submitted per system call. frames == 0 when liburing or io_uring is missing.
  FloorResult measure_uring(int rounds, int frame_bytes, int repeat, int pause_ms = 0) {
    return best_of(rounds, frame_bytes, 1, repeat, pause_ms, true);
  }
  LatencyFloor measure_latency(int rounds, int frame_bytes, int pause_ms, int sender_threads,
                               int sample_every);
  int size() const { return static_cast<int>(senders_.size()); }

 private:
  FloorResult best_of(int rounds, int frame_bytes, int batch, int repeat, int pause_ms, bool uring);
  FloorResult run_once(int rounds, int frame_bytes, int batch, int pause_ms, bool uring);
  std::vector<int> senders_, receivers_;
  int listener_ = -1;
};

}  // namespace outlive::bench
