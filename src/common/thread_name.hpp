#pragma once
// Names the calling thread as `top -H`, `perf` and /proc/<pid>/task/<tid>/comm show it: a
// replica's io threads, dispatchers and pool workers are then told apart in a profile, and the
// benches split the replica's CPU by role. Linux keeps 15 bytes.
#include <pthread.h>

#include <string>

namespace outlive {

inline void name_this_thread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

}  // namespace outlive
