#include "hooks/channel_hook.hpp"

#include "common/error.hpp"
#include "common/log.hpp"
#include "hooks/client.hpp"
#include "http_client/url.hpp"

namespace outlive::hooks {

namespace {

using Clock = std::chrono::steady_clock;

nlohmann::json parse_object(const std::string& body) {
  nlohmann::json doc = nlohmann::json::parse(body, nullptr, false);
  if (doc.is_discarded()) throw Error(Errc::invalid_input, "the answer is not JSON");
  if (!doc.is_object()) throw Error(Errc::invalid_input, "the answer is not a JSON object");
  return doc;
}

std::vector<std::string> strings(const nlohmann::json& array, const char* field) {
  std::vector<std::string> out;
  out.reserve(array.size());
  for (const auto& item : array) {
    if (!item.is_string()) {
      throw Error(Errc::invalid_input, std::string("\"") + field + "\" holds a value that is not a string");
    }
    out.push_back(item.get<std::string>());
  }
  return out;
}

const char* cause_of(const Answer& a) {
  if (a.timed_out) return "timeout";
  if (a.status != 0 && a.status != 200) return "status";
  return "failed";
}

// What an answer is logged and counted with.
struct Named {
  std::string app;
  std::string channel;
  std::string url_text;
  ObserveCall observe;
};

// One hook: the URL, its timeout, the client that sends to it. The answers' handlers hold the
// names only, never the client: the last reference to a client must not drop on its own worker.
struct Hook {
  std::shared_ptr<const Named> named;
  http_client::Url url;
  std::chrono::milliseconds timeout;
  std::shared_ptr<Client> client;

  const std::string& app() const { return named->app; }
  const std::string& channel() const { return named->channel; }

  // Posts `body`; `parse` turns a 200's body into the reply's value (throwing when malformed).
  template <class T, class Parse>
  void call(const char* op, std::string body, Reply<T> reply, Parse parse) const {
    Call c{url, named->url_text, std::move(body), Clock::now() + timeout, nullptr};
    client->post(std::move(c), [self = named, op, reply, parse](Answer a) {
      const char* result = "ok";
      std::optional<T> value;
      if (a.failure.empty()) {
        try {
          value = parse(a.body);
        } catch (const std::exception& e) {
          result = "malformed";
          a.failure = "hook POST " + self->url_text + ": " + op + ": " + e.what();
        }
      } else {
        result = cause_of(a);
      }
      // Counted before the reply: whatever the reply sets off (a socket's close) comes after.
      if (self->observe) self->observe(self->channel, op, result, a.seconds);
      if (value) return reply(std::move(*value));
      log::limited(log::Level::warn, "hook call failed",
                   {{"app", self->app}, {"channel", self->channel}, {"op", op},
                    {"url", self->url_text}, {"error", a.failure}});
      reply.fail(a.failure);
    });
  }
};

}  // namespace

KeysResult parse_keys_answer(const std::string& body) {
  const auto doc = parse_object(body);
  const auto it = doc.find("keys");
  if (it == doc.end()) throw Error(Errc::invalid_input, "the answer has no \"keys\"");
  if (it->is_null()) return std::nullopt;
  if (!it->is_array()) throw Error(Errc::invalid_input, "\"keys\" is neither an array nor null");
  return strings(*it, "keys");
}

AllowedViewers parse_authorize_answer(const std::string& body) {
  const auto doc = parse_object(body);
  const auto it = doc.find("allowed");
  if (it == doc.end()) throw Error(Errc::invalid_input, "the answer has no \"allowed\"");
  if (!it->is_array()) throw Error(Errc::invalid_input, "\"allowed\" is not an array");
  return strings(*it, "allowed");
}

CodeChannel hook_channel(const std::string& app, const std::string& name,
                         const config::Channel& channel, std::shared_ptr<Client> client,
                         ObserveCall observe) {
  const std::string where = "/apps/" + app + "/channels/" + name + "/hook/url";
  Hook hook{std::make_shared<const Named>(Named{app, name, channel.hook->url, std::move(observe)}),
            http_client::parse_url(channel.hook->url, where), channel.hook->timeout,
            std::move(client)};
  CodeChannel out;
  out.app = app;
  out.name = name;
  out.scope = channel.scope;
  out.collection = channel.collection;
  out.keys = [hook](const nlohmann::json& scope, const nlohmann::json& viewer, Reply<KeysResult> reply) {
    const nlohmann::json body = {
        {"op", "keys"}, {"app", hook.app()}, {"channel", hook.channel()}, {"scope", scope}, {"viewer", viewer}};
    hook.call("keys", body.dump(), std::move(reply), parse_keys_answer);
  };
  out.authorize = [hook](const std::string& key, const nlohmann::json& viewers,
                         Reply<AllowedViewers> reply) {
    const nlohmann::json body = {{"op", "authorize"}, {"app", hook.app()},   {"channel", hook.channel()},
                                 {"key", key},        {"viewers", viewers}};
    hook.call("authorize", body.dump(), std::move(reply), parse_authorize_answer);
  };
  return out;
}

}  // namespace outlive::hooks
