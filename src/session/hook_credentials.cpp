// The application's own session check (SPEC 5.1 rev 4, auth.hook): a hook credential is checked
// by the app's hooks::AuthHook on its own workers, never on an io thread or a database worker; the
// answer comes back to the socket's io thread like a code channel's (Checks::run_async).
#include "common/log.hpp"
#include "session/session.hpp"

namespace outlive::session {

using json = nlohmann::json;

namespace {

Services::HookCheck hook_of(Context& context, const std::string& app) {
  return context.services.auth_hook_of ? context.services.auth_hook_of(app) : nullptr;
}

}  // namespace

void Session::check_with_hook() {
  auto hook = hook_of(*context_, request_.app);
  if (!hook) return check_failed("auth.hook: no session check for app " + request_.app);
  checks_.run_async(
      [hook = std::move(hook), credential = credential_->token](Checks::Reply reply) {
        hook(credential, [reply](const auth::Resolution& r) {
          if (!r.failure.empty()) return reply(nullptr, r.failure);
          if (!r.viewer) return reply(json{{"refused", r.refused}}, "");
          reply(json{{"viewer", r.viewer->to_json()}, {"expires_in_s", r.expires_in_s}}, "");
        });
      },
      [this](const json& answer) { on_hook_answer(answer); });
}

void Session::on_hook_answer(const json& answer) {
  if (answer.contains("refused")) {
    lookup_running_ = false;
    context_->admission.lookup_ended(request_.address, false, std::chrono::steady_clock::now());
    return refuse({"unauthorized",
                   "the application refused the credential: " + answer["refused"].get<std::string>(),
                   ws::kPolicy});
  }
  hook_expires_in_s_ = answer["expires_in_s"].get<int64_t>();
  json viewer = answer["viewer"];
  viewer["appSession"] = false;
  on_viewer(viewer);
}

void Session::recheck_with_hook() {
  auto hook = hook_of(*context_, request_.app);
  if (!hook) return check_failed("auth.hook: no session check for app " + request_.app);
  std::weak_ptr<Session> weak = self();
  auto* context = context_.get();
  auto executor = this->executor();
  hook(credential_->token, [weak, context, executor](const auth::Resolution& r) {
    auto s = weak.lock();
    if (!s || s->closed_.load()) return;
    context->post_from_worker(executor, [s, r] { s->on_recheck(r); });
  });
}

}  // namespace outlive::session
