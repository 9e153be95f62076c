// nats_loop_bench: what one JetStream publish and its acknowledgement cost the publishing process
// at W1's cadence (issue 46: bursts of --burst publishes every --interval-ms, 2,000 a second by
// default), two ways, in the same run against the same nats-server:
//
//   A  outlive's publisher today: topic::Client::publish_async (nats.c with SendAsap: one send per
//      publish; the acks read by nats.c's reader thread and handed to its dispatcher thread, which
//      runs our handler), the acks taken by the loop at its next turn;
//   B  nats.c driven by the caller's own loop (natsOptions_SetEventLoop): nats.c starts no reader
//      or flusher thread, a burst's publishes leave in one write when the loop finds the socket
//      writable, and the acks are read from a synchronous subscription on the loop's thread
//      (core publishes with a reply subject of our own; the ack is JetStream's PubAck JSON);
//   C  as B, the acks read when the loop turns for its next burst (as A's loop takes them);
//   F  the floor: the NATS protocol on a plain socket, no client library (a burst's HPUBs in one
//      write, the acks parsed from what one read brings).
//
// Prints the process's CPU (every thread, getrusage) per publish, context switches per publish,
// nats-server's CPU per publish, publish-to-ack latency, and each row's ratio to A and to F. The
// command and the load average go with the table (docs/BENCHMARKS.md "What NATS costs the
// publisher").
//
//   build/bench/nats_loop_bench [--seconds 20] [--burst 10] [--interval-ms 5] [--settle-load 0.8]
//                               [--phases ABCF]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <nats/nats.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bench/common.hpp"
#include "bench/load.hpp"
#include "harness/embedded_nats.hpp"
#include "topic/client.hpp"
#include "topic/wire.hpp"

