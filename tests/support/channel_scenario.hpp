#pragma once
// The channel tests' shared steps (code channels, hook channels): SQL a writer runs, frames a tab
// reads, and one scenario of single keys and a collection that each kind of channel must answer
// with the same frames as the equivalent SQL channels. Header-only: it uses Catch's assertions.
#include <catch2/catch.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "support/frames.hpp"
#include "support/inventory.hpp"
#include "support/ws_client.hpp"

namespace outlive::testing::channels {

using nlohmann::json;

inline std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    out += c;
    if (c == '\'') out += '\'';
  }
  return out + "'";
}
inline std::string publish_sql(const std::string& key, const json& data) {
  return "SELECT events.publish_live('inventory', " + quoted(key) + ", " + quoted(data.dump()) +
         "::jsonb)";
}
inline std::string access_sql(const std::string& key, const std::optional<json>& data = std::nullopt) {
  return "SELECT events.publish_live('inventory', " + quoted(key) + ", " +
         (data ? quoted(data->dump()) + "::jsonb" : std::string("NULL")) + ", true)";
}
inline std::string member_sql(bool add, const std::string& warehouse, const std::string& subject) {
  return add ? "INSERT INTO inventory.members VALUES (" + quoted(warehouse) + ", " +
                   quoted(subject) + ")"
             : "DELETE FROM inventory.members WHERE warehouse_id = " + quoted(warehouse) +
                   " AND subject = " + quoted(subject);
}

inline json sub(const std::string& id, const std::string& channel, const json& scope = json::object(),
                const std::optional<std::string>& cursor = std::nullopt) {
  json m = {{"type", "sub"}, {"id", id}, {"channel", channel}, {"scope", scope}};
  if (cursor) m["cursor"] = *cursor;
  return m;
}

// What a frame says, without its cursor (cursors differ between runs).
inline json gist(json j) {
  j.erase("cursor");
  if (j.contains("message")) j.erase("message");
  return j;
}

// Frames (their gist) up to and including the first `type`; fails on close or timeout.
inline std::vector<json> frames_until(WsClient& ws, const std::string& type,
                                      std::string* cursor = nullptr,
                                      std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  std::vector<json> seen;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) FAIL("no " << type << " in time");
    const json j = next_frame(ws, left, cursor);
    seen.push_back(gist(j));
    if (j["type"] == type) return seen;
  }
}

// Single keys and a collection, driven the same way for channel `warehouse` and `mine`: what each
// tab receives, in order. `Fixture` opens tabs (open(session)) and commits (tx(statements)); the
// database has ada (member of north), bob (north) and carol (none).
template <class Fixture>
std::vector<json> scenario(Fixture& f, const std::string& warehouse, const std::string& mine) {
  std::vector<json> out;
  auto add = [&](std::vector<json> frames) { out.insert(out.end(), frames.begin(), frames.end()); };
  auto ada = f.open(kAdaToken);
  auto bob = f.open("bob-session");
  auto carol = f.open("carol-session");
  ada.send(sub("w", warehouse, kNorthScope).dump());
  add(frames_until(ada, "subscribed"));
  bob.send(sub("w", warehouse, kNorthScope).dump());
  add(frames_until(bob, "subscribed"));
  // keys() answers "not found" for a warehouse that does not exist, and the member filter leaves
  // nothing of one carol is not a member of.
  carol.send(sub("x", warehouse, {{"warehouse", "nowhere"}}).dump());
  add(frames_until(carol, "error"));
  carol.send(sub("s", warehouse, kSouthScope).dump());
  add(frames_until(carol, "error"));
  carol.send(sub("c", mine).dump());
  add(frames_until(carol, "subscribed"));
  // Bob leaves north: authorize allows a subset (ada) of its readers.
  f.tx({member_sql(false, kNorth, "user:bob"), access_sql(kNorth), publish_sql(kNorth, {{"n", 1}})});
  add(frames_until(bob, "revoked"));
  add(frames_until(ada, "update"));
  // Carol joins north: her collection gains a key.
  f.tx({member_sql(true, kNorth, "user:carol"), access_sql(kNorth)});
  add(frames_until(carol, "resync"));
  f.tx({publish_sql(kNorth, {{"n", 2}})});
  add(frames_until(ada, "update"));
  add(frames_until(carol, "update"));
  return out;
}

}  // namespace outlive::testing::channels
