#include "topic/wire.hpp"

#include <algorithm>
#include <charconv>

namespace outlive::topic::wire {

namespace {

constexpr std::string_view kCrlf = "\r\n";

bool is_space(char c) { return c == ' ' || c == '\t'; }

// The line's space-separated arguments (NATS allows runs of spaces and tabs between them).
std::vector<std::string_view> split_args(std::string_view line) {
  std::vector<std::string_view> args;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && is_space(line[i])) ++i;
    const size_t start = i;
    while (i < line.size() && !is_space(line[i])) ++i;
    if (i > start) args.push_back(line.substr(start, i - start));
  }
  return args;
}

uint64_t number(std::string_view text, const char* what) {
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    throw ProtocolError(std::string("NATS protocol: ") + what + " is not a number: " +
                        std::string(text.substr(0, 32)));
  return value;
}

char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + ('a' - 'A')) : c; }

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return ascii_lower(x) == ascii_lower(y);
         });
}

// Operation names are case-insensitive, and one is followed by whitespace or ends the line.
bool starts_with_op(std::string_view line, std::string_view op) {
  if (line.size() < op.size() || !iequals(line.substr(0, op.size()), op)) return false;
  return line.size() == op.size() || is_space(line[op.size()]);
}

void parse_status(std::string_view headers, ServerOp& op) {
  // "NATS/1.0" [SP status [SP description]] CRLF
  const std::string_view first = headers.substr(0, headers.find(kCrlf));
  if (first.rfind("NATS/", 0) != 0)
    throw ProtocolError("NATS protocol: a header block that does not start with NATS/");
  const auto args = split_args(first);
  if (args.size() >= 2) {
    op.status = static_cast<int>(number(args[1], "a header status"));
    const size_t at = static_cast<size_t>(args[1].data() - first.data()) + args[1].size();
    std::string_view rest = first.substr(at);
    while (!rest.empty() && is_space(rest.front())) rest.remove_prefix(1);
    op.status_text = rest;
  }
}

void check_token(std::string_view token, const char* what, bool may_be_empty) {
  if (token.empty() && !may_be_empty) throw std::invalid_argument(std::string(what) + " is empty");
  if (std::any_of(token.begin(), token.end(),
                  [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }))
    throw std::invalid_argument(std::string(what) + " holds whitespace: " + std::string(token));
}

void check_header_part(std::string_view text, const char* what) {
  if (text.find_first_of("\r\n") != std::string_view::npos)
    throw std::invalid_argument(std::string(what) + " holds CR or LF");
}

void append_number(std::string& out, uint64_t n) {
  char digits[24];
  const auto end = std::to_chars(digits, digits + sizeof digits, n).ptr;
  out.append(digits, end);
}

}  // namespace

size_t Parser::next(std::string_view in, ServerOp& op) const {
  const size_t eol = in.find(kCrlf);
  if (eol == std::string_view::npos) {
    // A control line must end within the limit (a CR at the end may be its CRLF's first half).
    if (in.size() - (in.empty() || in.back() != '\r' ? 0 : 1) > limits_.max_control_line)
      throw ProtocolError("NATS protocol: a control line longer than " +
                          std::to_string(limits_.max_control_line) + " bytes");
    return 0;
  }
  if (eol > limits_.max_control_line)
    throw ProtocolError("NATS protocol: a control line longer than " +
                        std::to_string(limits_.max_control_line) + " bytes");
  const std::string_view line = in.substr(0, eol);
  const size_t after_line = eol + kCrlf.size();
  op = ServerOp{};
  const bool headers = starts_with_op(line, "HMSG");
  if (headers || starts_with_op(line, "MSG")) {
    // MSG <subject> <sid> [reply] <size>; HMSG <subject> <sid> [reply] <header size> <size>
    const auto args = split_args(line);
    const size_t fixed = headers ? 5 : 4;  // with the op, without a reply
    if (args.size() != fixed && args.size() != fixed + 1)
      throw ProtocolError("NATS protocol: a malformed " + std::string(args[0]) + " line");
    op.op = Op::msg;
    op.subject = args[1];
    op.sid = number(args[2], "a subscription id");
    if (args.size() == fixed + 1) op.reply = args[3];
    const uint64_t total = number(args.back(), "a message size");
    const uint64_t header_size = headers ? number(args[args.size() - 2], "a header size") : 0;
    if (total > limits_.max_payload)
      throw ProtocolError("NATS protocol: a message of " + std::to_string(total) +
                          " bytes, past the limit");
    if (header_size > total)
      throw ProtocolError("NATS protocol: headers larger than their message");
    if (in.size() < after_line + total + kCrlf.size()) return 0;
    if (in.substr(after_line + total, kCrlf.size()) != kCrlf)
      throw ProtocolError("NATS protocol: a message not followed by CRLF");
    const std::string_view body = in.substr(after_line, total);
    if (headers) {
      op.headers = body.substr(0, header_size);
      parse_status(op.headers, op);
    }
    op.payload = body.substr(header_size);
    return after_line + total + kCrlf.size();
  }
  if (starts_with_op(line, "PING")) {
    op.op = Op::ping;
  } else if (starts_with_op(line, "PONG")) {
    op.op = Op::pong;
  } else if (starts_with_op(line, "+OK")) {
    op.op = Op::ok;
  } else if (starts_with_op(line, "-ERR")) {
    op.op = Op::err;
    std::string_view text = line.substr(4);
    while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
    if (text.size() >= 2 && text.front() == '\'' && text.back() == '\'')
      text = text.substr(1, text.size() - 2);
    op.text = text;
  } else if (starts_with_op(line, "INFO")) {
    op.op = Op::info;
    std::string_view text = line.substr(4);
    while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
    op.text = text;
  } else {
    throw ProtocolError("NATS protocol: an unknown operation: " + std::string(line.substr(0, 32)));
  }
  return after_line;
}