namespace {

using Steady = std::chrono::steady_clock;
using namespace outlive;

struct Flags {
  int seconds = 20;
  int burst = 10;
  int interval_ms = 5;
  double settle_load = 0;
  std::string phases = "ABCF";
};

struct Usage {
  double cpu = 0;  // seconds, every thread
  long switches = 0;
  double server_cpu = 0;
};

Usage usage_now(pid_t server) {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  Usage u;
  u.cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
          ru.ru_stime.tv_usec / 1e6;
  u.switches = ru.ru_nvcsw + ru.ru_nivcsw;
  if (auto p = bench::read_proc(std::to_string(server))) u.server_cpu = p->own;
  return u;
}

struct Result {
  std::string label;
  long published = 0;
  long acked = 0;
  long failed = 0;
  double cpu_us = 0;       // per publish
  double switches = 0;     // per publish
  double server_us = 0;    // per publish
  double p50_ms = 0, p99_ms = 0;
  double load_before = 0, load_after = 0;
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

// The row's figures per publish, from the usage before and after its run.
void finish(Result& r, const Usage& before, const Usage& after, const std::vector<double>& latencies) {
  const double n = r.published > 0 ? double(r.published) : 1.0;
  r.cpu_us = (after.cpu - before.cpu) * 1e6 / n;
  r.switches = double(after.switches - before.switches) / n;
  r.server_us = (after.server_cpu - before.server_cpu) * 1e6 / n;
  r.p50_ms = percentile(latencies, 0.5);
  r.p99_ms = percentile(latencies, 0.99);
}

// A JetStream PubAck read off the wire (B, C, F): {"stream":..,"seq":N} or {"error":{..}}.
void count_ack(Result& r, std::string_view ack, Steady::time_point sent_at,
               std::vector<double>& latencies, std::atomic<long>& answered) {
  if (ack.find("\"seq\":") != std::string_view::npos &&
      ack.find("\"error\"") == std::string_view::npos)
    r.acked++;
  else
    r.failed++;
  latencies.push_back(std::chrono::duration<double, std::milli>(Steady::now() - sent_at).count());
  answered++;
}

std::string payload_of(long i) {
  return R"({"op":"upsert","data":{"id":"user-)" + std::to_string(i % 2000) +
         R"(","n":)" + std::to_string(i) + R"(,"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}})";
}

// Runs `publish_burst(first, count)` every interval for the run's seconds, `take_acks(timeout)` in
// between (it waits at most `timeout` for something to do), then waits up to 10 s for the rest.
template <typename Burst, typename Take>
void paced(const Flags& f, long& published, const std::atomic<long>& answered, Burst publish_burst,
           Take take_acks) {
  const auto start = Steady::now();
  const auto end = start + std::chrono::seconds(f.seconds);
  auto next = start;
  while (Steady::now() < end) {
    if (Steady::now() >= next) {
      publish_burst(published, f.burst);
      published += f.burst;
      next += std::chrono::milliseconds(f.interval_ms);
    }
    take_acks(std::max(Steady::duration::zero(), next - Steady::now()));
  }
  const auto deadline = Steady::now() + std::chrono::seconds(10);
  while (answered.load() < published && Steady::now() < deadline)
    take_acks(std::chrono::milliseconds(5));
}

// --- A: topic::Client, as the publisher uses it ------------------------------------------------

Result run_threads(const Flags& f, const harness::EmbeddedNats& nats) {
  Result r;
  r.label = "A: topic::Client (nats.c threads, SendAsap)";
  topic::Client client({nats.url()}, "bench-a");
  const std::string subject = topic::subject_for("bench");
  std::mutex mutex;
  std::vector<topic::PublishResult> results;  // handed over by nats.c's dispatcher thread
  std::atomic<long> answered{0};
  client.set_publish_handler([&](const topic::PublishResult& result) {
    std::lock_guard lock(mutex);
    results.push_back(result);
  });
  std::vector<Steady::time_point> sent_at;
  std::vector<double> latencies;
  std::vector<topic::PublishResult> taken;
  const std::vector<std::pair<std::string, std::string>> headers{{"Outlive-Created-At", "1"}};
  r.load_before = bench::load_average();
  const Usage before = usage_now(nats.pid());
  paced(
      f, r.published, answered,
      [&](long first, int count) {
        for (long i = first; i < first + count; ++i) {
          sent_at.push_back(Steady::now());
          const auto error = client.publish_async(subject, payload_of(i), "a-" + std::to_string(i),
                                                  static_cast<uint64_t>(i), std::chrono::seconds(5),
                                                  headers);
          if (error) {
            r.failed++;
            answered++;
          }
        }
      },
      [&](Steady::duration wait) {
        // The publisher's loop sleeps until its next deadline; acks wait for its next turn.
        std::this_thread::sleep_for(wait);
        {
          std::lock_guard lock(mutex);
          taken.swap(results);
        }
        const auto now = Steady::now();
        for (const auto& res : taken) {
          if (res.ok) r.acked++; else r.failed++;
          latencies.push_back(std::chrono::duration<double, std::milli>(now - sent_at[res.token]).count());
          answered++;
        }
        taken.clear();
      });
  const Usage after = usage_now(nats.pid());
  r.load_after = bench::load_average();
  client.set_publish_handler({});
  finish(r, before, after, latencies);
  return r;
}

// --- B: nats.c on the caller's loop --------------------------------------------------------------

// The loop's view of the connection. nats.c calls attach/read/write from the loop's thread while it
// processes an event, and from its own (reconnect, the PING timer) otherwise: atomics, and an
// eventfd so that a change made elsewhere ends the loop's poll.
struct LoopState {
  natsConnection* nc = nullptr;
  std::atomic<int> fd{-1};
  std::atomic<bool> want_read{false};
  std::atomic<bool> want_write{false};
  int wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  void poke() {
    const uint64_t one = 1;
    (void)!write(wake, &one, sizeof one);
  }
};

natsStatus on_attach(void** user, void* loop, natsConnection* nc, natsSock socket) {
  auto* s = static_cast<LoopState*>(loop);
  s->nc = nc;
  s->fd.store(socket);
  s->want_read.store(true);
  *user = s;
  s->poke();
  return NATS_OK;
}
natsStatus on_read(void* user, bool add) {
  static_cast<LoopState*>(user)->want_read.store(add);
  return NATS_OK;
}
natsStatus on_write(void* user, bool add) {
  auto* s = static_cast<LoopState*>(user);
  if (add && !s->want_write.exchange(true)) s->poke();
  if (!add) s->want_write.store(false);
  return NATS_OK;
}
natsStatus on_detach(void* user) {
  static_cast<LoopState*>(user)->fd.store(-1);
  return NATS_OK;
}

// `ack_wakes`: an ack ends the loop's wait (B); without, acks are read when the loop turns for its
// next deadline (C), as A's loop takes them.
Result run_loop(const Flags& f, const harness::EmbeddedNats& nats, bool ack_wakes) {
  Result r;
  r.label = ack_wakes ? "B: nats.c on the caller's loop (one write a burst), an ack wakes it"
                      : "C: as B, acks read at the loop's next turn";
  const std::string subject = topic::subject_for("bench");
  LoopState state;
  natsOptions* opts = nullptr;
  natsOptions_Create(&opts);
  natsOptions_SetURL(opts, nats.url().c_str());
  natsOptions_SetName(opts, "bench-b");
  natsOptions_SetEventLoop(opts, &state, on_attach, on_read, on_write, on_detach);
  natsConnection* nc = nullptr;
  if (natsConnection_Connect(&nc, opts) != NATS_OK) {
    std::fprintf(stderr, "B: connect failed: %s\n", nats_GetLastError(nullptr));
    std::exit(1);
  }
  natsOptions_Destroy(opts);
  char inbox_buf[64];
  natsInbox* inbox = nullptr;
  natsInbox_Create(&inbox);
  std::snprintf(inbox_buf, sizeof inbox_buf, "%s", inbox);
  natsInbox_Destroy(inbox);
  const std::string prefix = std::string(inbox_buf) + ".";
  natsSubscription* sub = nullptr;
  natsConnection_SubscribeSync(&sub, nc, (prefix + "*").c_str());
  natsSubscription_SetPendingLimits(sub, -1, -1);

  std::vector<Steady::time_point> sent_at;
  std::vector<double> latencies;
  std::atomic<long> answered{0};
  std::string reply;
  auto take = [&] {
    natsMsg* m = nullptr;
    while (natsSubscription_NextMsg(&m, sub, 0) == NATS_OK) {
      const char* subj = natsMsg_GetSubject(m);
      const long token = std::atol(subj + prefix.size());
      count_ack(r, std::string_view(natsMsg_GetData(m), natsMsg_GetDataLength(m)),
                sent_at[token], latencies, answered);
      natsMsg_Destroy(m);
    }
  };
  r.load_before = bench::load_average();
  const Usage before = usage_now(nats.pid());
  paced(
      f, r.published, answered,
      [&](long first, int count) {
        for (long i = first; i < first + count; ++i) {
          sent_at.push_back(Steady::now());
          reply.assign(prefix).append(std::to_string(i));
          const std::string data = payload_of(i);
          natsMsg* m = nullptr;
          natsMsg_Create(&m, subject.c_str(), reply.c_str(), data.data(), static_cast<int>(data.size()));
          natsMsgHeader_Set(m, "Nats-Msg-Id", ("b-" + std::to_string(i)).c_str());
          natsMsgHeader_Set(m, "Outlive-Created-At", "1");
          if (natsConnection_PublishMsg(nc, m) != NATS_OK) {
            r.failed++;
            answered++;
          }
          natsMsg_Destroy(m);
        }
      },
      [&](Steady::duration wait) {
        pollfd fds[2] = {{state.wake, POLLIN, 0}, {state.fd.load(), 0, 0}};
        if (state.want_read.load() && ack_wakes) fds[1].events |= POLLIN;
        if (state.want_write.load()) fds[1].events |= POLLOUT;
        const int ms = static_cast<int>(
            std::chrono::ceil<std::chrono::milliseconds>(wait).count());
        const int n = poll(fds, fds[1].fd >= 0 ? 2 : 1, ms);
        if (!ack_wakes && fds[1].fd >= 0 && state.want_read.load()) {
          pollfd readable{fds[1].fd, POLLIN, 0};
          if (poll(&readable, 1, 0) > 0) fds[1].revents |= readable.revents;
        } else if (n <= 0) {
          return;
        }
        if (fds[0].revents & POLLIN) {
          uint64_t n = 0;
          (void)!read(state.wake, &n, sizeof n);
        }
        if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) natsConnection_ProcessReadEvent(nc);
        if ((fds[1].revents & POLLOUT) && state.want_write.load())
          natsConnection_ProcessWriteEvent(nc);
        take();
      });
  const Usage after = usage_now(nats.pid());
  r.load_after = bench::load_average();
  natsSubscription_Destroy(sub);
  natsConnection_Close(nc);
  natsConnection_Destroy(nc);
  close(state.wake);
  finish(r, before, after, latencies);
  return r;
}

