#pragma once
// One tab's socket, the protocol side (SPEC 5.1–5.7): its lifecycle, the viewer's admission and
// re-checks; its checks and their deadline are its part Checks, sub/unsub and the collections'
// refresh its part Subscribing, what the socket is fed (live rounds, or a catch-up from the window)
// its Feed. Those parts and the re-checks reach the socket only through Port; the transport
// (a websocket, or an SSE stream: SPEC 5.9) is a session::Transport the session owns. Every
// member runs on the transport's io thread unless it says otherwise.
#include <deque>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "admission/admission.hpp"
#include "fanout/delivery.hpp"
#include "session/checks.hpp"
#include "session/context.hpp"
#include "session/feed.hpp"
#include "session/subscribing.hpp"
#include "session/subscriptions.hpp"
#include "session/transport.hpp"
#include "tab/protocol.hpp"
#include "ws/connection.hpp"

namespace outlive::session {

class Session final : public fanout::Reader,
                      private Transport::Events,
                      public std::enable_shared_from_this<Session> {
 public:
  // `verdict` is admission's answer before the credential lookup, taken when the upgrade request
  // was read (so opens are counted in the order their requests arrived).
  Session(std::shared_ptr<Context> context, std::shared_ptr<Transport> transport,
          admission::OpenRequest request,
          std::variant<auth::Credential, admission::Refusal> verdict,
          std::chrono::steady_clock::time_point opened_at);
  ~Session() override;

  // After the upgrade, on the socket's io thread. `early`: the bytes read behind the upgrade
  // request; they are parsed once the viewer is admitted, dropped if the socket is refused.
  void start(std::string early = {});
  // Keeps `slot` (the socket's place in server.max_connections) while the session lives.
  void hold(ConnectionSlot slot) { slot_ = std::move(slot); }
  // After the io threads stopped: drop the connection so its handlers complete.
  void force_close() { transport_->terminate(); }

  // The io threads' error policy (docs/ARCHITECTURE.md): a handler of this socket threw `what`;
  // the socket alone is closed 1011 (the tab resumes from its cursor), counted, and its thread
  // goes on serving the others.
  void serving_failed(const std::string& what);

  // The io thread this socket lives on (Context::io): every handler of it runs there.
  size_t io_index() const { return io_index_; }

  // fanout::Reader: offer() from any thread, take() and progress() on the socket's io thread.
  bool offer(std::vector<fanout::Delivery>&& deliveries, uint64_t through) override {
    return feed_.offer(std::move(deliveries), through);
  }
  void take() override { feed_.take_mailbox(); }
  void progress(const fanout::ProgressTick& tick) override { feed_.on_progress(tick); }
  void refresh_collections() override { subscribing_.refresh_collections(); }
  void shut_down() override;
  void end_after(uint64_t position) override { feed_.end_after(position); }
  void disconnect(const std::string& reason) override;

 private:
  // The socket as its parts and its re-checks see it, each through an interface of its own: the
  // transport narrowed to what they use, and the protocol's few answers. One object, so a method
  // two of them share (closing, keep_alive, ...) is written once; nested, so it reaches the
  // session's privates without making the parts friends.
  class Port final : public FeedSink,
                     public FeedOwner,
                     public CheckedSocket,
                     public SubscribingHost,
                     public Recheckable {
   public:
    explicit Port(Session& s) : s_(s) {}
    void send(ws::Frame frame) override { s_.send(std::move(frame)); }
    size_t queued_bytes() const override { return s_.queued_bytes(); }
    void cork() override { s_.cork(); }
    void uncork() override { s_.uncork(); }
    void close(uint16_t code, const std::string& reason) override { s_.close_with(code, reason); }
    bool closing() const override { return s_.closing(); }
    bool closed() const override { return s_.closed_.load(); }
    // Messages held while the socket waited for its auth message come first.
    std::optional<std::optional<std::string>> next_message() override {
      if (!s_.held_ || s_.held_->empty()) return s_.next_message();
      auto m = std::move(s_.held_->front());
      s_.held_->pop_front();
      return m;
    }
    void authenticate(std::string token) override { s_.on_auth_message(std::move(token)); }

    const fanout::Viewer* viewer() const override { return s_.viewer_.get(); }
    uint64_t follow(const std::set<std::string>& keys, const std::string& channel) override;
    void unfollow(const std::string& channel, const std::string& key) override;
    void end_subscription(const std::string& id) override { s_.subscribing_.end_subscription(id); }
    void settle(uint64_t position) override { s_.settle(position); }
    void unsettle() override { s_.unsettle(); }
    void count_frames(uint64_t frames) override { *s_.app_->frames_sent += frames; }
    void catch_up_started() override;
    void feed_changed() override { s_.sync_gauges(); }
    void subscriptions_changed() override { s_.sync_gauges(); }
    void ask_decision(const std::string& key, const std::string& channel,
                      std::function<void(bool allowed)> answered) override;
    void check_timed_out() override { s_.check_timed_out(); }
    void check_failed(const std::string& error) override { s_.check_failed(error); }
    size_t io_index() const override { return s_.io_index_; }
    const auth::Credential& credential() const override { return *s_.credential_; }
    void on_recheck(const auth::Resolution& answer) override { s_.on_recheck(answer); }
    boost::asio::any_io_executor feed_executor() override { return s_.executor(); }
    boost::asio::any_io_executor executor() override { return s_.executor(); }
    std::shared_ptr<void> keep_alive() override { return s_.weak_from_this().lock(); }

   private:
    Session& s_;
  };

  std::shared_ptr<Session> self() { return shared_from_this(); }

  // The transport, as the session's own code calls it.
  void send(ws::Frame frame) { transport_->send(std::move(frame)); }
  void send_text(std::string text) { send(ws::Frame::text(std::move(text))); }
  size_t queued_bytes() const { return transport_->queued_bytes(); }
  void cork() { transport_->cork(); }
  void uncork() { transport_->uncork(); }
  void close_with(uint16_t code, const std::string& reason) { transport_->close_with(code, reason); }
  bool closing() const { return transport_->closing(); }
  bool finished() const { return transport_->finished(); }
  void set_deadline(std::chrono::steady_clock::time_point at) { transport_->set_deadline(at); }
  void clear_deadline() { transport_->clear_deadline(); }
  void parse_early() { transport_->parse_early(); }
  std::optional<std::optional<std::string>> next_message() { return transport_->next_message(); }
  boost::asio::any_io_executor executor() { return transport_->executor(); }
  nlohmann::json about(nlohmann::json extra = nlohmann::json::object()) const {
    describe(extra);
    return extra;
  }

  // Transport::Events
  void on_messages() override;
  void on_room() override { feed_.on_room(); }
  void on_closing() override;
  void on_finished() override;
  void on_close_code(uint16_t code) override { context_->count_close(code); }
  // Before the viewer is known: a lookup slot of this address may be free; after: re-check the
  // credential (never both, so they share the connection's deadline).
  void on_deadline() override;
  void describe(nlohmann::json& fields) const override;  // app, peer, socket

  // --- admission and checks (session.cpp) ---
  void begin_lookup();
  void on_viewer(const nlohmann::json& viewer);
  void schedule_recheck();
  // The answer of the re-check on_deadline() handed to Context::rechecks.
  void on_recheck(const auth::Resolution& answer);
  // A check (or re-check) that passed its deadline or failed closes the socket with 1011: the tab
  // resumes from its cursor.
  void check_timed_out();
  void check_failed(const std::string& error);
  nlohmann::json resolve(db::Connection& conn);
  void admit(auth::Viewer v);
  void refuse(const admission::Refusal& refusal);

  // --- JWT credentials (token.cpp; SPEC 5.1 rev 4) ---
  // No credential came with the upgrade: the tab's first auth message may bring one within
  // Settings::auth_message_wait; the messages before it are held (at most max_waiting_messages).
  void await_auth_message();
  bool signed_out(const nlohmann::json& verified) const;
  // Closes the socket when a verifier's answer does not admit its token: no key set (1011), a
  // refused token, one naming another viewer than `same_viewer` (when given) or one issued before
  // its viewer's events.disconnect (unauthorized, 1008). True when it did.
  bool turned_away(const nlohmann::json& answer, const std::string* same_viewer = nullptr);
  void take_auth_message();
  // The lookup of a JWT credential: jwt::Verifier under the socket's check deadline.
  void verify_token();
  void on_token(const nlohmann::json& answer);
  // An auth message once admitted: the new token must verify and name the same viewer.
  void on_auth_message(std::string token);
  void on_refreshed(const nlohmann::json& answer);
  // auth_expiring before exp, token_expired + 4401 at exp + leeway (the JWT socket's deadline,
  // instead of the SQL credentials' re-check).
  void schedule_expiry();
  void on_expiry_deadline();

  // --- the application's session check (hook_credentials.cpp; SPEC 5.1 rev 4, auth.hook) ---
  // The lookup of a hook credential, under the socket's check deadline; a refusal closes 1008, a
  // failed check 1011.
  void check_with_hook();
  void on_hook_answer(const nlohmann::json& answer);
  // The re-check of a hook credential: the app's AuthHook batches it with the others due (the
  // SQL credentials' Rechecks batch per io thread; the hook's batch per app, across them).
  void recheck_with_hook();

  void sync_gauges();

  const std::shared_ptr<Context> context_;
  const std::shared_ptr<Transport> transport_;
  const size_t io_index_;
  // What the socket keeps of its upgrade request (the credential is in credential_).
  struct Request {
    std::string app;
    std::string address;
  };
  const Request request_;
  const uint64_t socket_id_;  // for log lines only
  ConnectionSlot slot_;
  AppRuntime* app_ = nullptr;
  std::chrono::steady_clock::time_point opened_at_{};
  std::optional<auth::Credential> credential_;   // what admission let through, for re-checks
  std::unique_ptr<admission::Refusal> refusal_;  // or why it refused (answered at start())
  // What the socket keeps of its viewer once admitted: the id and the object handed to keys() and
  // authorize(), in one allocation the hub's followers share.
  std::shared_ptr<const fanout::Viewer> viewer_;
  bool counted_viewer_ = false;
  bool lookup_running_ = false;  // admission counts this socket's credential lookup
  // A re-check is out: the connection's deadline is its timeout until it answers.
  bool recheck_running_ = false;
  int64_t hook_expires_in_s_ = 0;  // the hook's last expires_in_s: > 0, re-checked by then
  bool registered_ = false;
  std::atomic<bool> closed_{false};  // for pool workers: work for a closed socket is dropped
  // A JWT socket's token: awaited (no credential yet), valid, or told auth_expiring.
  enum class Token : uint8_t { none, awaited, valid, expiring };
  Token token_ = Token::none;
  bool refresh_running_ = false;
  int64_t token_expires_at_ = 0;  // unix seconds (exp)
  // Messages that came before the auth message. Made when one does: an empty std::deque holds
  // 576 bytes of heap, an eighth of an idle socket's memory (issue 46 item 5).
  std::unique_ptr<std::deque<std::optional<std::string>>> held_;
  Subscriptions subs_;

  Port port_{*this};
  Checks checks_{*context_, port_};
  Feed feed_{port_, port_, subs_};
  Subscribing subscribing_{port_, *context_, subs_, feed_, checks_};

  GaugeShare gauged_;
};

}  // namespace outlive::session
