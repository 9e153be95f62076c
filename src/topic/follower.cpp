#include "topic/follower.hpp"

#include <nats/nats.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "common/jitter.hpp"
#include "common/log.hpp"
#include "common/thread_failures.hpp"
#include "common/thread_name.hpp"
#include "topic/client_impl.hpp"
#include "topic/nats_error.hpp"

// How the follower reads: an ephemeral pull consumer without acks, started at the next sequence we
// need, fetched from on our own thread. The consumer numbers what it delivers (1, 2, 3, ...): a
// delivery sequence that is not the one we expect means something was lost on the way (a
// reconnect, a server restart that reset or dropped the consumer), and we simply create a new
// consumer from the next stream sequence we need. We deliver only stream sequences at or above
// that one, so nothing is delivered twice, and a consumer only skips sequences the stream no
// longer holds, so nothing is lost.

namespace outlive::topic {
namespace {

using namespace std::chrono_literals;

constexpr int kBatch = 256;
// nats.c 3.4's fetch (js.c _fetch, fixed upstream in 3.9, nats.c#749) allocates `Batch` slots,
// counts the user messages it finds already waiting in the subscription, asks the server for the
// rest and then compares its count with the *reduced* batch: with one message waiting and more
// arriving than asked for, it writes past the slots (heap corruption, seen as "double free or
// corruption" when the list is destroyed). Messages wait in the subscription only as late
// answers to a request whose fetch timed out on our side (after a partition, dozens at once). So
// a consumer asks for more than one message only while none of its requests ever timed out; a
// backlog found on a consumer with a timed-out request is caught up on a fresh consumer after
// this many single messages in a row.
constexpr int kSinglesBeforeFreshConsumer = 4;
constexpr auto kFetchWait = 500ms;     // one pull request; also bounds how long stop() takes
// After a failure: the first retry at once (once the connection is up: a request made while
// nats.c reconnects waits its whole timeout), then 50 ms doubling to 2 s, jittered.
constexpr auto kRetryFirst = 50ms;
constexpr auto kRetryMax = 2000ms;
constexpr auto kConnectedPoll = 10ms;  // how often a follower waiting for the connection looks
constexpr auto kConnectedWaitMax = 1s;  // then it tries anyway (and fails, and backs off)
constexpr auto kStaleCheckFirst = 2s;  // idle this long: check the stream has nothing for us
constexpr auto kStaleCheckMax = 10s;
constexpr auto kFailureLogEvery = 30s;
constexpr int64_t kApiWaitMs = 2000;  // consumer create/delete requests
constexpr int64_t kInactiveThresholdNs =
    60ll * 1'000'000'000;  // the server drops consumers we lost

int64_t to_nanos(std::chrono::nanoseconds d) { return d.count(); }

struct SubscriptionCloser {
  void operator()(natsSubscription* sub) const noexcept {
    if (sub == nullptr) return;
    // A JetStream subscription must be unsubscribed before it is destroyed (it also deletes the
    // consumer the library created for it).
    natsSubscription_Unsubscribe(sub);
    natsSubscription_Destroy(sub);
  }
};
using SubscriptionPtr = std::unique_ptr<natsSubscription, SubscriptionCloser>;
using StatisticsPtr = std::unique_ptr<natsStatistics, Deleter<natsStatistics_Destroy>>;

struct MsgListCloser {
  void operator()(natsMsgList* list) const noexcept { natsMsgList_Destroy(list); }
};

int64_t created_at_of(natsMsg* msg) {
  const char* value = nullptr;
  if (natsMsgHeader_Get(msg, "Outlive-Created-At", &value) != NATS_OK || value == nullptr) return 0;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0') return 0;
  return static_cast<int64_t>(v);
}

}  // namespace

struct Follower::Impl {
  Client& client;
  Client::Impl& nats;
  const std::string app_id;
  const std::string subject;
  const std::string stream;
  const Handler handler;
  JetStreamPtr js;

  std::atomic<uint64_t> next;  // written by the thread only
  std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;
  std::thread thread;

  // The thread's state.
  SubscriptionPtr sub;
  uint64_t expected_delivery = 1;  // the consumer's next delivery sequence
  bool request_timed_out = false;  // this consumer may still answer a request we gave up on
  int singles_in_a_row = 0;
  StatisticsPtr stats;
  uint64_t sub_reconnects = 0;  // the connection's reconnect count when `sub` was created
  bool failing = false;
  int retries = 0;  // failures since the last success: the next retry's delay
  std::chrono::steady_clock::time_point last_failure_log{};

  Impl(Client& c, const std::string& app, uint64_t from, Handler h)
      : client(c),
        nats(Client::Impl::of(c)),
        app_id(app),
        subject(subject_for(app)),
        stream(stream_name_for(app)),
        handler(std::move(h)),
        next(std::max<uint64_t>(from, 1)) {
    jsOptions opts;
    jsOptions_Init(&opts);
    opts.Wait = kApiWaitMs;
    jsCtx* raw = nullptr;
    check(natsConnection_JetStream(&raw, nats.connection.get(), &opts),
          "jetstream context for " + stream);
    js.reset(raw);
    natsStatistics* raw_stats = nullptr;
    check(natsStatistics_Create(&raw_stats), "nats statistics");
    stats.reset(raw_stats);
  }

