#pragma once
// Code channels' keys() and authorize() (config::Channel::code, include/outlive/channel.hpp):
// their functions run on threads of their own, so one that blocks (an application calling its own
// database or another service synchronously) never holds a socket's strand, the dispatcher's
// thread or a pool worker; they answer whenever they like, and the answers go in the decision
// cache as SQL channels' do.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "access/authorize_joins.hpp"
#include "access/decider.hpp"

namespace outlive::access {

class CodeChannels {
 public:
  CodeChannels(Decisions& decisions, size_t max_keys,
               std::function<void(const std::string& app, double seconds)> on_authorize);
  // Waits for functions running on the channel threads; answers that arrive later are dropped.
  ~CodeChannels();
  CodeChannels(const CodeChannels&) = delete;
  CodeChannels& operator=(const CodeChannels&) = delete;

  // Decider::authorize() for a code channel: `done` runs on the thread the function answered on.
  void authorize(const std::string& app, const std::string& channel_name,
                 const config::Channel& channel, const std::string& key,
                 std::vector<std::string> viewer_ids, std::string viewers_json, uint64_t generation,
                 std::function<void(AuthorizeAnswer)> done);

  // Decider::authorize_viewer() for a code channel, for several keys of one viewer: each joined
  // with the other viewers asked for the same key, channel and generation (AuthorizeJoins), so
  // a hook channel gets one request for many sockets. `done` of each ask runs on the thread the
  // function answered on.
  void authorize_viewer(const std::string& app, const std::string& channel_name,
                        const config::Channel& channel, const std::string& viewer_id,
                        const std::string& viewer_json, std::vector<ViewerAsk> asks,
                        std::function<bool()> wanted);

  // keys(scope, viewer) of one code channel, at most max_keys, with the viewer's cached
  // decisions. `done` gets them, or nullopt and the error.
  void keys(const std::string& app, const KeysQuery& query, const std::string& viewer_json,
            const std::string& viewer_id,
            std::function<void(std::optional<FoundKeys>, std::string)> done);

 private:
  struct Threads;
  // The function's authorize(), called on this thread (a channel thread); the answer goes in the
  // decision cache, then to `done`.
  void authorize_here(const std::string& app, const std::string& channel_name,
                      const config::Channel& channel, const std::string& key,
                      std::vector<std::string> viewer_ids, const std::string& viewers_json,
                      uint64_t generation, std::function<void(AuthorizeAnswer)> done);
  // A batch of AuthorizeJoins starts on a channel thread; the one gathered meanwhile starts when
  // its function answered.
  void start(AuthorizeJoins::Key key, const config::Channel* channel,
             std::shared_ptr<AuthorizeJoins::Batch> batch);
  AuthorizeJoins joins_;
  Decisions& decisions_;
  const size_t max_keys_;
  const std::function<void(const std::string&, double)> on_authorize_;
  std::unique_ptr<Threads> threads_;
};

}  // namespace outlive::access