std::optional<std::string_view> header_value(std::string_view headers, std::string_view name) {
  size_t pos = headers.find(kCrlf);  // past "NATS/1.0 ..."
  while (pos != std::string_view::npos) {
    pos += kCrlf.size();
    const size_t end = headers.find(kCrlf, pos);
    const std::string_view line =
        headers.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos);
    const size_t colon = line.find(':');
    if (colon != std::string_view::npos && iequals(line.substr(0, colon), name)) {
      std::string_view value = line.substr(colon + 1);
      while (!value.empty() && is_space(value.front())) value.remove_prefix(1);
      while (!value.empty() && is_space(value.back())) value.remove_suffix(1);
      return value;
    }
    pos = end;
  }
  return std::nullopt;
}

void append_connect(std::string& out, std::string_view options_json) {
  check_header_part(options_json, "CONNECT options");
  out.append("CONNECT ").append(options_json).append(kCrlf);
}

void append_sub(std::string& out, std::string_view subject, uint64_t sid) {
  check_token(subject, "a subject", false);
  out.append("SUB ").append(subject).push_back(' ');
  append_number(out, sid);
  out.append(kCrlf);
}

void append_unsub(std::string& out, uint64_t sid) {
  out.append("UNSUB ");
  append_number(out, sid);
  out.append(kCrlf);
}

void append_pong(std::string& out) { out.append("PONG\r\n"); }
void append_ping(std::string& out) { out.append("PING\r\n"); }

void append_publish(std::string& out, std::string_view subject, std::string_view reply,
                    const std::vector<std::pair<std::string_view, std::string_view>>& headers,
                    std::string_view payload) {
  check_token(subject, "a subject", false);
  check_token(reply, "a reply subject", true);
  size_t header_size = 0;
  if (!headers.empty()) {
    header_size = std::string_view("NATS/1.0\r\n").size() + kCrlf.size();
    for (const auto& [name, value] : headers) {
      check_header_part(name, "a header name");
      check_header_part(value, "a header value");
      if (name.empty() || name.find(':') != std::string_view::npos)
        throw std::invalid_argument("a header name is empty or holds ':'");
      header_size += name.size() + 2 + value.size() + kCrlf.size();
    }
  }
  out.append(headers.empty() ? "PUB " : "HPUB ").append(subject).push_back(' ');
  if (!reply.empty()) out.append(reply).push_back(' ');
  if (!headers.empty()) {
    append_number(out, header_size);
    out.push_back(' ');
  }
  append_number(out, header_size + payload.size());
  out.append(kCrlf);
  if (!headers.empty()) {
    out.append("NATS/1.0\r\n");
    for (const auto& [name, value] : headers) out.append(name).append(": ").append(value).append(kCrlf);
    out.append(kCrlf);
  }
  out.append(payload).append(kCrlf);
}

}  // namespace outlive::topic::wire
