#include "hooks/auth_hook.hpp"

#include <chrono>

#include "common/error.hpp"
#include "common/log.hpp"
#include "hooks/client.hpp"
#include "http_client/url.hpp"

namespace outlive::hooks {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// Header values are bytes from the network: never let one that is not UTF-8 throw.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

const json& string_field(const json& object, const char* name) {
  const auto it = object.find(name);
  if (it == object.end() || !it->is_string() || it->get_ref<const std::string&>().empty()) {
    throw Error(Errc::invalid_input, std::string("the viewer has no \"") + name + "\" string");
  }
  return *it;
}

CredentialAnswer parse_result(const json& result) {
  if (!result.is_object()) throw Error(Errc::invalid_input, "the result is not an object");
  CredentialAnswer a;
  if (const auto it = result.find("refused"); it != result.end()) {
    if (!it->is_string()) throw Error(Errc::invalid_input, "\"refused\" is not a string");
    a.refused = it->get<std::string>();
    if (a.refused.empty()) a.refused = "refused";
    return a;
  }
  const auto v = result.find("viewer");
  if (v == result.end() || !v->is_object()) {
    throw Error(Errc::invalid_input, "the result has neither \"viewer\" nor \"refused\"");
  }
  json viewer = {{"id", string_field(*v, "id")},
                 {"actor", string_field(*v, "actor")},
                 {"accessSubject", string_field(*v, "accessSubject")},
                 {"scopes", nullptr}};
  if (const auto s = v->find("scopes"); s != v->end() && !s->is_null()) {
    if (!s->is_array()) throw Error(Errc::invalid_input, "\"scopes\" is neither an array nor null");
    for (const auto& scope : *s) {
      if (!scope.is_string()) throw Error(Errc::invalid_input, "\"scopes\" holds a non-string");
    }
    viewer["scopes"] = *s;
  }
  if (const auto e = result.find("expires_in_s"); e != result.end() && !e->is_null()) {
    if (!e->is_number_integer() || e->get<int64_t>() < 0) {
      throw Error(Errc::invalid_input, "\"expires_in_s\" is not a non-negative integer");
    }
    // 0 would ask again at once, forever: a second is the soonest.
    a.expires_in_s = std::max<int64_t>(1, e->get<int64_t>());
  }
  a.viewer = std::move(viewer);
  return a;
}

const char* cause_of(const Answer& a) {
  if (a.timed_out) return "timeout";
  if (a.status != 0 && a.status != 200) return "status";
  return "failed";
}

}  // namespace

std::vector<CredentialAnswer> parse_credentials_answer(const std::string& body, size_t count) {
  const json doc = json::parse(body, nullptr, false);
  if (doc.is_discarded()) throw Error(Errc::invalid_input, "the answer is not JSON");
  if (!doc.is_object()) throw Error(Errc::invalid_input, "the answer is not a JSON object");
  const auto results = doc.find("results");
  if (results == doc.end() || !results->is_object()) {
    throw Error(Errc::invalid_input, "the answer has no \"results\" object");
  }
  std::vector<CredentialAnswer> out(count);
  for (size_t i = 0; i < count; ++i) {
    const std::string ref = std::to_string(i + 1);
    const auto it = results->find(ref);
    if (it == results->end()) {
      out[i].failure = "the answer has no result for ref " + ref;
      continue;
    }
    try {
      out[i] = parse_result(*it);
    } catch (const std::exception& e) {
      out[i] = CredentialAnswer{};
      out[i].failure = "ref " + ref + ": " + e.what();
    }
  }
  return out;
}

// What the answers' handlers hold: never the client (the last reference to a client must not drop
// on its own worker).
struct AuthHook::Shared {
  std::string app;
  std::string url_text;
  http_client::Url url;
  std::chrono::milliseconds timeout;
  ObserveCall observe;
  std::mutex mutex;
  std::shared_ptr<Batch> open;  // the batch new checks join, while it is not closed
};

struct AuthHook::Batch {
  // Under Shared::mutex: closed once its body is written or it is answered.
  bool closed = false;
  std::vector<json> credentials;
  std::vector<Done> done;
};

AuthHook::AuthHook(std::string app, const config::AuthHook& settings,
                   std::shared_ptr<Client> client, ObserveCall observe)
    : shared_(std::make_shared<Shared>()), client_(std::move(client)) {
  shared_->app = std::move(app);
  shared_->url_text = settings.url;
  shared_->url = http_client::parse_url(settings.url, "/auth/hook/url");
  shared_->timeout = settings.timeout;
  shared_->observe = std::move(observe);
}

AuthHook::~AuthHook() = default;

void AuthHook::check(const std::string& credential, Done done) {
  json entry = json::parse(credential, nullptr, false);
  if (!entry.is_object()) {
    CredentialAnswer a;
    a.failure = "not a credential of the hook";
    return done(std::move(a));
  }
  std::shared_ptr<Batch> fresh;
  {
    std::lock_guard lock(shared_->mutex);
    auto& open = shared_->open;
    if (open && !open->closed && open->credentials.size() < kBatch) {
      open->credentials.push_back(std::move(entry));
      open->done.push_back(std::move(done));
      return;
    }
    open = fresh = std::make_shared<Batch>();
    fresh->credentials.push_back(std::move(entry));
    fresh->done.push_back(std::move(done));
  }
  send(fresh);
}

void AuthHook::send(const std::shared_ptr<Batch>& batch) {
  Call call{shared_->url, shared_->url_text, {}, Clock::now() + shared_->timeout, {}};
  call.make_body = [shared = shared_, batch] {
    std::lock_guard lock(shared->mutex);
    batch->closed = true;
    json credentials = json::array();
    for (size_t i = 0; i < batch->credentials.size(); ++i) {
      json c = std::move(batch->credentials[i]);
      c["ref"] = std::to_string(i + 1);
      credentials.push_back(std::move(c));
    }
    return dump(json{{"app", shared->app}, {"credentials", std::move(credentials)}});
  };
  client_->post(std::move(call), [shared = shared_, batch](Answer a) {
    std::vector<Done> done;
    {
      std::lock_guard lock(shared->mutex);
      batch->closed = true;
      done = std::move(batch->done);
    }
    const char* result = "ok";
    std::vector<CredentialAnswer> answers;
    if (a.failure.empty()) {
      try {
        answers = parse_credentials_answer(a.body, done.size());
      } catch (const std::exception& e) {
        result = "malformed";
        a.failure = "hook POST " + shared->url_text + ": credentials: " + e.what();
      }
    } else {
      result = cause_of(a);
    }
    if (shared->observe) shared->observe("", "credentials", result, a.seconds);
    std::string missing;  // the first ref the answer lacks or spoils, for the log
    for (const auto& answer : answers) {
      if (!answer.failure.empty()) {
        missing = answer.failure;
        break;
      }
    }
    if (!a.failure.empty() || !missing.empty()) {
      log::limited(log::Level::warn, "hook call failed",
                   {{"app", shared->app}, {"op", "credentials"}, {"url", shared->url_text},
                    {"error", a.failure.empty() ? "credentials: " + missing : a.failure}});
    }
    for (size_t i = 0; i < done.size(); ++i) {
      CredentialAnswer answer;
      if (!a.failure.empty()) {
        answer.failure = a.failure;
      } else {
        answer = std::move(answers[i]);
        if (!answer.failure.empty()) {
          answer.failure = "hook POST " + shared->url_text + ": credentials: " + answer.failure;
        }
      }
      done[i](std::move(answer));
    }
  });
}

}  // namespace outlive::hooks
