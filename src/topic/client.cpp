#include "topic/client.hpp"

#include <nats/nats.h>

#include <mutex>
#include <thread>
#include <unordered_map>

#include "common/log.hpp"
#include "topic/client_impl.hpp"
#include "topic/nats_error.hpp"
#include "topic/secure.hpp"

namespace outlive::topic {
namespace {

constexpr int64_t kNanosPerSecond = 1'000'000'000;

StreamState to_state(const std::string& app_id, const jsStreamInfo& info) {
  StreamState s;
  s.identity = TopicIdentity{app_id, info.Created};
  s.first_sequence = info.State.FirstSeq;
  s.last_sequence = info.State.LastSeq;
  s.messages = info.State.Msgs;
  s.bytes = info.State.Bytes;
  if (info.Config != nullptr) {
    s.replicas = static_cast<int>(info.Config->Replicas);
    s.max_bytes = info.Config->MaxBytes;
    s.max_age_ns = info.Config->MaxAge;
    s.duplicate_window_ns = info.Config->Duplicates;
    s.file_storage = info.Config->Storage == js_FileStorage;
  }
  if (info.Cluster != nullptr) {
    if (info.Cluster->Leader != nullptr) s.leader = info.Cluster->Leader;
    for (int i = 0; i < info.Cluster->ReplicasLen; ++i) {
      const jsPeerInfo* peer = info.Cluster->Replicas[i];
      if (peer != nullptr && peer->Current && !peer->Offline) s.current_peers++;
    }
  }
  return s;
}

// What a cluster that is still forming answers: nothing, "temporarily unavailable" or "cannot
// handle request" while it elects its leader, and "no suitable peers for placement" until as many
// JetStream servers as the stream has replicas have joined (a replica started beside its NATS
// cluster met that and exited). A server that has not learnt yet that it is clustered refuses
// replicas > 1 as if it were alone.
bool retryable(natsStatus s, jsErrCode code) {
  return s == NATS_TIMEOUT || s == NATS_NO_RESPONDERS || s == NATS_CONNECTION_DISCONNECTED ||
         s == NATS_NOT_YET_CONNECTED || code == JSClusterNotAvailErr ||
         code == JSClusterNotLeaderErr || code == JSClusterNoPeersErr ||
         code == JSInsufficientResourcesErr || code == JSStreamReplicasNotSupportedErr;
}

}  // namespace

std::string subject_for(const std::string& app_id) { return "cloud:live:" + app_id; }
std::string stream_name_for(const std::string& app_id) { return "CLOUD_LIVE_" + app_id; }

Client::Client(const std::vector<std::string>& urls, const std::string& name,
               std::chrono::milliseconds connect_timeout)
    : Client(urls, name, ConnectOptions{}, connect_timeout) {}

Client::Client(const std::vector<std::string>& urls, const std::string& name,
               const ConnectOptions& options, std::chrono::milliseconds connect_timeout)
    : impl_(std::make_shared<Impl>()) {
  natsOptions* raw_opts = nullptr;
  check(natsOptions_Create(&raw_opts), "nats options");
  OptionsPtr opts(raw_opts);
  std::vector<const char*> servers;
  for (const auto& u : urls) servers.push_back(u.c_str());
  check(natsOptions_SetServers(opts.get(), servers.data(), static_cast<int>(servers.size())),
        "nats servers");
  check(natsOptions_SetName(opts.get(), name.c_str()), "nats name");
  check(natsOptions_SetMaxReconnect(opts.get(), -1), "nats reconnect");
  check(natsOptions_SetReconnectWait(opts.get(), 250), "nats reconnect wait");
  check(natsOptions_SetReconnectBufSize(opts.get(), 32 * 1024 * 1024), "nats reconnect buffer");
  check(natsOptions_SetTimeout(opts.get(), 2000), "nats timeout");
  // The closure outlives every callback: see ~Client.
  check(natsOptions_SetReconnectedCB(opts.get(), &Impl::on_reconnected, impl_.get()),
        "nats reconnected callback");
  // Per-key order means one update of a key in flight at a time: latency per publish is what
  // bounds a burst, so send at once instead of waiting for the flusher thread.
  check(natsOptions_SetSendAsap(opts.get(), true), "nats send asap");
  const bool tls = apply_connect_options(opts.get(), urls, options);

  const auto deadline = std::chrono::steady_clock::now() + connect_timeout;
  natsConnection* raw_conn = nullptr;
  for (;;) {
    const natsStatus s = natsConnection_Connect(&raw_conn, opts.get());
    if (s == NATS_OK) break;
    if (auto refusal = lasting_refusal(s)) {
      throw Error(Errc::nats, "connect to NATS: " + *refusal + ": " + describe(s));
    }
    if (std::chrono::steady_clock::now() >= deadline)
      check(s, "connect to NATS" + retried_failure_hint(s, tls));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  impl_->connection.reset(raw_conn);

  jsOptions js_opts;
  jsOptions_Init(&js_opts);
  js_opts.Wait = 5000;
  jsCtx* raw_js = nullptr;
  check(natsConnection_JetStream(&raw_js, raw_conn, &js_opts), "jetstream context");
  impl_->js.reset(raw_js);

  jsOptions pub_opts;
  jsOptions_Init(&pub_opts);
  pub_opts.Wait = 5000;
  pub_opts.PublishAsync.MaxPending = 1 << 16;
  pub_opts.PublishAsync.AckHandler = &Impl::on_ack;
  pub_opts.PublishAsync.AckHandlerClosure = impl_.get();
  jsCtx* raw_pub = nullptr;
  check(natsConnection_JetStream(&raw_pub, raw_conn, &pub_opts), "jetstream publish context");
  impl_->publisher_js.reset(raw_pub);
}

Client::~Client() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->on_result = nullptr;
    impl_->pending.clear();
  }
  if (impl_->connection) natsConnection_Close(impl_->connection.get());
  impl_->publisher_js.reset();
  impl_->js.reset();
  impl_->connection.reset();
  // The acknowledgement handler's closure is `impl_`, and nats.c neither stops a dispatcher that
  // is in that handler when the connection closes nor tells when it has left it: an Impl freed
  // here could be read by a late on_ack. So it is kept, emptied (a few hundred bytes per Client
  // ever destroyed), where nothing frees it; reachable, so not a leak to LeakSanitizer.
  static auto* const retired = new std::vector<std::shared_ptr<Impl>>;
  static std::mutex retired_mutex;
  std::lock_guard lock(retired_mutex);
  retired->push_back(std::move(impl_));
}