  uint64_t reconnects() {
    uint64_t count = 0;
    if (natsConnection_GetStats(nats.connection.get(), stats.get()) == NATS_OK) {
      natsStatistics_GetCounts(stats.get(), nullptr, nullptr, nullptr, nullptr, &count);
    }
    return count;
  }

  bool stopped() {
    std::lock_guard lock(mutex);
    return stopping;
  }

  // Waits `d` unless asked to stop; false when stopping.
  bool pause(std::chrono::milliseconds d) {
    std::unique_lock lock(mutex);
    return !wake.wait_for(lock, d, [this] { return stopping; });
  }

  // Waits until the connection to NATS is up (at most kConnectedWaitMax); false when stopping.
  bool wait_connected() {
    const auto until = std::chrono::steady_clock::now() + kConnectedWaitMax;
    while (!client.connected() && std::chrono::steady_clock::now() < until) {
      if (!pause(kConnectedPoll)) return false;
    }
    return true;
  }

  // Before retrying after a failure: at once the first time, as soon as the connection is up (a
  // sub-second nats-server restart costs about its own length), then backing off.
  void retry_pause() {
    const int n = retries++;
    if (n > 0) {
      const auto delay = std::min<std::chrono::milliseconds>(kRetryFirst * (1 << std::min(n - 1, 6)), kRetryMax);
      if (!pause(jittered(delay, 0.8, 1.2))) return;
    }
    wait_connected();
  }

  void failed(const std::string& what) {
    const auto now = std::chrono::steady_clock::now();
    if (!failing || now - last_failure_log >= kFailureLogEvery) {
      log::warn("Following the topic failed, retrying",
                {{"app", app_id}, {"stream", stream}, {"next", next.load()}, {"error", what}});
      last_failure_log = now;
    }
    failing = true;
  }

  void recovered() {
    retries = 0;
    if (!failing) return;
    failing = false;
    log::info("Following the topic again",
              {{"app", app_id}, {"stream", stream}, {"next", next.load()}});
  }

  bool subscribe() {
    sub_reconnects = reconnects();
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = stream.c_str();
    so.Config.DeliverPolicy = js_DeliverByStartSequence;
    so.Config.OptStartSeq = next.load();
    so.Config.AckPolicy = js_AckNone;
    so.Config.InactiveThreshold = kInactiveThresholdNs;
    so.Config.MemoryStorage = true;
    natsSubscription* raw = nullptr;
    jsErrCode code = static_cast<jsErrCode>(0);
    const natsStatus s =
        js_PullSubscribe(&raw, js.get(), subject.c_str(), nullptr, nullptr, &so, &code);
    if (s != NATS_OK) {
      if (raw != nullptr) SubscriptionCloser{}(raw);
      failed("create consumer: " + describe(s, code));
      return false;
    }
    sub.reset(raw);
    expected_delivery = 1;
    request_timed_out = false;
    singles_in_a_row = 0;
    return true;
  }

  void reset() { sub.reset(); }

  // Delivers what one fetch returned; false when the consumer must be created again.
  bool deliver(natsMsgList& list) {
    for (int i = 0; i < list.Count; ++i) {
      if (stopped()) return true;
      natsMsg* msg = list.Msgs[i];
      jsMsgMetaData* meta = nullptr;
      const natsStatus s = natsMsg_GetMetaData(&meta, msg);
      if (s != NATS_OK) {
        failed("message metadata: " + describe(s));
        return false;
      }
      const uint64_t stream_seq = meta->Sequence.Stream;
      const uint64_t delivery_seq = meta->Sequence.Consumer;
      jsMsgMetaData_Destroy(meta);
      if (delivery_seq != expected_delivery) {
        log::info(
            "The topic's consumer skipped or repeated a delivery; following again from the next "
            "sequence",
            {{"app", app_id},
             {"next", next.load()},
             {"expected_delivery", expected_delivery},
             {"delivery", delivery_seq}});
        return false;
      }
      expected_delivery++;
      if (stream_seq < next.load())
        continue;  // delivered already (cannot happen with a fresh consumer)

      StoredMessage m;
      m.sequence = stream_seq;
      const char* data = natsMsg_GetData(msg);
      if (data != nullptr) m.data.assign(data, static_cast<size_t>(natsMsg_GetDataLength(msg)));
      const char* id = nullptr;
      if (natsMsgHeader_Get(msg, "Nats-Msg-Id", &id) == NATS_OK && id != nullptr) m.msg_id = id;
      const int64_t created_at = created_at_of(msg);
      try {
        handler(m, created_at);
      } catch (const std::exception& e) {
        // (AppWindow's handler applies the topic thread's policy itself and does not throw.)
        count_thread_failure(ThreadKind::topic);
        log::error("A topic message handler failed",
                   {{"app", app_id}, {"sequence", stream_seq}, {"error", e.what()}});
      }
      next.store(stream_seq + 1);
    }
    return true;
  }

