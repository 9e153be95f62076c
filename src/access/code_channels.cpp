#include <utility>
// (utility first: Boost 1.74 with g++ 12 in C++20)
#include "access/code_channels.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <mutex>
#include <shared_mutex>

#include "common/log.hpp"

namespace outlive::access {

// Answers may arrive after the decider is gone (a Reply kept by the application): `guard` lets such
// a late answer find out, and makes the destructor wait for one being handled.
struct CodeChannels::Threads {
  struct Guard {
    std::shared_mutex mutex;
    bool alive = true;
  };
  std::shared_ptr<Guard> guard = std::make_shared<Guard>();
  boost::asio::thread_pool pool{2};
};

CodeChannels::CodeChannels(Decisions& decisions, size_t max_keys,
                           std::function<void(const std::string&, double)> on_authorize)
    : decisions_(decisions),
      max_keys_(max_keys),
      on_authorize_(std::move(on_authorize)),
      threads_(std::make_unique<Threads>()) {}

CodeChannels::~CodeChannels() {
  {
    std::unique_lock lock(threads_->guard->mutex);
    threads_->guard->alive = false;
  }
  threads_->pool.stop();
  threads_->pool.join();
}

void CodeChannels::authorize(const std::string& app, const std::string& channel_name,
                             const config::Channel& channel, const std::string& key,
                             std::vector<std::string> viewer_ids, std::string viewers_json,
                             uint64_t generation, std::function<void(AuthorizeAnswer)> done) {
  boost::asio::post(threads_->pool, [this, app, channel_name, channel = &channel, key,
                                     ids = std::move(viewer_ids), viewers = std::move(viewers_json),
                                     generation, done = std::move(done)]() mutable {
    authorize_here(app, channel_name, *channel, key, std::move(ids), viewers, generation,
                   std::move(done));
  });
}

void CodeChannels::authorize_here(const std::string& app, const std::string& channel_name,
                                  const config::Channel& channel, const std::string& key,
                                  std::vector<std::string> viewer_ids,
                                  const std::string& viewers_json, uint64_t generation,
                                  std::function<void(AuthorizeAnswer)> done) {
  const auto started = std::chrono::steady_clock::now();
  Reply<AllowedViewers> reply([this, guard = threads_->guard, app, channel_name, key,
                               ids = std::move(viewer_ids), generation, started,
                               done = std::move(done)](std::optional<AllowedViewers> allowed,
                                                       std::string error) {
    std::shared_lock lock(guard->mutex);
    if (!guard->alive) return;
    AuthorizeAnswer answer;
    if (allowed) {
      answer.ok = true;
      answer.allowed.insert(allowed->begin(), allowed->end());
      const auto now = Decisions::Clock::now();
      std::string id;
      for (const auto& v : ids) {
        Decider::decision_id_into(id, app, channel_name, v);
        decisions_.put_if_current(key, id, answer.allowed.count(v) > 0, now, generation);
      }
    } else {
      answer.error = std::move(error);
      log::limited(log::Level::error, "authorize failed",
                   {{"app", app}, {"channel", channel_name}, {"error", answer.error}});
    }
    if (on_authorize_) {
      on_authorize_(
          app, std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    }
    done(std::move(answer));
  });
  try {
    channel.code->authorize(key, nlohmann::json::parse(viewers_json), reply);
  } catch (const std::exception& e) {
    reply.fail(e.what());
  } catch (...) {
    reply.fail("authorize threw");
  }
}

void CodeChannels::authorize_viewer(const std::string& app, const std::string& channel_name,
                                    const config::Channel& channel, const std::string& viewer_id,
                                    const std::string& viewer_json, std::vector<ViewerAsk> asks,
                                    std::function<bool()> wanted) {
  for (auto& ask : asks) {
    AuthorizeJoins::Key key{app, channel_name, std::move(ask.key), ask.generation};
    if (auto batch = joins_.join(key, viewer_id, viewer_json, std::move(ask.done), wanted))
      start(std::move(key), &channel, std::move(batch));
  }
}

void CodeChannels::start(AuthorizeJoins::Key key, const config::Channel* channel,
                         std::shared_ptr<AuthorizeJoins::Batch> batch) {
  // Viewers join while this waits for a channel thread.
  boost::asio::post(threads_->pool, [this, key = std::move(key), channel, batch] {
    joins_.started(key, batch);
    const auto& [app, channel_name, update_key, generation] = key;
    auto answered = [this, key, channel, batch](const AuthorizeAnswer* answer) {
      if (auto gathered = joins_.finished(key, batch, answer))
        start(key, channel, std::move(gathered));
    };
    if (!batch->wanted()) return answered(nullptr);  // every socket that asked is gone
    authorize_here(app, channel_name, *channel, update_key, batch->ids, batch->viewers_json(),
                   generation, [answered](AuthorizeAnswer a) { answered(&a); });
  });
}

void CodeChannels::keys(const std::string& app, const KeysQuery& query,
                        const std::string& viewer_json, const std::string& viewer_id,
                        std::function<void(std::optional<FoundKeys>, std::string)> done) {
  Reply<KeysResult> reply([this, guard = threads_->guard, app, name = query.channel_name, viewer_id,
                           done = std::move(done)](std::optional<KeysResult> result,
                                                   std::string error) {
    std::shared_lock lock(guard->mutex);
    if (!guard->alive) return;
    if (!result) {
      log::limited(log::Level::error, "keys failed",
                   {{"app", app}, {"channel", name}, {"error", error}});
      return done(std::nullopt, std::move(error));
    }
    if (!*result) return done(FoundKeys{}, "");  // not found
    done(with_decisions(decisions_, max_keys_, app, name, viewer_id, std::move(**result), true),
         "");
  });
  boost::asio::post(threads_->pool, [code = query.channel->code, scope = query.scope_json,
                                     viewer = viewer_json, reply = std::move(reply)] {
    try {
      code->keys(nlohmann::json::parse(scope), nlohmann::json::parse(viewer), reply);
    } catch (const std::exception& e) {
      reply.fail(e.what());
    } catch (...) {
      reply.fail("keys threw");
    }
  });
}

}  // namespace outlive::access
