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
  boost::asio::post(threads_->pool, [code = channel.code, key, viewers = std::move(viewers_json),
                                     reply = std::move(reply)] {
    try {
      code->authorize(key, nlohmann::json::parse(viewers), reply);
    } catch (const std::exception& e) {
      reply.fail(e.what());
    } catch (...) {
      reply.fail("authorize threw");
    }
  });
}

void CodeChannels::keys(const std::string& app, const KeysQuery& query,
                        const std::string& viewer_json, const std::string& viewer_id,
                        std::function<void(std::optional<KeysAnswer>, std::string)> done) {
  Reply<KeysResult> reply([this, guard = threads_->guard, app, name = query.channel_name,
                           channel = query.channel, viewer_json, viewer_id, done = std::move(done)](
                              std::optional<KeysResult> result, std::string error) {
    std::shared_lock lock(guard->mutex);
    if (!guard->alive) return;
    if (!result) {
      log::limited(log::Level::error, "keys failed",
                   {{"app", app}, {"channel", name}, {"error", error}});
      return done(std::nullopt, std::move(error));
    }
    if (!*result) return done(KeysAnswer{}, "");  // not found
    // The keys the viewer may read, from the cache or asked of authorize() all at once.
    struct Gather {
      std::mutex mutex;
      KeysAnswer answer;
      std::vector<std::string> keys;
      std::vector<char> allowed;
      size_t left = 0;
      std::string error;
      std::function<void(std::optional<KeysAnswer>, std::string)> done;
      void finish() {
        if (!error.empty()) return done(std::nullopt, error);
        for (size_t i = 0; i < keys.size(); ++i) {
          if (allowed[i]) answer.allowed.push_back(keys[i]);
        }
        done(std::move(answer), "");
      }
    };
    auto g = std::make_shared<Gather>();
    g->done = done;
    g->answer.found = true;
    for (auto& k : **result) {
      if (g->keys.size() >= max_keys_) {
        log::limited(
            log::Level::warn, "a subscription follows only its first keys",
            {{"app", app}, {"channel", name}, {"limit", max_keys_}, {"keys", (*result)->size()}});
        break;
      }
      if (!g->answer.generations.count(k)) {
        g->answer.generations[k] = decisions_.generation(k);
        g->keys.push_back(std::move(k));
      }
    }
    g->allowed.assign(g->keys.size(), 0);
    const std::string id = Decider::decision_id(app, name, viewer_id);
    std::vector<size_t> ask;
    for (size_t i = 0; i < g->keys.size(); ++i) {
      const auto cached = decisions_.get(g->keys[i], id, Decisions::Clock::now());
      if (cached) {
        g->allowed[i] = *cached;
      } else {
        ask.push_back(i);
      }
    }
    g->left = ask.size();
    if (ask.empty()) return g->finish();
    const std::string viewers = "[" + viewer_json + "]";
    for (size_t i : ask) {
      const auto& k = g->keys[i];
      authorize(app, name, *channel, k, {viewer_id}, viewers, g->answer.generations[k],
                [g, i, viewer_id](AuthorizeAnswer a) {
                  bool last;
                  {
                    std::lock_guard lock(g->mutex);
                    if (!a.ok && g->error.empty()) g->error = a.error;
                    g->allowed[i] = a.allowed.count(viewer_id) > 0;
                    last = --g->left == 0;
                  }
                  if (last) g->finish();
                });
    }
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
