#pragma once
// Websocket framing (RFC 6455) after the handshake, without Beast: the server writes pre-framed
// messages itself so that every frame waiting for a socket leaves in one writev (several frames
// per system call when they queue), and the shared bytes of an update are never copied. Reading
// assembles the tab's frames into messages. Pure: no sockets here.
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace outlive::ws {

enum class Opcode : uint8_t {
  continuation = 0x0,
  text = 0x1,
  binary = 0x2,
  close = 0x8,
  ping = 0x9,
  pong = 0xA,
};

// The header of an unmasked, final server frame: 2, 4 or 10 bytes.
struct FrameHeader {
  std::array<uint8_t, 10> bytes{};
  uint8_t size = 0;
  std::string_view view() const { return {reinterpret_cast<const char*>(bytes.data()), size}; }
};
FrameHeader frame_header(Opcode opcode, uint64_t payload_size);

// The payload of a close frame: the code and a reason cut to fit a control frame (125 bytes) at
// a UTF-8 character boundary.
std::string close_payload(uint16_t code, std::string_view reason);

// True when `text` is well-formed UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF), as a text message must be.
bool valid_utf8(std::string_view text);

// Checks UTF-8 that arrives in pieces (the fragments of a text message), so that a message is
// refused at the first byte no continuation could make valid instead of once it is whole; a
// character cut between two pieces is carried over.
class Utf8Validator {
 public:
  // False from the first byte that cannot belong to well-formed UTF-8; it stays false.
  bool feed(std::string_view bytes);
  // True when everything fed so far was valid and ends at a character boundary.
  bool complete() const { return !invalid_ && needed_ == 0; }
  void reset() { *this = Utf8Validator(); }

 private:
  uint8_t needed_ = 0;  // continuation bytes still owed by the current character
  // The range of the next continuation byte: narrower than 80..BF right after the leads that
  // could otherwise start an overlong form, a surrogate or a code point past U+10FFFF.
  uint8_t lower_ = 0x80;
  uint8_t upper_ = 0xBF;
  bool invalid_ = false;
};

// What the reader found in the bytes it was given.
struct Incoming {
  enum class Kind {
    text,     // a whole text message in `payload`
    binary,   // a whole binary message in `payload`
    ping,     // answer with a pong carrying `payload`
    pong,     // nothing to do
    close,    // the peer closes: `code` (1005 when it gave none) and `payload` (the reason)
    failure,  // the peer broke the protocol or a limit: close with `code`, `payload` says why
  };
  Kind kind;
  std::string payload;
  uint16_t code = 0;
};

// Assembles client frames (masked, possibly fragmented, control frames in between) into
// messages. Feed it bytes as they arrive and take what is complete with next(). After a
// `failure` it returns nothing more.
class FrameReader {
 public:
  explicit FrameReader(size_t max_message_bytes) : max_message_bytes_(max_message_bytes) {}

  void feed(const char* data, size_t size);
  // The next complete message or control frame; nullopt while more bytes are needed.
  std::optional<Incoming> next();
  // Bytes received and not yet returned by next() (a partial frame, or frames not taken yet).
  size_t buffered() const { return buffer_.size() - offset_; }

 private:
  std::optional<Incoming> fail(uint16_t code, std::string why);

  const size_t max_message_bytes_;
  std::string buffer_;
  size_t offset_ = 0;
  std::string message_;  // fragments of the message being assembled
  std::optional<Opcode> message_type_;
  Utf8Validator utf8_;  // the text message being assembled, fragment by fragment
  // The frame at offset_ while it is partly here: its first bytes were seen, and how many of its
  // payload bytes the validator has had.
  bool frame_started_ = false;
  size_t frame_checked_ = 0;
  bool check_utf8(const uint8_t* payload, size_t from, size_t to);
  bool failed_ = false;
};

}  // namespace outlive::ws
