// loopback_floor: what the kernel alone costs a server per frame on this machine (issues 5, 13).
//
// N loopback TCP connections, set up as outlive sets up its sockets, from the same 127.x.y.z
// source addresses as fanout_bench's load client; one thread sends the same pre-framed bytes to
// every socket, one `sendmsg` per socket per round (or `--batch B` frames in one `sendmsg`). The
// sender's CPU time per frame is the floor (bench/floor.hpp). fanout_bench measures the same floor
// in its own run; this program is for looking at the floor alone (and at batching).
//
//   build/bench/loopback_floor [--sockets 5000] [--rounds 20] [--size 200] [--batches 1,2,5,10]
//                              [--repeat 3] [--pause-ms 0] [--latency-threads T]
//
// --latency-threads T also measures the latency floor (bench/floor.hpp): rounds --pause-ms apart
// (50 if 0) sent by T threads and read by one epoll thread, p50 / p99 from the round's start.
#include <sys/resource.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "bench/common.hpp"
#include "bench/floor.hpp"
#include "bench/load.hpp"

using namespace outlive::bench;

int main(int argc, char** argv) {
  int sockets = 5000, rounds = 20, size = 200, repeat = 3, pause_ms = 0, latency_threads = 0;
  std::vector<int> batches{1, 2, 5, 10};
  std::string command = "build/bench/loopback_floor";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--sockets")
      sockets = std::stoi(value);
    else if (flag == "--rounds")
      rounds = std::stoi(value);
    else if (flag == "--size")
      size = std::max(64, std::stoi(value));
    else if (flag == "--batches") {
      batches.clear();
      std::stringstream in(value);
      for (std::string item; std::getline(in, item, ',');) batches.push_back(std::stoi(item));
    } else if (flag == "--repeat")
      repeat = std::stoi(value);
    else if (flag == "--pause-ms")
      pause_ms = std::stoi(value);
    else if (flag == "--latency-threads")
      latency_threads = std::stoi(value);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
  try {
    LoadSampler load;
    FloorSockets floor(sockets, /*source_group=*/0);
    std::printf("### loopback_floor, %s\n\n- Machine: %s\n", now_utc().c_str(),
                machine_line().c_str());
    std::printf("- %d sockets, %d rounds %d ms apart, frames of %d bytes, best of %d\n\n", sockets,
                rounds, pause_ms, size, repeat);
    std::printf(
        "| frames per sendmsg | sender CPU s | µs per sendmsg | µs per frame | frames per CPU-s "
        "|\n|---:|---:|---:|---:|---:|\n");
    for (int batch : batches) {
      const auto r = floor.measure(rounds, size, batch, repeat, pause_ms);
      std::printf("| %d | %.3f | %.2f | %.2f | **%.0f** |\n", batch, r.cpu_seconds,
                  r.cpu_seconds / r.calls * 1e6, r.us_per_frame(), r.frames_per_cpu_s());
    }
    const auto u = floor.measure_uring(rounds, size, repeat, pause_ms);
    if (u.frames > 0)
      std::printf("| 1, io_uring (128 sendmsg per submission) | %.3f | %.2f | %.2f | **%.0f** |\n",
                  u.cpu_seconds, u.cpu_seconds / u.calls * 1e6, u.us_per_frame(),
                  u.frames_per_cpu_s());
    if (latency_threads > 0) {
      const int pause = pause_ms > 0 ? pause_ms : 50;
      const auto l = floor.measure_latency(rounds, size, pause, latency_threads, 10);
      std::printf(
          "\nLatency floor: %d rounds %d ms apart, %d sender threads, one epoll reader, "
          "every 10th socket: p50 %.1f / p99 %.1f / max %.1f ms; CPU per round %.1f ms "
          "sending, %.1f ms reading\n",
          rounds, pause, latency_threads, l.p50_ms, l.p99_ms, l.max_ms, l.sender_cpu_s * 1e3,
          l.reader_cpu_s * 1e3);
    }
    const auto w = load.stop();
    std::printf("\n- Load average (1 min) start / end: %.2f / %.2f%s\n- Command: `%s`\n", w.start,
                w.end, w.quiet() ? "" : " (above 1.0: not a quiet machine)", command.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loopback_floor: %s\n", e.what());
    return 1;
  }
  return 0;
}
