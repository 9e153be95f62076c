#include "bench/retouch.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace outlive::bench {

namespace {

constexpr size_t kPage = 4096;

double now_us() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return double(t.tv_sec) * 1e6 + double(t.tv_nsec) / 1e3;
}

// One byte of every page; volatile so neither pass is optimised away.
double pass_us(const volatile char* memory, size_t bytes) {
  const double started = now_us();
  long sum = 0;
  for (size_t i = 0; i < bytes; i += kPage) sum += memory[i];
  (void)sum;
  return now_us() - started;
}

// The child: only system calls after fork (the parent has threads).
[[noreturn]] void child_loop(int in, int out, size_t bytes) {
  auto* memory = static_cast<char*>(
      mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (memory == MAP_FAILED) _exit(1);
  for (size_t i = 0; i < bytes; i += kPage) memory[i] = 1;
  char command = 0;
  while (read(in, &command, 1) == 1) {
    const double passes[2] = {pass_us(memory, bytes), pass_us(memory, bytes)};
    if (write(out, passes, sizeof passes) != sizeof passes) _exit(1);
  }
  _exit(0);  // the parent closed its end
}

}  // namespace

RetouchProbe::RetouchProbe(int mib) : pages_(static_cast<int>((size_t(mib) << 20) / kPage)) {
  int down[2], up[2];
  if (pipe2(down, O_CLOEXEC) != 0)
    throw std::runtime_error("RetouchProbe: pipe: " + std::string(strerror(errno)));
  if (pipe2(up, O_CLOEXEC) != 0) {
    close(down[0]);
    close(down[1]);
    throw std::runtime_error("RetouchProbe: pipe: " + std::string(strerror(errno)));
  }
  child_ = fork();
  if (child_ < 0) throw std::runtime_error("RetouchProbe: fork: " + std::string(strerror(errno)));
  if (child_ == 0) {
    close(down[1]);
    close(up[0]);
    child_loop(down[0], up[1], size_t(mib) << 20);
  }
  close(down[0]);
  close(up[1]);
  to_child_ = down[1];
  from_child_ = up[0];
  last_ = std::chrono::steady_clock::now();
}

RetouchProbe::~RetouchProbe() {
  if (to_child_ >= 0) close(to_child_);
  if (from_child_ >= 0) close(from_child_);
  if (child_ > 0) waitpid(child_, nullptr, 0);
}

RetouchProbe::Touch RetouchProbe::touch() {
  Touch t;
  t.pages = pages_;
  const auto now = std::chrono::steady_clock::now();
  t.slept_s = std::chrono::duration<double>(now - last_).count();
  const char command = 't';
  double passes[2] = {0, 0};
  if (write(to_child_, &command, 1) != 1 ||
      read(from_child_, passes, sizeof passes) != static_cast<ssize_t>(sizeof passes))
    throw std::runtime_error("RetouchProbe: the child is gone");
  last_ = std::chrono::steady_clock::now();
  t.after_sleep_us = passes[0] / pages_;
  t.warm_us = passes[1] / pages_;
  return t;
}

}  // namespace outlive::bench
