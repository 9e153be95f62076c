#include "ws/framing.hpp"

#include <algorithm>

namespace outlive::ws {

FrameHeader frame_header(Opcode opcode, uint64_t payload_size) {
  FrameHeader h;
  h.bytes[0] = 0x80 | static_cast<uint8_t>(opcode);
  if (payload_size < 126) {
    h.bytes[1] = static_cast<uint8_t>(payload_size);
    h.size = 2;
  } else if (payload_size <= 0xFFFF) {
    h.bytes[1] = 126;
    h.bytes[2] = static_cast<uint8_t>(payload_size >> 8);
    h.bytes[3] = static_cast<uint8_t>(payload_size);
    h.size = 4;
  } else {
    h.bytes[1] = 127;
    for (int i = 0; i < 8; ++i) h.bytes[2 + i] = static_cast<uint8_t>(payload_size >> (56 - 8 * i));
    h.size = 10;
  }
  return h;
}

std::string close_payload(uint16_t code, std::string_view reason) {
  constexpr size_t kMaxReason = 125 - 2;
  if (reason.size() > kMaxReason) {
    size_t cut = kMaxReason;
    // Back up to the first byte of a character: 10xxxxxx continues one.
    while (cut > 0 && (static_cast<uint8_t>(reason[cut]) & 0xC0) == 0x80) --cut;
    reason = reason.substr(0, cut);
  }
  std::string payload;
  payload.reserve(2 + reason.size());
  payload.push_back(static_cast<char>(code >> 8));
  payload.push_back(static_cast<char>(code & 0xFF));
  payload.append(reason);
  return payload;
}

bool valid_utf8(std::string_view text) {
  Utf8Validator v;
  return v.feed(text) && v.complete();
}

bool Utf8Validator::feed(std::string_view bytes) {
  if (invalid_) return false;
  const auto* s = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t c = s[i++];
    if (needed_ > 0) {
      if (c < lower_ || c > upper_) {
        invalid_ = true;
        return false;
      }
      lower_ = 0x80;
      upper_ = 0xBF;
      --needed_;
      continue;
    }
    if (c < 0x80) continue;
    // Bounds of the second byte from the Unicode table of well-formed byte sequences (Table 3-7).
    if (c >= 0xC2 && c <= 0xDF) {
      needed_ = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      needed_ = 2;
      if (c == 0xE0) lower_ = 0xA0;  // below: overlong
      if (c == 0xED) upper_ = 0x9F;  // above: a surrogate
    } else if (c >= 0xF0 && c <= 0xF4) {
      needed_ = 3;
      if (c == 0xF0) lower_ = 0x90;  // below: overlong
      if (c == 0xF4) upper_ = 0x8F;  // above: past U+10FFFF
    } else {
      // A continuation byte first, an overlong 2-byte lead, or past U+10FFFF.
      invalid_ = true;
      return false;
    }
  }
  return true;
}

void FrameReader::feed(const char* data, size_t size) {
  if (failed_) return;  // nothing after a failure is read: keep nothing
  if (offset_ == buffer_.size()) {
    buffer_.clear();
    offset_ = 0;
  } else if (offset_ > 16 * 1024) {
    buffer_.erase(0, offset_);
    offset_ = 0;
  }
  buffer_.append(data, size);
}

std::optional<Incoming> FrameReader::fail(uint16_t code, std::string why) {
  failed_ = true;
  buffer_.clear();
  offset_ = 0;
  message_.clear();
  return Incoming{Incoming::Kind::failure, std::move(why), code};
}

namespace {
bool known_close_code(uint16_t code) {
  return (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1014) ||
         (code >= 3000 && code <= 4999);
}
}  // namespace

// Unmasks payload bytes [from, to) of the frame whose masking key precedes `payload` and feeds
// them to the message's validator, without copying the frame.
bool FrameReader::check_utf8(const uint8_t* payload, size_t from, size_t to) {
  const uint8_t* mask = payload - 4;
  char piece[256];
  while (from < to) {
    const size_t n = std::min(sizeof piece, to - from);
    for (size_t i = 0; i < n; ++i)
      piece[i] = static_cast<char>(payload[from + i] ^ mask[(from + i) & 3]);
    if (!utf8_.feed(std::string_view(piece, n))) return false;
    from += n;
  }
  return true;
}

