#pragma once
// Channels answered by the application over HTTP (SPEC 5.4 rev 4): a channel with a `hook` becomes
// a code channel whose keys() and authorize() POST {"op":"keys",...} / {"op":"authorize",...} to
// the hook through the app's hooks::Client and complete their Reply with the answer. From there on
// it is a code channel like any other: the decider's batching (500 viewers), decision cache,
// access updates, collections and 10 s deadline hold unchanged.
#include <functional>
#include <memory>
#include <outlive/channel.hpp>
#include <string>

#include "config/config.hpp"

namespace outlive::hooks {

class Client;

// What became of one hook call, for /metrics: `op` "keys" or "authorize", `result` "ok",
// "timeout", "status", "malformed" or "failed" (connection, TLS, no room).
using ObserveCall = std::function<void(const std::string& channel, const char* op, const char* result,
                                       double seconds)>;

// The code channel of `channel` (which has a hook) of app `app`. Throws outlive::Error
// (invalid_input) naming the channel when the hook's URL is not an http(s) URL. `client` must
// outlive every call the channel makes.
CodeChannel hook_channel(const std::string& app, const std::string& name,
                         const config::Channel& channel, std::shared_ptr<Client> client,
                         ObserveCall observe = {});

// The parsers of the two answers (pure; tests and the fuzz target call them): the keys, nullopt
// for {"keys":null}; or the allowed viewer ids. Throw outlive::Error(invalid_input) saying what
// is wrong with the body.
KeysResult parse_keys_answer(const std::string& body);
AllowedViewers parse_authorize_answer(const std::string& body);

}  // namespace outlive::hooks
