#include "window/window.hpp"

#include <algorithm>
#include <cassert>
#include <nlohmann/json.hpp>

namespace outlive::window {
namespace {

// What an update costs besides its key and data: the Update itself, its shared_ptr control blocks
// and its slot in the deque.
constexpr size_t kUpdateOverhead = 128;

}  // namespace

size_t Update::bytes() const {
  return key.size() + (data_json ? data_json->size() : 0) + kUpdateOverhead;
}

Update::Fields::~Fields() { delete fields.load(std::memory_order_acquire); }

const nlohmann::json& Update::scalar_fields() const {
  if (const auto* parsed = fields_.fields.load(std::memory_order_acquire)) return *parsed;
  auto fields = std::make_unique<nlohmann::json>(nlohmann::json::object());
  if (data_json) {
    auto doc = nlohmann::json::parse(*data_json, nullptr, /*allow_exceptions=*/false);
    if (doc.is_object()) {
      for (auto& [name, value] : doc.items()) {
        if (!value.is_structured()) (*fields)[name] = std::move(value);
      }
    }
  }
  // Two sockets may parse it at once: the first one stored is kept, so every filter sees one.
  const nlohmann::json* expected = nullptr;
  if (fields_.fields.compare_exchange_strong(expected, fields.get(), std::memory_order_acq_rel))
    return *fields.release();
  return *expected;
}

std::optional<Update> parse_envelope(uint64_t position, std::string_view envelope_json,
                                     int64_t created_at_us) {
  const auto doc =
      nlohmann::json::parse(envelope_json.begin(), envelope_json.end(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) return std::nullopt;
  const auto v = doc.find("v");
  if (v == doc.end() || !v->is_number_integer() || v->get<int64_t>() != 1) return std::nullopt;
  const auto k = doc.find("k");
  if (k == doc.end() || !k->is_string() || k->get_ref<const std::string&>().empty())
    return std::nullopt;

  Update u;
  u.position = position;
  u.key = k->get<std::string>();
  u.created_at_us = created_at_us;
  const auto d = doc.find("d");
  if (const auto resync = doc.find("resync"); resync != doc.end()) {
    if (!resync->is_string()) return std::nullopt;
    u.kind = Kind::resync;  // {"resync":"oversized"}: the data was too large for the topic
    return u;
  }
  if (const auto disconnect = doc.find("disconnect"); disconnect != doc.end()) {
    if (!disconnect->is_object()) return std::nullopt;
    const auto text = [&](const char* name) -> const std::string* {
      const auto it = disconnect->find(name);
      return it != disconnect->end() && it->is_string() ? &it->get_ref<const std::string&>()
                                                         : nullptr;
    };
    const auto at = disconnect->find("at_ms");
    if (!text("id") || !text("viewer") || text("viewer")->empty() || !text("reason") ||
        at == disconnect->end() || !at->is_number_integer())
      return std::nullopt;
    u.kind = Kind::disconnect;
    u.disconnect = std::make_shared<const Disconnect>(
        Disconnect{*text("id"), *text("viewer"), *text("reason"), at->get<int64_t>()});
    return u;
  }
  if (const auto access = doc.find("access");
      access != doc.end() && access->is_boolean() && access->get<bool>()) {
    u.kind = Kind::access;
    u.access = true;
    if (d != doc.end() && !d->is_null())
      u.data_json = std::make_shared<const std::string>(d->dump());
    return u;
  }
  if (d == doc.end()) return std::nullopt;
  u.kind = Kind::data;
  u.data_json = std::make_shared<const std::string>(d->dump());
  return u;
}

Window::Window(Limits limits) : limits_(limits) {}

void Window::append(UpdatePtr update) {
  assert(update != nullptr);
  std::lock_guard lock(mutex_);
  assert(update->position > head_ && "updates are appended in topic order");
  if (update->position <= head_) return;
  head_ = update->position;
  bytes_ += update->bytes();
  updates_.push_back(std::move(update));
  evict_locked();
}

void Window::advance_to(uint64_t position) {
  std::lock_guard lock(mutex_);
  head_ = std::max(head_, position);
}

void Window::lose_through(uint64_t position) {
  std::lock_guard lock(mutex_);
  floor_ = std::max(floor_, position);
  head_ = std::max(head_, position);
}

void Window::start_at(uint64_t position) {
  std::lock_guard lock(mutex_);
  updates_.clear();
  bytes_ = 0;
  head_ = position;
  floor_ = position;
}

void Window::evict_locked() {
  while (!updates_.empty() &&
         (updates_.size() > limits_.max_updates || bytes_ > limits_.max_bytes)) {
    const UpdatePtr& oldest = updates_.front();
    bytes_ -= oldest->bytes();
    floor_ = std::max(floor_, oldest->position);  // everything after it is still here
    updates_.pop_front();
  }
}

uint64_t Window::head() const {
  std::lock_guard lock(mutex_);
  return head_;
}

uint64_t Window::oldest_replayable() const {
  std::lock_guard lock(mutex_);
  return floor_;
}

std::optional<std::vector<UpdatePtr>> Window::since(uint64_t after) const {
  std::lock_guard lock(mutex_);
  if (after < floor_) return std::nullopt;
  const auto first =
      std::upper_bound(updates_.begin(), updates_.end(), after,
                       [](uint64_t pos, const UpdatePtr& u) { return pos < u->position; });
  return std::vector<UpdatePtr>(first, updates_.end());
}

std::optional<std::vector<UpdatePtr>> Window::since(uint64_t after, size_t max_count) const {
  std::lock_guard lock(mutex_);
  if (after < floor_) return std::nullopt;
  const auto first =
      std::upper_bound(updates_.begin(), updates_.end(), after,
                       [](uint64_t pos, const UpdatePtr& u) { return pos < u->position; });
  const auto count = std::min<size_t>(max_count, static_cast<size_t>(updates_.end() - first));
  return std::vector<UpdatePtr>(first, first + static_cast<std::ptrdiff_t>(count));
}

size_t Window::size() const {
  std::lock_guard lock(mutex_);
  return updates_.size();
}

size_t Window::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

}  // namespace outlive::window
