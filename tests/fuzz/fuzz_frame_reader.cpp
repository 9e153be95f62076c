// FrameReader (src/ws/framing) on arbitrary bytes from a tab. The first byte says how the rest is
// cut into the pieces a socket would deliver, and which message limit applies; the events must
// not depend on the cut, nothing may follow a failure, and every message keeps within its limits.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "tab/protocol.hpp"
#include "ws/framing.hpp"

using outlive::ws::FrameReader;
using outlive::ws::Incoming;

namespace {

void require(bool condition) {
  if (!condition) std::abort();
}

bool known_close_code(uint16_t code) {
  return code == 1005 || (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1014) ||
         (code >= 3000 && code <= 4999);
}

// Feeds `bytes` in pieces of `piece` bytes, taking every event after each piece.
std::vector<Incoming> read_in_pieces(const uint8_t* bytes, size_t size, size_t piece,
                                     size_t limit) {
  FrameReader reader(limit);
  std::vector<Incoming> events;
  bool failed = false;
  for (size_t at = 0; at < size; at += piece) {
    const size_t n = std::min(piece, size - at);
    reader.feed(reinterpret_cast<const char*>(bytes + at), n);
    while (auto in = reader.next()) {
      require(!failed);
      switch (in->kind) {
        case Incoming::Kind::text:
          require(in->payload.size() <= limit);
          require(outlive::ws::valid_utf8(in->payload));
          break;
        case Incoming::Kind::binary:
          require(in->payload.size() <= limit);
          break;
        case Incoming::Kind::ping:
          require(in->payload.size() <= 125);
          break;
        case Incoming::Kind::pong:
          require(in->payload.empty());
          break;
        case Incoming::Kind::close:
          require(in->payload.size() <= 123);
          require(outlive::ws::valid_utf8(in->payload));
          require(known_close_code(in->code));
          break;
        case Incoming::Kind::failure:
          require(in->code == 1002 || in->code == 1007 || in->code == 1009);
          failed = true;
          break;
      }
      events.push_back(std::move(*in));
    }
    if (failed) require(reader.buffered() == 0);
  }
  require(!reader.next());
  return events;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = (data[0] & 0x7F) + 1;
  // A small limit half of the time, so that short inputs reach the 1009 paths too.
  const size_t limit = (data[0] & 0x80) ? 64 : outlive::tab::kMaxMessageBytes;
  ++data;
  --size;
  const auto pieces = read_in_pieces(data, size, piece, limit);
  const auto whole = read_in_pieces(data, size, size == 0 ? 1 : size, limit);
  require(pieces.size() == whole.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    require(pieces[i].kind == whole[i].kind);
    require(pieces[i].code == whole[i].code);
    require(pieces[i].payload == whole[i].payload);
  }
  return 0;
}
