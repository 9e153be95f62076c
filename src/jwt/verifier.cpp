#include "jwt/verifier.hpp"

#include <signal.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <thread>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/thread_name.hpp"
#include "jwt/jwks_fetch.hpp"
#include "jwt/verifier_time.hpp"
#include "metrics/metrics.hpp"

namespace outlive::jwt {

namespace {

using Steady = std::chrono::steady_clock::time_point;

Policy policy_of(const config::Jwt& settings) {
  Policy p;
  for (const auto& name : settings.algorithms) {
    const auto a = algorithm_named(name);
    if (!a) {
      throw Error(Errc::invalid_input, "auth.jwt.algorithms: \"" + name +
                                           "\" is not one of RS256, ES256, EdDSA, HS256");
    }
    p.algorithms.insert(*a);
  }
  if (p.algorithms.empty()) throw Error(Errc::invalid_input, "auth.jwt.algorithms is empty");
  p.issuer = settings.issuer;
  p.audience = settings.audience;
  return p;
}

// A secret file's bytes without the trailing newlines an editor or `echo` leaves.
std::string read_secret(const std::string& path, const char* field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(Errc::invalid_input, std::string("auth.jwt.") + field + " " + path + ": cannot be read");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error(Errc::invalid_input, std::string("auth.jwt.") + field + " " + path + ": cannot be read");
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (s.empty()) throw Error(Errc::invalid_input, std::string("auth.jwt.") + field + " " + path + ": is empty");
  if (s.size() < 32) {
    throw Error(Errc::invalid_input, std::string("auth.jwt.") + field + " " + path +
                                         ": the secret is shorter than 32 bytes (RFC 7518 3.2)");
  }
  return s;
}

std::vector<std::string> split_scopes(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string s; in >> s;) out.push_back(s);
  return out;
}

// The scopes of `scope` (RFC 8693 4.2: space-separated) or else `scp` (an array of strings, or a
// space-separated string, as Azure AD and Okta send it); nullopt when the token has neither.
std::optional<std::vector<std::string>> scopes_of(const nlohmann::json& payload) {
  if (const auto it = payload.find("scope"); it != payload.end() && it->is_string()) {
    return split_scopes(it->get<std::string>());
  }
  if (const auto it = payload.find("scp"); it != payload.end()) {
    if (it->is_string()) return split_scopes(it->get<std::string>());
    if (it->is_array()) {
      std::vector<std::string> out;
      for (const auto& s : *it) {
        if (s.is_string()) out.push_back(s.get<std::string>());
      }
      return out;
    }
  }
  return std::nullopt;
}

std::string claim_or(const nlohmann::json& payload, const std::string& claim, const std::string& otherwise) {
  if (claim.empty()) return otherwise;
  const auto it = payload.find(claim);
  if (it == payload.end() || !it->is_string() || it->get_ref<const std::string&>().empty()) return otherwise;
  return it->get<std::string>();
}

std::vector<std::string> kids_of(const KeySet& keys) {
  std::vector<std::string> out;
  for (const Algorithm a : {Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA, Algorithm::HS256}) {
    for (const Key* k : keys.candidates(a, std::nullopt)) out.push_back(k->kid);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

auth::Viewer viewer_of(const Claims& claims, const config::Jwt& settings) {
  auth::Viewer v;
  const std::string subject = settings.id_prefix + claims.subject;
  v.scopes = scopes_of(claims.payload);
  v.id = auth::viewer_id(subject, false, v.scopes);
  v.actor = claim_or(claims.payload, settings.actor_claim, subject);
  v.access_subject = claim_or(claims.payload, settings.access_subject_claim, subject);
  return v;
}

struct Verifier::Impl {
  struct Waiter {
    std::string token;
    std::function<void(Answer)> done;
  };

  config::Jwt settings;
  Policy policy;
  std::shared_ptr<const Time> time;
  bool jwks;  // else the HMAC secret files

  // The counters: the registry's, or these when there is none.
  std::array<std::atomic<uint64_t>, 16> own_counters{};
  std::atomic<uint64_t>* verified_ok;
  std::vector<std::atomic<uint64_t>*> verified_failed;  // by Failure
  std::atomic<uint64_t>* fetches_ok;
  std::atomic<uint64_t>* fetches_failed;
  // Read by the gauge, which may outlive this verifier in the registry.
  std::shared_ptr<std::atomic<int64_t>> key_count = std::make_shared<std::atomic<int64_t>>(0);

  std::mutex mutex;
  std::condition_variable wake;
  std::shared_ptr<const KeySet> keys;  // null until start()
  Steady last_good{};                  // the last fetch that gave a key set
  Steady next_fetch{};
  std::optional<Steady> last_kid_fetch;  // when an unknown kid last asked for a refetch
  bool kid_fetch_wanted = false;
  bool fetching = false;
  bool stopping = false;
  std::vector<Waiter> waiters;
  std::optional<Steady> last_failure_logged;
  std::thread thread;

  Impl(config::Jwt s, metrics::Registry* metrics, std::shared_ptr<const Time> t)
      : settings(std::move(s)), policy(policy_of(settings)), time(std::move(t)) {
    const bool url = !settings.jwks_url.empty();
    const bool secret = !settings.hmac_secret_file.empty();
    if (url == secret) {
      throw Error(Errc::invalid_input, "auth.jwt needs exactly one of jwks_url and hmac_secret_file");
    }
    jwks = url;
    if (jwks) parse_url(settings.jwks_url);  // throws naming the URL
    size_t next = 0;
    auto counter = [&](const std::string& name, const std::string& help,
                       const metrics::Labels& labels) -> std::atomic<uint64_t>* {
      if (metrics != nullptr) return &metrics->counter(name, help, labels);
      return &own_counters.at(next++);
    };
    const std::string verifications = "outlive_jwt_verifications_total";
    const std::string verifications_help = "JWT verifications by result (ok or why refused)";
    verified_ok = counter(verifications, verifications_help, {{"result", "ok"}});
    verified_failed.resize(all_failures().size());
    for (const Failure f : all_failures()) {
      verified_failed[static_cast<size_t>(f)] =
          counter(verifications, verifications_help, {{"result", name_of(f)}});
    }
    const std::string fetches = "outlive_jwks_fetches_total";
    const std::string fetches_help = "JWKS fetches by result";
    fetches_ok = counter(fetches, fetches_help, {{"result", "ok"}});
    fetches_failed = counter(fetches, fetches_help, {{"result", "failed"}});
    if (metrics != nullptr) {
      metrics->gauge("outlive_jwks_keys", "JWT verification keys in use (JWKS keys or HMAC secrets)",
                     {}, [count = key_count] { return static_cast<double>(count->load()); });
    }
  }

  Answer counted(Answer a) {
    if (std::holds_alternative<Verified>(a)) {
      verified_ok->fetch_add(1, std::memory_order_relaxed);
    } else {
      verified_failed[static_cast<size_t>(std::get<Failure>(a))]->fetch_add(1, std::memory_order_relaxed);
    }
    return a;
  }

  Answer answer_of(const Verdict& v) {
    if (const auto* f = std::get_if<Failure>(&v)) return *f;
    const auto& claims = std::get<Claims>(v);
    return Verified{viewer_of(claims, settings), claims.expires_at, claims.issued_at};
  }

  std::shared_ptr<const KeySet> usable_keys() {
    std::lock_guard lock(mutex);
    if (!keys) return nullptr;
    if (jwks && time->steady() - last_good > kJwksKeptWhileFailing) return nullptr;
    return keys;
  }

  // The answer now, or nullopt when `done` was queued for a refetch (wait == true only).
  std::optional<Answer> answer(const std::string& token, std::function<void(Answer)>* done) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      const auto set = usable_keys();
      if (!set) return counted(Failure::no_keys);
      const Verdict v = jwt::verify(token, *set, policy, time->unix_seconds());
      const auto* failure = std::get_if<Failure>(&v);
      if (!jwks || failure == nullptr || *failure != Failure::unknown_kid) return counted(answer_of(v));
      std::unique_lock lock(mutex);
      if (keys != set) continue;  // a fetch gave a new set meanwhile: look again in it
      if (fetching || kid_fetch_wanted) {
        // Join the refetch under way: it may be the rotation this token comes from.
        if (done == nullptr) return counted(Failure::unknown_kid);
        waiters.push_back({token, std::move(*done)});
        return std::nullopt;
      }
      const Steady now = time->steady();
      if (last_kid_fetch && now - *last_kid_fetch < kUnknownKidRefetchInterval) {
        return counted(Failure::unknown_kid);
      }
      last_kid_fetch = now;
      kid_fetch_wanted = true;
      wake.notify_all();
      if (done == nullptr) return counted(Failure::unknown_kid);
      waiters.push_back({token, std::move(*done)});
      return std::nullopt;
    }
    return counted(Failure::unknown_kid);
  }

  // One fetch; the key set on success. Counts, and logs a failure at most once per 10 s.
  std::shared_ptr<const KeySet> fetch(std::string& error, Errc& code,
                                      std::optional<std::chrono::seconds>& max_age) {
    try {
      Fetched f = fetch_jwks(settings.jwks_url, kJwksFetchTimeout);
      max_age = f.max_age;
      try {
        auto set = std::make_shared<const KeySet>(KeySet::from_jwks(f.body));
        fetches_ok->fetch_add(1, std::memory_order_relaxed);
        return set;
      } catch (const Error& e) {
        throw Error(e.code(), std::string(e.what()) + " (from " + settings.jwks_url + ")");
      }
    } catch (const Error& e) {
      fetches_failed->fetch_add(1, std::memory_order_relaxed);
      error = e.what();
      code = e.code();
      return nullptr;
    } catch (const std::exception& e) {
      fetches_failed->fetch_add(1, std::memory_order_relaxed);
      error = "jwks: GET " + settings.jwks_url + ": " + e.what();
      code = Errc::internal;
      return nullptr;
    }
  }

  void install(std::shared_ptr<const KeySet> set, std::optional<std::chrono::seconds> max_age) {
    const Steady now = time->steady();
    const bool changed = !keys || kids_of(*keys) != kids_of(*set);
    if (changed) {
      log::info("jwks keys loaded", {{"url", settings.jwks_url},
                                     {"kids", kids_of(*set)},
                                     {"skipped", set->skipped()}});
    }
    key_count->store(static_cast<int64_t>(set->size()));
    keys = std::move(set);
    last_good = now;
    next_fetch = now + std::clamp<std::chrono::seconds>(max_age.value_or(kJwksDefaultMaxAge),
                                                        kJwksMinMaxAge, kJwksMaxMaxAge);
  }

  void failed(const std::string& error) {
    const Steady now = time->steady();
    next_fetch = now + kJwksRetryAfterFailure;
    if (last_failure_logged && now - *last_failure_logged < kJwksFailureLogInterval) return;
    last_failure_logged = now;
    const auto age = std::chrono::duration_cast<std::chrono::seconds>(now - last_good).count();
    const bool kept = age <= kJwksKeptWhileFailing.count();
    log::warn(kept ? "jwks fetch failed: the last key set stays in use"
                   : "jwks fetch failed: no key set fetched for 24 h, every JWT is refused",
              {{"url", settings.jwks_url}, {"error", error}, {"last_good_s_ago", age}});
  }

  void run() {
    // Never the thread a stop signal goes to: main() waits for those with sigwait.
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);
    name_this_thread("outlive-jwks");
    std::unique_lock lock(mutex);
    for (;;) {
      while (!stopping && !kid_fetch_wanted && time->steady() < next_fetch) {
        wake.wait_for(lock, next_fetch - time->steady());
      }
      if (stopping) return;
      kid_fetch_wanted = false;
      fetching = true;
      lock.unlock();
      std::string error;
      Errc code = Errc::internal;
      std::optional<std::chrono::seconds> max_age;
      auto set = fetch(error, code, max_age);
      lock.lock();
      fetching = false;
      if (set) {
        install(std::move(set), max_age);
      } else {
        failed(error);
      }
      std::vector<Waiter> answered;
      answered.swap(waiters);
      lock.unlock();
      // Answered with the new set (or the old one when the fetch failed); a kid still unknown is
      // unknown_kid: the refetch it waited for was its one.
      for (auto& w : answered) {
        Answer a = Failure::unknown_kid;
        if (const auto current = usable_keys()) {
          a = answer_of(jwt::verify(w.token, *current, policy, time->unix_seconds()));
        } else {
          a = Failure::no_keys;
        }
        deliver(w.done, counted(std::move(a)));
      }
      lock.lock();
    }
  }

