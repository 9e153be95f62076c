#pragma once
// Private to src/topic/: the nats.c state behind topic::Client, shared by client.cpp and the
// other nats.c users of this component (follower.cpp). Never include it outside src/topic/.
#include <nats/nats.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "topic/client.hpp"
#include "topic/nats_error.hpp"

namespace outlive::topic {

template <auto Destroy>
struct Deleter {
  template <typename T>
  void operator()(T* p) const noexcept {
    if (p != nullptr) Destroy(p);
  }
};
using OptionsPtr = std::unique_ptr<natsOptions, Deleter<natsOptions_Destroy>>;
using ConnectionPtr = std::unique_ptr<natsConnection, Deleter<natsConnection_Destroy>>;
using JetStreamPtr = std::unique_ptr<jsCtx, Deleter<jsCtx_Destroy>>;
using MsgPtr = std::unique_ptr<natsMsg, Deleter<natsMsg_Destroy>>;
using StreamInfoPtr = std::unique_ptr<jsStreamInfo, Deleter<jsStreamInfo_Destroy>>;

struct Client::Impl {
  ConnectionPtr connection;
  JetStreamPtr js;            // management and reads
  JetStreamPtr publisher_js;  // async publishing, with our ack handler
  std::mutex mutex;
  // Held while the publish handler runs, and by set_publish_handler: once that returns, no call of
  // the old handler is still running (its owner may be destroyed next).
  std::mutex handler_mutex;
  std::unordered_map<std::string, uint64_t> pending;  // msg id -> token
  ResultHandler on_result;
  std::atomic<uint64_t> reconnects{0};  // completed reconnects of `connection`

  static void on_reconnected(natsConnection*, void* closure) {
    static_cast<Impl*>(closure)->reconnects.fetch_add(1, std::memory_order_release);
  }

  // The state of `client`, for the other nats.c users of src/topic/ (a nested class may read
  // Client's private members).
  static Impl& of(Client& client) { return *client.impl_; }

  static void on_ack(jsCtx*, natsMsg* msg, jsPubAck* ack, jsPubAckErr* err, void* closure) {
    auto* self = static_cast<Impl*>(closure);
    const auto arrived = std::chrono::system_clock::now();
    MsgPtr owned(msg);  // with an ack handler, the message is ours to destroy
    const char* id = nullptr;
    if (msg == nullptr || natsMsgHeader_Get(msg, "Nats-Msg-Id", &id) != NATS_OK || id == nullptr)
      return;
    PublishResult result;
    result.acked_at = arrived;
    {
      std::lock_guard lock(self->mutex);
      auto it = self->pending.find(id);
      if (it == self->pending.end()) return;  // forgotten: we gave up on it already
      result.token = it->second;
      self->pending.erase(it);
    }
    result.answered = ack != nullptr || (err != nullptr && err->Err != NATS_TIMEOUT);
    if (ack != nullptr) {
      result.ok = true;
      result.sequence = ack->Sequence;
    } else if (err != nullptr) {
      result.error = describe(err->Err, err->ErrCode);
      if (err->ErrText != nullptr) result.error += std::string(": ") + err->ErrText;
    } else {
      result.error = "no acknowledgement";
    }
    std::lock_guard running(self->handler_mutex);
    ResultHandler current;
    {
      std::lock_guard lock(self->mutex);
      current = self->on_result;
    }
    if (current) current(result);
  }
};

}  // namespace outlive::topic