bool close_library(std::chrono::milliseconds timeout) {
  return nats_CloseAndWait(timeout.count() > 0 ? timeout.count() : 1) == NATS_OK;
}

uint64_t Client::reconnects() const {
  return impl_->reconnects.load(std::memory_order_acquire);
}

bool Client::connected() const {
  return natsConnection_Status(impl_->connection.get()) == NATS_CONN_STATUS_CONNECTED;
}

StreamState Client::ensure_stream(const std::string& app_id, const StreamSettings& settings,
                                  std::chrono::milliseconds timeout) {
  const std::string name = stream_name_for(app_id);
  const std::string subject = subject_for(app_id);
  const char* subjects[] = {subject.c_str()};
  jsStreamConfig cfg;
  jsStreamConfig_Init(&cfg);
  cfg.Name = name.c_str();
  cfg.Subjects = subjects;
  cfg.SubjectsLen = 1;
  cfg.Retention = js_LimitsPolicy;
  cfg.Discard = js_DiscardOld;
  cfg.Storage = js_FileStorage;
  cfg.MaxBytes = settings.max_bytes;
  cfg.MaxAge = settings.max_age.count() * kNanosPerSecond;
  cfg.Duplicates = settings.duplicate_window.count() * kNanosPerSecond;
  cfg.Replicas = settings.replicas;

  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto next_log = std::chrono::steady_clock::now();
  for (;;) {
    jsStreamInfo* raw = nullptr;
    jsErrCode code = static_cast<jsErrCode>(0);
    natsStatus s = js_AddStream(&raw, impl_->js.get(), &cfg, nullptr, &code);
    // A replica starting at the same moment may have created it first: nats-server answers that
    // race with "name in use" or with "subjects overlap" (the other create's subjects, same name).
    if (s != NATS_OK && (code == JSStreamNameExistErr || code == JSStreamSubjectOverlapErr)) {
      code = static_cast<jsErrCode>(0);
      s = js_UpdateStream(&raw, impl_->js.get(), &cfg, nullptr, &code);
    }
    StreamInfoPtr info(raw);
    if (s == NATS_OK) return to_state(app_id, *info);
    const auto now = std::chrono::steady_clock::now();
    if (!retryable(s, code) || now >= deadline) check(s, "create or update stream " + name, code);
    if (now >= next_log) {
      log::info("topic: JetStream cannot take the stream yet; trying again",
                {{"stream", name}, {"error", describe(s, code)}});
      next_log = now + std::chrono::seconds(5);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

StreamState Client::stream_state(const std::string& app_id, std::chrono::milliseconds retry_for) {
  const std::string name = stream_name_for(app_id);
  const auto deadline = std::chrono::steady_clock::now() + retry_for;
  for (;;) {
    jsStreamInfo* raw = nullptr;
    jsErrCode code = static_cast<jsErrCode>(0);
    const natsStatus s = js_GetStreamInfo(&raw, impl_->js.get(), name.c_str(), nullptr, &code);
    StreamInfoPtr info(raw);
    if (s == NATS_OK) return to_state(app_id, *info);
    if (!retryable(s, code) || std::chrono::steady_clock::now() >= deadline) {
      check(s, "stream info " + name, code);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

void Client::delete_stream(const std::string& app_id) {
  jsErrCode code = static_cast<jsErrCode>(0);
  check(js_DeleteStream(impl_->js.get(), stream_name_for(app_id).c_str(), nullptr, &code),
        "delete stream " + stream_name_for(app_id), code);
}

std::string Client::head_cursor(const std::string& app_id) {
  const StreamState state = stream_state(app_id);
  return Cursor::at(state.identity, state.last_sequence).encode();
}

std::vector<StoredMessage> Client::read(const std::string& app_id, uint64_t from_sequence,
                                        size_t max) {
  const StreamState state = stream_state(app_id);
  const std::string name = stream_name_for(app_id);
  std::vector<StoredMessage> out;
  for (uint64_t seq = std::max(from_sequence, state.first_sequence);
       seq <= state.last_sequence && out.size() < max; ++seq) {
    natsMsg* raw = nullptr;
    jsErrCode code = static_cast<jsErrCode>(0);
    const natsStatus s = js_GetMsg(&raw, impl_->js.get(), name.c_str(), seq, nullptr, &code);
    MsgPtr msg(raw);
    if (s == NATS_NOT_FOUND || code == JSNoMessageFoundErr) continue;
    check(s, "read " + name + " #" + std::to_string(seq), code);
    StoredMessage m;
    m.sequence = seq;
    m.data.assign(natsMsg_GetData(msg.get()), natsMsg_GetDataLength(msg.get()));
    const char* id = nullptr;
    if (natsMsgHeader_Get(msg.get(), "Nats-Msg-Id", &id) == NATS_OK && id != nullptr) m.msg_id = id;
    out.push_back(std::move(m));
  }
  return out;
}

void Client::set_publish_handler(ResultHandler on_result) {
  std::lock_guard running(impl_->handler_mutex);
  std::lock_guard lock(impl_->mutex);
  impl_->on_result = std::move(on_result);
}

std::optional<std::string> Client::publish_async(
    const std::string& subject, std::string_view data, const std::string& msg_id, uint64_t token,
    std::chrono::milliseconds timeout,
    const std::vector<std::pair<std::string, std::string>>& headers) {
  natsMsg* raw = nullptr;
  natsStatus s =
      natsMsg_Create(&raw, subject.c_str(), nullptr, data.data(), static_cast<int>(data.size()));
  if (s != NATS_OK) return describe(s);
  MsgPtr msg(raw);
  natsMsgHeader_Set(msg.get(), "Nats-Msg-Id", msg_id.c_str());
  for (const auto& [k, v] : headers) natsMsgHeader_Set(msg.get(), k.c_str(), v.c_str());
  {
    std::lock_guard lock(impl_->mutex);
    impl_->pending[msg_id] = token;
  }
  jsPubOptions opts;
  jsPubOptions_Init(&opts);
  opts.MaxWait = timeout.count();
  natsMsg* to_send = msg.release();
  s = js_PublishMsgAsync(impl_->publisher_js.get(), &to_send, &opts);
  natsMsg_Destroy(to_send);  // no-op when the library took it
  if (s != NATS_OK) {
    std::lock_guard lock(impl_->mutex);
    impl_->pending.erase(msg_id);
    return describe(s);
  }
  return std::nullopt;
}

void Client::forget(const std::string& msg_id) {
  std::lock_guard lock(impl_->mutex);
  impl_->pending.erase(msg_id);
}

}  // namespace outlive::topic