  static void deliver(std::function<void(Answer)>& done, Answer a) {
    try {
      done(std::move(a));
    } catch (const std::exception& e) {
      log::error("jwt: a verification's callback threw", {{"error", e.what()}});
    } catch (...) {
      log::error("jwt: a verification's callback threw");
    }
  }
};

Verifier::Verifier(config::Jwt settings, metrics::Registry* metrics)
    : Verifier(std::move(settings), metrics, std::make_shared<RealTime>()) {}

Verifier::Verifier(config::Jwt settings, metrics::Registry* metrics, std::shared_ptr<const Time> time)
    : impl_(std::make_unique<Impl>(std::move(settings), metrics, std::move(time))) {}

Verifier::~Verifier() {
  std::vector<Impl::Waiter> left;
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
    impl_->wake.notify_all();
  }
  if (impl_->thread.joinable()) impl_->thread.join();
  left.swap(impl_->waiters);
  for (auto& w : left) Impl::deliver(w.done, impl_->counted(Failure::unknown_kid));
}

void Verifier::start() {
  Impl& d = *impl_;
  if (!d.jwks) {
    const std::string current = read_secret(d.settings.hmac_secret_file, "hmac_secret_file");
    const std::string previous =
        d.settings.hmac_previous_secret_file.empty()
            ? std::string()
            : read_secret(d.settings.hmac_previous_secret_file, "hmac_previous_secret_file");
    auto set = std::make_shared<const KeySet>(KeySet::from_secrets(current, previous));
    std::lock_guard lock(d.mutex);
    d.key_count->store(static_cast<int64_t>(set->size()));
    d.keys = std::move(set);
    d.last_good = d.time->steady();
    return;
  }
  std::string error;
  Errc code = Errc::internal;
  std::optional<std::chrono::seconds> max_age;
  auto set = d.fetch(error, code, max_age);
  if (!set) throw Error(code, "auth.jwt.jwks_url: " + error);
  {
    std::lock_guard lock(d.mutex);
    d.install(std::move(set), max_age);
  }
  d.thread = std::thread([&d] { d.run(); });
}

void Verifier::verify(const std::string& token, std::function<void(Answer)> done) {
  if (auto a = impl_->answer(token, &done)) Impl::deliver(done, std::move(*a));
}

Answer Verifier::verify_now(const std::string& token) { return *impl_->answer(token, nullptr); }

const config::Jwt& Verifier::settings() const { return impl_->settings; }

void Verifier::time_moved() {
  std::lock_guard lock(impl_->mutex);
  impl_->wake.notify_all();
}

}  // namespace outlive::jwt