// --- F: the floor: the same messages over a plain socket, no client library ----------------------

// The NATS protocol at its least (src/topic/wire): CONNECT, SUB to the reply inbox, a burst's HPUBs
// in one write, the acks (MSG) parsed from what one read brings, PINGs answered. Nothing a library adds (threads,
// message objects, locks), so what it costs per publish is the kernel's and the server's part.
Result run_floor(const Flags& f, const harness::EmbeddedNats& nats) {
  Result r;
  r.label = "F: floor, the NATS protocol on a plain socket (one write a burst)";
  const std::string subject = topic::subject_for("bench");
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(nats.port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    std::perror("F: connect");
    std::exit(1);
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  auto write_all = [&](const std::string& out) {
    size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = ::write(fd, out.data() + done, out.size() - done);
      if (n <= 0) {
        std::perror("F: write");
        std::exit(1);
      }
      done += static_cast<size_t>(n);
    }
  };
  std::string out;
  topic::wire::append_connect(
      out, R"({"verbose":false,"pedantic":false,"headers":true,"no_responders":true,)"
           R"("name":"bench-f","lang":"raw","version":"0","protocol":1})");
  topic::wire::append_sub(out, "_F.ack.*", 1);
  write_all(out);
  std::vector<Steady::time_point> sent_at;
  std::vector<double> latencies;
  std::atomic<long> answered{0};
  topic::wire::Parser parser;
  char buf[65536];
  std::string pong;
  const auto on_op = [&](const topic::wire::ServerOp& op) {
    if (op.op == topic::wire::Op::msg) {
      const long token = std::atol(std::string(op.subject.substr(op.subject.rfind('.') + 1)).c_str());
      count_ack(r, op.payload, sent_at[token], latencies, answered);
    } else if (op.op == topic::wire::Op::ping) {
      topic::wire::append_pong(pong);
    } else if (op.op == topic::wire::Op::err) {
      std::fprintf(stderr, "F: -ERR %.*s\n", int(op.text.size()), op.text.data());
    }
  };
  r.load_before = bench::load_average();
  const Usage before = usage_now(nats.pid());
  paced(
      f, r.published, answered,
      [&](long first, int count) {
        out.clear();
        for (long i = first; i < first + count; ++i) {
          sent_at.push_back(Steady::now());
          const std::string id = "f-" + std::to_string(i);
          topic::wire::append_publish(out, subject, "_F.ack." + std::to_string(i),
                                      {{"Nats-Msg-Id", id}, {"Outlive-Created-At", "1"}},
                                      payload_of(i));
        }
        write_all(out);
      },
      [&](Steady::duration wait) {
        pollfd p{fd, POLLIN, 0};
        const int ms = static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(wait).count());
        // As C: the acks are read when the loop turns for its next deadline.
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        while (poll(&p, 1, 0) > 0 && (p.revents & POLLIN)) {
          const ssize_t n = ::read(fd, buf, sizeof buf);
          if (n <= 0) break;
          parser.feed(std::string_view(buf, static_cast<size_t>(n)), on_op);
          if (!pong.empty()) write_all(std::exchange(pong, {}));
        }
      });
  const Usage after = usage_now(nats.pid());
  r.load_after = bench::load_average();
  ::close(fd);
  finish(r, before, after, latencies);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--seconds") f.seconds = std::atoi(argv[i + 1]);
    else if (a == "--burst") f.burst = std::atoi(argv[i + 1]);
    else if (a == "--interval-ms") f.interval_ms = std::atoi(argv[i + 1]);
    else if (a == "--settle-load") f.settle_load = std::atof(argv[i + 1]);
    else if (a == "--phases") f.phases = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  harness::EmbeddedNats nats;
  {
    topic::Client setup({nats.url()}, "bench-setup");
    setup.ensure_stream("bench", topic::StreamSettings{});  // outlive's stream, for every row
  }
  std::vector<Result> results;
  for (const char phase : f.phases) {
    if (f.settle_load > 0) bench::settle_load(f.settle_load, 120);
    if (phase == 'A') results.push_back(run_threads(f, nats));
    else if (phase == 'F') results.push_back(run_floor(f, nats));
    else results.push_back(run_loop(f, nats, phase == 'B'));
  }
  std::printf("| %d publishes/s in bursts of %d, %d s | publishes (acked / failed) | CPU per publish "
              "(all threads) | context switches per publish | nats-server CPU per publish | "
              "publish-to-ack p50 / p99 | load before → after |\n|---|---:|---:|---:|---:|---:|---|\n",
              f.burst * 1000 / f.interval_ms, f.burst, f.seconds);
  for (const auto& r : results) {
    std::printf("| %s | %ld (%ld / %ld) | %.1f µs | %.2f | %.1f µs | %.2f / %.2f ms | %.2f → %.2f |\n",
                r.label.c_str(), r.published, r.acked, r.failed, r.cpu_us, r.switches, r.server_us,
                r.p50_ms, r.p99_ms, r.load_before, r.load_after);
  }
  // Each row against today's (A) and against the floor (F), when the run has them.
  const auto find = [&](char c) -> const Result* {
    for (const auto& r : results)
      if (r.label[0] == c) return &r;
    return nullptr;
  };
  std::printf("\nCPU per publish:");
  for (const char base : {'A', 'F'}) {
    const Result* b = find(base);
    if (b == nullptr) continue;
    for (const auto& r : results) {
      if (&r != b) std::printf("  %c / %c %.2fx", r.label[0], base, r.cpu_us / b->cpu_us);
    }
  }
  std::printf("\n");
  std::printf("machine: %s\ncommand: build/bench/nats_loop_bench --seconds %d --burst %d "
              "--interval-ms %d --settle-load %.1f --phases %s (%s)\n",
              bench::machine_line().c_str(), f.seconds, f.burst, f.interval_ms, f.settle_load,
              f.phases.c_str(), bench::now_utc().c_str());
  const bool ok = std::all_of(results.begin(), results.end(),
                              [](const Result& r) { return r.failed == 0 && r.acked == r.published; });
  return ok ? 0 : 1;
}
