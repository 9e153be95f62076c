#pragma once
// The NATS client protocol (docs.nats.io "Client Protocol") as bytes, without a client library:
// what a server sends, parsed as it arrives in pieces, and what a client sends, encoded. Pure: no
// sockets here. bench/nats_loop_bench's floor speaks NATS with it; it is the first part of a
// client that runs on the caller's own loop (docs/CAPACITY.md "What NATS itself costs").
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace outlive::topic::wire {

// Bytes a server may not send: the connection is to be dropped.
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Op : uint8_t { info, msg, ping, pong, ok, err };

// One operation from the server. The views point into the parser's buffer: valid only during the
// callback that receives them.
struct ServerOp {
  Op op = Op::ok;
  std::string_view text;  // INFO: its JSON; -ERR: the message without quotes
  // MSG and HMSG.
  std::string_view subject;
  uint64_t sid = 0;
  std::string_view reply;    // empty when none
  std::string_view headers;  // HMSG: the whole block, from "NATS/1.0" to its empty line
  std::string_view payload;
  // HMSG: the status on the block's first line ("NATS/1.0 503"), 0 when none. 503 is "no
  // responders" (nothing listens on the subject: no stream), 408 a pull request that expired, 404
  // no messages, 100 an idle heartbeat or flow control.
  int status = 0;
  std::string_view status_text;
};

struct Limits {
  size_t max_control_line = 4096;        // nats-server's own limit for a client's
  size_t max_payload = 64 * 1024 * 1024;  // nats-server's largest max_payload
};

// Parses the server's byte stream. feed() takes the bytes in any pieces and calls on(op) for each
// operation completed, in order.
class Parser {
 public:
  explicit Parser(Limits limits = {}) : limits_(limits) {}

  // Throws ProtocolError on anything a server does not send (an unknown operation, a malformed
  // number, a control line or payload past the limits, a payload not followed by CRLF); the
  // parser is then unusable. An exception thrown by `on` leaves the op it was given unconsumed.
  template <typename OnOp>
  void feed(std::string_view bytes, OnOp&& on) {
    buffer_.append(bytes);
    size_t pos = 0;
    // What was handed to `on` leaves the buffer however this returns.
    struct Consume {
      std::string& buffer;
      const size_t& pos;
      ~Consume() { buffer.erase(0, pos); }
    } consume{buffer_, pos};
    ServerOp op;
    while (const size_t used = next(std::string_view(buffer_).substr(pos), op)) {
      on(static_cast<const ServerOp&>(op));
      pos += used;
    }
  }
  // Bytes held for an operation not complete yet.
  size_t buffered() const { return buffer_.size(); }

 private:
  // The bytes of the first complete operation in `in` (0 when there is none yet), parsed into op.
  size_t next(std::string_view in, ServerOp& op) const;

  Limits limits_;
  std::string buffer_;
};

// The value of header `name` (case-insensitive, as NATS compares them) in an HMSG's block; the
// first when there are several.
std::optional<std::string_view> header_value(std::string_view headers, std::string_view name);

// --- what a client sends (appended to `out`, so that a burst leaves in one write) ---------------

// CONNECT with its JSON options (built by the caller: credentials, name, "headers":true, ...).
void append_connect(std::string& out, std::string_view options_json);
void append_sub(std::string& out, std::string_view subject, uint64_t sid);
void append_unsub(std::string& out, uint64_t sid);
void append_pong(std::string& out);
void append_ping(std::string& out);
// PUB, or HPUB when `headers` is not empty. Throws std::invalid_argument for a subject, reply or
// header that would break the protocol (empty subject, whitespace in subject or reply, CR or LF
// in a header).
void append_publish(std::string& out, std::string_view subject, std::string_view reply,
                    const std::vector<std::pair<std::string_view, std::string_view>>& headers,
                    std::string_view payload);

}  // namespace outlive::topic::wire
