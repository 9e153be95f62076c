#include "session/subscribing.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "session/checks.hpp"
#include "session/context.hpp"
#include "session/feed.hpp"
#include "session/subscriptions.hpp"
#include "topic/cursor.hpp"
#include "window/app_window.hpp"

namespace outlive::session {

namespace net = boost::asio;
using json = nlohmann::json;
using error_code = boost::system::error_code;

void Subscribing::stop() {
  if (window_timer_) window_timer_->cancel();
}

void Subscribing::send_error(const std::string& code, const std::string& message,
                             const std::optional<std::string>& id) {
  host_.send(ws::Frame::text(tab::frames::error(code, message, id)));
}

// Subs that arrive together (a page's subs in one write, a reconnect with its cursors) are checked
// together: one keys() task for all of them, and their authorize() asked at once, so the sockets of
// a wave reach the joins (access/authorize_joins.hpp) together instead of one sub after another.
// Their answers still go out in the order the subs came, and any other message waits for them.
constexpr size_t kMaxSubsPerCheck = 16;

std::optional<std::optional<std::string>> Subscribing::take_message() {
  if (!held_message_) return host_.next_message();
  auto m = std::move(*held_message_);
  held_message_.reset();
  return m;
}

void Subscribing::process_next() {
  std::vector<tab::SubMessage> batch;
  while (host_.viewer() && !sub_checking_ && !waiting_for_window_ && !host_.closing() &&
         batch.size() < kMaxSubsPerCheck) {
    tab::SubMessage sub;
    if (again_ && !again_->empty()) {
      sub = std::move(again_->front());
      again_->pop_front();
    } else {
      auto message = take_message();
      if (!message) break;
      std::optional<tab::ClientMessage> parsed;
      if (*message) parsed = tab::parse_client_message(**message);
      if (!parsed || !std::holds_alternative<tab::SubMessage>(*parsed)) {
        if (!batch.empty()) {  // answered after the batch's subs
          held_message_ = std::make_unique<std::optional<std::string>>(std::move(*message));
          break;
        }
        if (!parsed) {
          send_error("invalid_message", "binary frames are not accepted; send JSON text",
                     std::nullopt);
        } else {
          handle_other(std::move(*parsed));
        }
        continue;
      }
      sub = std::get<tab::SubMessage>(std::move(*parsed));
    }
    if (offer_sub(sub, batch) == Offered::later) {
      if (!again_) again_ = std::make_unique<std::deque<tab::SubMessage>>();
      again_->push_front(std::move(sub));
      break;
    }
  }
  if (!batch.empty() && !host_.closing()) check_subs(std::move(batch));
}

void Subscribing::handle_other(tab::ClientMessage parsed) {
  if (auto* err = std::get_if<tab::ProtocolError>(&parsed)) {
    send_error(err->code, err->message, err->id);
  } else if (auto* unsub = std::get_if<tab::UnsubMessage>(&parsed)) {
    handle_unsub(*unsub);
  } else if (auto* auth = std::get_if<tab::AuthMessage>(&parsed)) {
    host_.authenticate(std::move(auth->token));
  }
}

void Subscribing::handle_unsub(const tab::UnsubMessage& m) {
  if (!subs_.contains(m.id))
    return send_error("not_found", "no subscription \"" + m.id + "\"", m.id);
  end_subscription(m.id);
}

void Subscribing::end_subscription(const std::string& id) {
  auto sub = subs_.remove(id);
  if (!sub) return;
  note_collections();
  for (const auto& [k, pos] : sub->keys) host_.unfollow(sub->channel, k);
  if (app_) ++*app_->subscriptions_ended;
  host_.subscriptions_changed();
}

// A sub that is refused, or waits for the window, is answered at once when no batch is gathered,
// else after it (`later`): its answer may depend on the batch (a repeated id) and keeps its place.
Subscribing::Offered Subscribing::offer_sub(tab::SubMessage& m,
                                            std::vector<tab::SubMessage>& batch) {
  const bool alone = batch.empty();
  const bool repeated = subs_.contains(m.id) || std::any_of(batch.begin(), batch.end(),
                                                             [&](const auto& b) { return b.id == m.id; });
  const int max = context_.settings.max_subscriptions;
  const bool too_many = static_cast<int>(subs_.size() + batch.size()) >= max;
  auto ch = app_->channels.find(m.channel);
  const bool unknown = ch == app_->channels.end();
  std::optional<std::string> bad_scope;
  if (!repeated && !too_many && !unknown) bad_scope = ch->second.scope.check(m.scope);
  if (repeated || too_many || unknown || bad_scope || cursor_ahead_of_window(m)) {
    if (!alone) return Offered::later;
  }
  if (repeated) {
    send_error("duplicate_id", "subscription id in use", m.id);
    return Offered::answered;
  }
  if (too_many) {
    send_error("too_many_subscriptions",
               "at most " + std::to_string(max) + " subscriptions per socket", m.id);
    return Offered::answered;
  }
  if (unknown) {
    send_error("unknown_channel", "no channel \"" + m.channel + "\"", m.id);
    return Offered::answered;
  }
  if (bad_scope) {
    send_error("invalid_scope", "scope does not match the channel: " + *bad_scope, m.id);
    host_.close(ws::kPolicy, "invalid scope");
    return Offered::answered;
  }
  if (wait_for_window(m)) return Offered::answered;
  batch.push_back(std::move(m));
  return Offered::gathered;
}

void Subscribing::again_first(std::vector<tab::SubMessage>::iterator from,
                              std::vector<tab::SubMessage>::iterator to) {
  if (!again_) again_ = std::make_unique<std::deque<tab::SubMessage>>();
  again_->insert(again_->begin(), std::make_move_iterator(from), std::make_move_iterator(to));
}

void Subscribing::check_subs(std::vector<tab::SubMessage> batch) {
  std::vector<access::KeysQuery> queries;
  queries.reserve(batch.size());
  for (const auto& m : batch)
    queries.push_back({m.channel, app_->channels.at(m.channel).config, m.scope.dump()});
  sub_checking_ = true;
  checks_.run_async(
      [this, keep = host_.keep_alive(), queries = std::move(queries)](Checks::Reply reply) {
        const auto& viewer = *host_.viewer();
        context_.decider.keys(
            app_->id, queries, viewer.json, viewer.id,
            [reply](std::vector<access::KeysAnswer> answers, std::string error) {
              if (!error.empty()) return reply(nullptr, std::move(error));
              json result = json::array();
              for (auto& a : answers)
                result.push_back(json{{"keys", std::move(a.allowed)},
                                      {"generations", std::move(a.generations)}});
              reply(std::move(result), "");
            },
            [this, keep] { return !host_.closed(); });
      },
      [this, batch = std::move(batch)](const json& result) mutable {
        sub_checking_ = false;
        for (size_t i = 0; i < batch.size() && !host_.closing(); ++i) {
          if (!start_subscription(batch[i], result.at(i))) {
            // Asked again, and the ones after it wait for it (their answers keep the order).
            again_first(batch.begin() + static_cast<std::ptrdiff_t>(i), batch.end());
            break;
          }
        }
        process_next();
      });
}

bool Subscribing::cursor_ahead_of_window(const tab::SubMessage& m) const {
  auto* window = context_.window_of(app_->id);
  const auto cursor = m.cursor && window ? topic::Cursor::decode(*m.cursor) : std::nullopt;
  return cursor && cursor->belongs_to(window->identity()) &&
         cursor->position > window->window().head();
}

// A cursor ahead of this replica's window is usually one from a replica that read the topic a
// moment earlier (a tab that failed over): wait a little for the window instead of answering
// resync. Only a cursor still beyond the head after the wait gets resync/topic.
bool Subscribing::wait_for_window(const tab::SubMessage& m) {
  if (!cursor_ahead_of_window(m)) {
    window_wait_.reset();
    return false;
  }
  const auto now = std::chrono::steady_clock::now();
  if (!window_wait_ || window_wait_->first != m.id) {
    window_wait_ = std::make_unique<std::pair<std::string, std::chrono::steady_clock::time_point>>(
        m.id, now + context_.settings.window_catch_up_wait);
  }
  if (now >= window_wait_->second) {
    window_wait_.reset();
    return false;
  }
  waiting_for_window_ = true;
  if (!window_timer_) window_timer_ = std::make_unique<net::steady_timer>(host_.executor());
  window_timer_->expires_after(std::chrono::milliseconds(20));
  window_timer_->async_wait([this, keep = host_.keep_alive(), m](error_code ec) {
    waiting_for_window_ = false;
    if (ec || host_.closing()) return;
    if (!again_) again_ = std::make_unique<std::deque<tab::SubMessage>>();
    again_->push_front(m);
    process_next();
  });
  return true;
}

bool Subscribing::start_subscription(const tab::SubMessage& m, const json& result) {
  const auto& channel = app_->channels.at(m.channel);
  const bool collection = channel.config->collection;
  const auto keys = result["keys"].get<std::set<std::string>>();
  const auto generations = result["generations"].get<std::map<std::string, uint64_t>>();
  // keys() null, or a single-key resource the viewer may not read: not_found, the socket stays.
  if (!collection && keys.empty()) {
    if (context_.decider.changed_since(generations)) return false;  // maybe from before it
    send_error("not_found", "nothing to follow for this scope", m.id);
    return true;
  }
  const uint64_t from = host_.follow(keys, m.channel);
  // Registered first, then compared: an access update read after this includes us in its
  // re-check; one read before it shows in the generation.
  if (context_.decider.changed_since(generations)) {
    for (const auto& k : keys) host_.unfollow(m.channel, k);
    return false;
  }
  // The scope is kept for a collection's keys() again only (32 B and more a sub otherwise).
  Subscription sub{m.channel, collection,
                   collection ? std::make_unique<const std::string>(m.scope.dump()) : nullptr, {},
                   m.filter};
  for (const auto& k : keys) sub.keys.emplace(k, from);
  ++*app_->subscriptions_started;
  auto live_from = [&](std::string frame) {
    subs_.add(m.id, std::move(sub));
    note_collections();
    host_.unsettle();  // its keys are brought by the next tick or round
    // gauges first: the frame may reach the tab before this handler returns
    host_.subscriptions_changed();
    feed_.subscribed_at(from);  // a progress frame never goes back behind this cursor
    host_.send(ws::Frame::text(std::move(frame)));
    return true;
  };
  const std::string here = feed_.cursor_at(from);
  if (!m.cursor) return live_from(tab::frames::subscribed(m.id, here));
  auto* window = context_.window_of(app_->id);
  const auto cursor = topic::Cursor::decode(*m.cursor);
  if (!window || !cursor || !cursor->belongs_to(window->identity()) ||
      cursor->position > window->window().head()) {
    return live_from(tab::frames::resync(m.id, here, "topic"));
  }
  if (cursor->position < window->window().oldest_replayable()) {
    return live_from(tab::frames::resync(m.id, here, "window"));
  }
  // An answer from before an access update must release nothing published after it (SPEC 5.6).
  if (app_->delivery->access_pending() ||
      (collection && cursor->position < app_->delivery->last_access_position())) {
    return live_from(tab::frames::resync(m.id, here, "access"));
  }
  // The replay is a catch-up from the cursor: the window's updates of its keys after it, at the
  // pace the tab reads, then live.
  for (auto& [k, pos] : sub.keys) pos = cursor->position;
  subs_.add(m.id, std::move(sub));  // (start_catch_up unsettles)
  note_collections();
  host_.send(ws::Frame::text(tab::frames::subscribed(m.id, *m.cursor)));
  feed_.replay_through(from);
  feed_.start_catch_up(cursor->position);
  host_.subscriptions_changed();
  feed_.pump();
  return true;
}

// keys() again for this socket's collections (after an access update, and every minute); a
// collection whose key set changed receives resync (keys_changed). Runs asked for while one runs
// (or waits) share one more run. Every socket is asked at once, so a few run at a time
// (Context::collection_refreshes): thousands of keys() posted together overflowed the pool's
// bounded queue, and each refused one closed its socket with 1011.
void Subscribing::refresh_collections() {
  // Most sockets follow no collection: an access update (or the minute's tick) posts nothing to
  // them (it had posted a handler to each of 5,000 sockets at once).
  if (!has_collections_.load(std::memory_order_relaxed)) return;
  // (from Hub::for_each_reader, which holds no reference: the socket may be finishing)
  auto keep = host_.keep_alive();
  if (!keep) return;
  net::post(host_.executor(), [this, keep = std::move(keep)] {
    if (host_.closing() || !host_.viewer()) return;
    if (refreshing_) {
      refresh_pending_ = true;
      return;
    }
    if (!has_collections_.load(std::memory_order_relaxed)) return;  // unsubscribed meanwhile
    refreshing_ = true;
    context_.collection_refreshes.run([this, keep](Throttle::Slot slot) {
      context_.post_from_worker(host_.executor(), [this, keep, slot = std::move(slot)]() mutable {
        run_collection_refresh(std::move(slot));
      });
    });
  });
}

void Subscribing::note_collections() {
  const auto& subs = subs_.all();
  has_collections_.store(
      std::any_of(subs.begin(), subs.end(), [](const auto& e) { return e.second.collection; }),
      std::memory_order_relaxed);
}

// Holds `slot` until keys() answered (or its task was dropped).
void Subscribing::run_collection_refresh(Throttle::Slot slot) {
  if (host_.closing()) return;
  std::vector<std::tuple<std::string, std::string, std::string>> todo;  // id, channel, scope
  for (const auto& [id, sub] : subs_.all()) {
    if (sub.collection && sub.scope) todo.emplace_back(id, sub.channel, *sub.scope);
  }
  if (todo.empty()) {  // unsubscribed while it waited
    refreshing_ = refresh_pending_ = false;
    return;
  }
  std::vector<access::KeysQuery> queries;
  for (const auto& [id, channel, scope] : todo)
    queries.push_back({channel, app_->channels.at(channel).config, scope});
  auto keep = host_.keep_alive();
  checks_.run_async(
      [this, keep, todo, queries = std::move(queries),
       slot = std::move(slot)](Checks::Reply reply) {
        const auto& viewer = *host_.viewer();
        context_.decider.keys(
            app_->id, queries, viewer.json, viewer.id,
            [reply, todo, slot](std::vector<access::KeysAnswer> answers, std::string error) {
              if (!error.empty()) return reply(nullptr, std::move(error));
              json result = json::object();
              for (size_t i = 0; i < todo.size(); ++i)
                result[std::get<0>(todo[i])] = answers.at(i).allowed;
              reply(std::move(result), "");
            },
            [this, keep] { return !host_.closed(); });
      },
      [this, keep](const json& result) { on_collections_refreshed(result); });
}

void Subscribing::on_collections_refreshed(const json& result) {
  refreshing_ = false;
  for (const auto& [id, keys_json] : result.items()) {
    if (host_.closing()) break;  // a resync's write failed: the socket left the hub
    auto it = subs_.all().find(id);
    if (it == subs_.all().end()) continue;
    const auto keys = keys_json.get<std::set<std::string>>();
    const std::string channel = it->second.channel;
    std::set<std::string> current;
    for (const auto& [k, pos] : it->second.keys) current.insert(k);
    if (keys == current) continue;
    const uint64_t from = host_.follow(keys, channel);
    const auto [gained, lost] = subs_.replace_keys(id, keys, from);
    host_.unsettle();
    // follow() counted every key once more; the ones kept were followed already.
    for (const auto& k : keys) {
      if (!gained.count(k)) host_.unfollow(channel, k);
    }
    for (const auto& k : lost) host_.unfollow(channel, k);
    host_.send(ws::Frame::text(tab::frames::resync(id, feed_.cursor_at(from), "keys_changed")));
  }
  if (std::exchange(refresh_pending_, false)) refresh_collections();
}

}  // namespace outlive::session