  // True when the stream holds messages we have not received although the consumer sent none.
  bool stream_has_more() {
    if (!client.connected()) return false;  // reconnecting: nothing to learn, and it would block
    try {
      const StreamState state = client.stream_state(app_id);
      return state.messages > 0 && state.last_sequence >= next.load() &&
             state.last_sequence >= state.first_sequence;
    } catch (const std::exception& e) {
      failed(std::string("stream info: ") + e.what());
      return false;
    }
  }

  void run() {
    auto idle_since = std::chrono::steady_clock::now();
    auto stale_check = std::chrono::duration_cast<std::chrono::milliseconds>(kStaleCheckFirst);
    // Caught up, we wait for the next message with a request for one, so it is delivered at once
    // (a request for a batch waits until the batch is full or expires); then we take whatever
    // followed it with no-wait batch requests until there is nothing more.
    bool caught_up = false;
    while (!stopped()) {
      if (sub && reconnects() != sub_reconnects) {
        // The server may have restarted and lost the consumer, or dropped what it sent while we
        // were away: a new consumer from the next sequence costs little and waits for nothing.
        log::info("Reconnected to NATS; following the topic again",
                  {{"app", app_id}, {"next", next.load()}});
        reset();
      }
      if (!sub) {
        if (!subscribe()) {
          retry_pause();
          continue;
        }
        caught_up = false;
        idle_since = std::chrono::steady_clock::now();
      }
      jsFetchRequest req;
      jsFetchRequest_Init(&req);
      req.Batch = caught_up || request_timed_out ? 1 : kBatch;
      req.NoWait = !caught_up;
      req.Expires = to_nanos(kFetchWait);
      natsMsgList list{};
      const natsStatus s = natsSubscription_FetchRequest(&list, sub.get(), &req);
      std::unique_ptr<natsMsgList, MsgListCloser> owned(&list);
      if (s == NATS_OK) {
        recovered();
        caught_up = false;
        idle_since = std::chrono::steady_clock::now();
        stale_check = std::chrono::duration_cast<std::chrono::milliseconds>(kStaleCheckFirst);
        if (!deliver(list)) {
          reset();
        } else if (request_timed_out && ++singles_in_a_row >= kSinglesBeforeFreshConsumer) {
          reset();  // a backlog: batches again, on a consumer with no request outstanding
        }
        continue;
      }
      singles_in_a_row = 0;
      if (s == NATS_TIMEOUT) request_timed_out = true;
      if (s == NATS_TIMEOUT && !client.connected()) {
        // The connection dropped under the request: follow again (on a new consumer, the
        // reconnect seen above) as soon as it is back, not a request's wait later.
        wait_connected();
        continue;
      }
      if (s == NATS_TIMEOUT || s == NATS_NOT_FOUND) {  // nothing new
        caught_up = true;
        if (std::chrono::steady_clock::now() - idle_since >= stale_check) {
          // A consumer the server lost without us reconnecting (a cluster node went away) may
          // answer nothing at all: if the stream has messages for us, start a new consumer.
          // Checked less often the longer the topic is quiet.
          if (stream_has_more()) {
            log::info("The topic has messages its consumer does not deliver; following again",
                      {{"app", app_id}, {"next", next.load()}});
            reset();
          }
          stale_check =
              std::min(stale_check * 2,
                       std::chrono::duration_cast<std::chrono::milliseconds>(kStaleCheckMax));
          idle_since = std::chrono::steady_clock::now();
        }
        continue;
      }
      // Disconnected, no responders (the consumer is gone), or anything else: start again.
      failed("fetch: " + describe(s));
      reset();
      retry_pause();
    }
    reset();
  }
};

Follower::Follower(Client& client, const std::string& app_id, uint64_t from_sequence,
                   Handler handler)
    : impl_(std::make_unique<Impl>(client, app_id, from_sequence, std::move(handler))) {
  impl_->thread = std::thread([impl = impl_.get()] {
    name_this_thread("outlive-topic");
    // An exception out of the loop itself (not a handler's): counted, and following starts again
    // from the next sequence on a new consumer, so nothing is skipped and the process goes on.
    for (;;) {
      try {
        impl->run();
        return;
      } catch (const std::exception& e) {
        count_thread_failure(ThreadKind::topic);
        log::error("Following the topic failed unexpectedly; following again",
                   {{"app", impl->app_id}, {"next", impl->next.load()}, {"error", e.what()}});
      }
      impl->reset();
      impl->failing = true;
      impl->retry_pause();
      if (impl->stopped()) return;
    }
  });
}

Follower::~Follower() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

uint64_t Follower::next_sequence() const { return impl_->next.load(); }

}  // namespace outlive::topic
