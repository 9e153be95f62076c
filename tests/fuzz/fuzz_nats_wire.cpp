// topic::wire::Parser (src/topic/wire) on arbitrary bytes from a NATS server (or whatever answers
// in its place): it returns operations or throws ProtocolError, nothing else, and the first byte
// splits the rest in two pieces that must parse exactly as the whole does.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "topic/wire.hpp"

using namespace outlive::topic::wire;

namespace {

void require(bool condition) {
  if (!condition) std::abort();
}

// The ops of `bytes` fed in the given pieces, flattened to text; false when the parser refused.
bool parse(const std::vector<std::string_view>& pieces, std::string& out) {
  Limits limits;
  limits.max_control_line = 256;
  limits.max_payload = 4096;
  Parser parser(limits);
  try {
    for (const auto piece : pieces) {
      parser.feed(piece, [&](const ServerOp& op) {
        require(op.payload.size() <= limits.max_payload);
        require(op.headers.size() <= limits.max_payload);
        out += std::to_string(static_cast<int>(op.op)) + '|' + std::string(op.text) + '|' +
               std::string(op.subject) + '|' + std::to_string(op.sid) + '|' +
               std::string(op.reply) + '|' + std::to_string(op.status) + '|' +
               std::string(op.status_text) + '|' + std::string(op.headers) + '|' +
               std::string(op.payload) + '\n';
        if (!op.headers.empty()) (void)header_value(op.headers, "Nats-Msg-Id");
      });
    }
  } catch (const ProtocolError&) {
    return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t split = bytes.empty() ? 0 : data[0] % (bytes.size() + 1);
  std::string whole, pieces;
  const bool whole_ok = parse({bytes}, whole);
  const bool pieces_ok = parse({bytes.substr(0, split), bytes.substr(split)}, pieces);
  if (whole_ok) require(pieces_ok && pieces == whole);
  return 0;
}
