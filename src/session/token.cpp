// A socket's JWT (SPEC 5.1 rev 4): the auth message that brings it, its verification, and its
// refresh before exp. Members of Session, on the socket's io thread.
#include <chrono>

#include "common/log.hpp"
#include "jwt/verifier.hpp"
#include "session/session.hpp"

namespace outlive::session {

using json = nlohmann::json;

namespace {

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A verifier's answer as a check's reply: the viewer and its token's times, or why it was refused.
json answer_json(const jwt::Answer& answer) {
  if (const auto* failure = std::get_if<jwt::Failure>(&answer)) {
    return json{{"refused", jwt::name_of(*failure)}};
  }
  const auto& v = std::get<jwt::Verified>(answer);
  return json{{"id", v.viewer.id},
              {"actor", v.viewer.actor},
              {"accessSubject", v.viewer.access_subject},
              {"scopes", v.viewer.scopes ? json(*v.viewer.scopes) : json(nullptr)},
              {"exp", v.expires_at},
              {"iat", v.issued_at ? json(*v.issued_at) : json(nullptr)}};
}

// The message a refused token's tab reads (the failure's name, said in words).
std::string refusal_message(const std::string& failure) {
  if (failure == "expired") return "the token expired";
  if (failure == "not_yet_valid") return "the token is not valid yet";
  if (failure == "unknown_kid") return "the token's key is not in the key set";
  if (failure == "algorithm") return "the token's algorithm is not accepted";
  if (failure == "signature") return "the token's signature does not verify";
  if (failure == "issuer" || failure == "audience") return "the token is for another " + failure;
  return "the token is not a valid JWT (" + failure + ")";
}

}  // namespace

void Session::await_auth_message() {
  token_ = Token::awaited;
  set_deadline(opened_at_ + context_->settings.auth_message_wait);
  parse_early();
}

// Messages before the auth message wait for the viewer; beyond max_waiting_messages of them the
// socket is not read until the deadline refuses it.
void Session::take_auth_message() {
  while (token_ == Token::awaited && !closing() &&
         (!held_ || held_->size() < static_cast<size_t>(context_->settings.max_waiting_messages))) {
    auto message = next_message();
    if (!message) return;
    if (*message) {
      auto parsed = tab::parse_client_message(**message);
      if (auto* auth = std::get_if<tab::AuthMessage>(&parsed)) {
        token_ = Token::none;
        clear_deadline();
        credential_ = auth::Credential{auth::CredentialKind::jwt, std::move(auth->token)};
        return begin_lookup();
      }
    }
    if (!held_) held_ = std::make_unique<std::deque<std::optional<std::string>>>();
    held_->push_back(std::move(*message));
  }
}

void Session::verify_token() {
  auto* verifier = context_->services.jwt;
  checks_.run_async(
      [verifier, token = credential_->token](Checks::Reply reply) {
        verifier->verify(token, [reply](jwt::Answer answer) { reply(answer_json(answer), ""); });
      },
      [this](const json& answer) { on_token(answer); });
}

void Session::on_token(const json& answer) {
  lookup_running_ = false;
  const bool refused = answer.contains("refused");
  context_->admission.lookup_ended(request_.address, !refused, std::chrono::steady_clock::now());
  if (turned_away(answer)) return;
  token_expires_at_ = answer["exp"];
  auth::Viewer v;
  v.id = answer["id"];
  v.actor = answer["actor"];
  v.access_subject = answer["accessSubject"];
  if (!answer["scopes"].is_null()) v.scopes = answer["scopes"].get<std::vector<std::string>>();
  admit(std::move(v));
}

bool Session::turned_away(const json& answer, const std::string* same_viewer) {
  if (answer.contains("refused")) {
    // No key set for 24 h is the replica's trouble, not the token's: 1011, the tab retries.
    if (answer["refused"] == "no_keys") {
      check_failed("no JWT key set (JWKS down)");
    } else {
      refuse({"unauthorized", refusal_message(answer["refused"]), ws::kPolicy});
    }
    return true;
  }
  if (same_viewer && answer["id"] != *same_viewer) {
    refuse({"unauthorized", "the new token names another viewer", ws::kPolicy});
    return true;
  }
  if (signed_out(answer)) {
    refuse({"unauthorized", "the token was issued before its viewer was disconnected",
            ws::kPolicy});
    return true;
  }
  return false;
}

// An events.disconnect of the token's viewer came after the token was issued (SPEC 2.6 rev 4).
bool Session::signed_out(const json& answer) const {
  const auto& iat = answer["iat"];
  return context_->disconnects.refuses(
      request_.app, answer["id"].get<std::string>(),
      iat.is_null() ? std::nullopt : std::optional<int64_t>(iat.get<int64_t>()));
}

void Session::on_auth_message(std::string token) {
  if (!auth::is_jwt(credential_->kind)) {
    return send_text(tab::frames::error(
        "invalid_message", "this socket's credential is not a JWT: auth is not accepted"));
  }
  // (a second auth while one verifies: the later answer decides, each must pass)
  refresh_running_ = true;
  auto* verifier = context_->services.jwt;
  checks_.run_async(
      [verifier, token = std::move(token)](Checks::Reply reply) {
        verifier->verify(token, [reply](jwt::Answer answer) { reply(answer_json(answer), ""); });
      },
      [this](const json& answer) { on_refreshed(answer); });
}

void Session::on_refreshed(const json& answer) {
  refresh_running_ = false;
  if (turned_away(answer, &viewer_->id)) return;
  token_expires_at_ = std::max<int64_t>(token_expires_at_, answer["exp"].get<int64_t>());
  schedule_expiry();
}

void Session::schedule_expiry() {
  const int64_t now = unix_now();
  const int64_t notice = std::chrono::duration_cast<std::chrono::seconds>(
                             context_->settings.auth_expiring_notice)
                             .count();
  const auto steady = std::chrono::steady_clock::now();
  if (now < token_expires_at_ - notice) {
    token_ = Token::valid;
    // At most a day at a time (on_expiry_deadline looks again): a far `exp` stays a small wait.
    return set_deadline(steady + std::chrono::seconds(std::min<int64_t>(
                                     token_expires_at_ - notice - now, 24 * 3600)));
  }
  token_ = Token::expiring;
  send_text(tab::frames::auth_expiring(std::max<int64_t>(0, token_expires_at_ - now) * 1000));
  set_deadline(steady +
               std::chrono::seconds(std::max<int64_t>(
                   0, token_expires_at_ + context_->settings.jwt_leeway.count() - now)));
}

void Session::on_expiry_deadline() {
  if (token_ == Token::valid) return schedule_expiry();  // sends auth_expiring
  if (refresh_running_) {
    // A new token is being verified: its answer decides (within the check deadline).
    return set_deadline(std::chrono::steady_clock::now() + std::chrono::milliseconds(200));
  }
  send_text(tab::frames::error("token_expired", "the token expired without a new one (auth)"));
  close_with(ws::kTokenExpired, "token expired");
}

}  // namespace outlive::session