std::optional<Incoming> FrameReader::next() {
  for (;;) {
    if (failed_) return std::nullopt;
    if (offset_ == buffer_.size() && buffer_.capacity() > std::string().capacity()) {
      // Everything was taken: an idle socket keeps no buffer (the last message was copied out).
      std::string().swap(buffer_);
      offset_ = 0;
    }
    const size_t available = buffer_.size() - offset_;
    if (available < 2) return std::nullopt;
    const auto* p = reinterpret_cast<const uint8_t*>(buffer_.data() + offset_);
    const bool fin = p[0] & 0x80;
    const uint8_t opcode = p[0] & 0x0F;
    const bool masked = p[1] & 0x80;
    uint64_t length = p[1] & 0x7F;
    if (p[0] & 0x70) return fail(1002, "reserved bits set");
    if (!masked) return fail(1002, "frames from a client must be masked");
    size_t header = 2;
    if (length == 126) {
      if (available < 4) return std::nullopt;
      length = (uint64_t(p[2]) << 8) | p[3];
      if (length < 126) return fail(1002, "frame length not in its shortest form");
      header = 4;
    } else if (length == 127) {
      if (available < 10) return std::nullopt;
      length = 0;
      for (int i = 0; i < 8; ++i) length = (length << 8) | p[2 + i];
      if (length >> 63) return fail(1002, "frame length out of range");
      if (length <= 0xFFFF) return fail(1002, "frame length not in its shortest form");
      header = 10;
    }
    header += 4;  // the masking key
    const bool control = opcode & 0x8;
    if (control) {
      if (opcode != 0x8 && opcode != 0x9 && opcode != 0xA) return fail(1002, "unknown opcode");
      if (!fin) return fail(1002, "a control frame may not be fragmented");
      if (length > 125) return fail(1002, "a control frame carries at most 125 bytes");
    } else {
      if (opcode > 0x2) return fail(1002, "unknown opcode");
      if (opcode == 0x0 && !message_type_) return fail(1002, "a continuation without a message");
      if (opcode != 0x0 && message_type_) return fail(1002, "a new message before the last ended");
      // Refused as soon as the header says so, before its bytes arrive.
      if (length > max_message_bytes_ || message_.size() + length > max_message_bytes_) {
        return fail(1009, "message too big");
      }
    }
    // A text message's bytes are checked as they arrive, not once its frame is whole (SPEC 5.7
    // rev 3): a frame of 16,000 bytes whose 11th is not UTF-8 is refused at that byte. A frame
    // that is here whole is checked once unmasked into the message instead (below): one pass.
    const bool text_data =
        !control && (opcode == 0x1 || (opcode == 0x0 && message_type_ == Opcode::text));
    const bool whole_frame = available >= header + length;
    if (text_data && !frame_started_) {
      frame_started_ = true;
      if (opcode == 0x1) utf8_.reset();
    }
    if (text_data && !whole_frame && available > header) {
      const size_t have = available - header;
      if (have > frame_checked_ && !check_utf8(p + header, frame_checked_, have)) {
        return fail(1007, "text message is not UTF-8");
      }
      frame_checked_ = std::max(frame_checked_, have);
    }
    if (!whole_frame) return std::nullopt;
    const size_t checked = frame_checked_;
    frame_started_ = false;
    frame_checked_ = 0;
    const uint8_t* mask = p + header - 4;
    const auto* payload = reinterpret_cast<const char*>(p + header);
    offset_ += header + length;
    auto unmask_into = [&](std::string& out) {
      const size_t start = out.size();
      out.append(payload, length);
      for (size_t i = 0; i < length; ++i) out[start + i] ^= static_cast<char>(mask[i & 3]);
    };
    if (control) {
      std::string body;
      unmask_into(body);
      if (opcode == 0x9) return Incoming{Incoming::Kind::ping, std::move(body), 0};
      if (opcode == 0xA) return Incoming{Incoming::Kind::pong, {}, 0};
      if (body.empty()) return Incoming{Incoming::Kind::close, {}, 1005};
      if (body.size() == 1) return fail(1002, "a close frame with half a code");
      const uint16_t code = (uint16_t(uint8_t(body[0])) << 8) | uint8_t(body[1]);
      if (!known_close_code(code)) return fail(1002, "invalid close code");
      std::string reason = body.substr(2);
      if (!valid_utf8(reason)) return fail(1007, "close reason is not UTF-8");
      return Incoming{Incoming::Kind::close, std::move(reason), code};
    }
    if (opcode != 0x0) message_type_ = static_cast<Opcode>(opcode);
    const size_t frame_start = message_.size();
    unmask_into(message_);
    // The bytes not checked while the frame was partial (all of them when it came whole).
    if (text_data && !utf8_.feed(std::string_view(message_).substr(
                         frame_start + std::min<size_t>(checked, length)))) {
      return fail(1007, "text message is not UTF-8");
    }
    const bool text = *message_type_ == Opcode::text;
    if (!fin) continue;
    message_type_.reset();
    std::string whole = std::move(message_);
    message_.clear();
    if (text && !utf8_.complete()) return fail(1007, "text message ends inside a character");
    return Incoming{text ? Incoming::Kind::text : Incoming::Kind::binary, std::move(whole), 0};
  }
}

}  // namespace outlive::ws
