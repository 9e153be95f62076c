// retouch_floor: what this machine charges a process for memory it touches again after sleeping
// (issue 13; bench/retouch.hpp). A child maps --mib MiB and sleeps; after each of the --sleeps it
// reads one byte of every page twice: the first pass pays for the sleep, the second is warm.
//
//   build/bench/retouch_floor [--mib 32] [--sleeps 0,1,5,20,60]
//
// A revocation after a pause (fanout_bench --idle-before) pays this in every process that slept:
// the pool's Postgres backends, the replica's io threads.
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/common.hpp"
#include "bench/load.hpp"
#include "bench/retouch.hpp"

using namespace outlive::bench;

int main(int argc, char** argv) {
  int mib = 32;
  std::vector<double> sleeps{0, 1, 5, 20, 60};
  std::string command = "build/bench/retouch_floor";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--mib") {
      mib = std::stoi(value);
    } else if (flag == "--sleeps") {
      sleeps.clear();
      std::stringstream in(value);
      for (std::string item; std::getline(in, item, ',');) sleeps.push_back(std::stod(item));
    } else {
      std::fprintf(stderr, "retouch_floor: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (argc % 2 == 0 || mib < 1 || sleeps.empty()) {
    std::fprintf(stderr, "usage: retouch_floor [--mib 32] [--sleeps 0,1,5,20,60]\n");
    return 2;
  }
  try {
    LoadSampler load;
    RetouchProbe probe(mib);
    std::printf(
        "### retouch_floor, %s\n\n- Machine: %s\n- %d MiB, one byte read per 4 KiB page\n\n",
        now_utc().c_str(), machine_line().c_str(), mib);
    std::printf(
        "| asleep s | first pass µs per page | warm pass µs per page | first pass ms for "
        "all pages |\n|---:|---:|---:|---:|\n");
    for (double s : sleeps) {
      probe.touch();  // warm, and the sleep starts now
      std::this_thread::sleep_for(std::chrono::duration<double>(s));
      const auto t = probe.touch();
      std::printf("| %.1f | %.3f | %.3f | %.2f |\n", t.slept_s, t.after_sleep_us, t.warm_us,
                  t.after_sleep_us * t.pages / 1e3);
      std::fflush(stdout);
    }
    const auto w = load.stop();
    std::printf("\n- Load average (1 min) start / end: %.2f / %.2f%s\n- Command: `%s`\n", w.start,
                w.end, w.quiet() ? "" : " (above 1.0: not a quiet machine)", command.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "retouch_floor: %s\n", e.what());
    return 1;
  }
  return 0;
}
