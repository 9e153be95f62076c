// The NATS client protocol as bytes (src/topic/wire): the server's operations parsed from any
// split of its stream, the limits, what a client sends. Hermetic.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "topic/wire.hpp"

using namespace outlive::topic::wire;

namespace {

// What one op says, as owned strings (the parser's views end with its callback).
struct Seen {
  Op op;
  std::string text, subject, reply, headers, payload, status_text;
  uint64_t sid;
  int status;
  bool operator==(const Seen& o) const {
    return op == o.op && text == o.text && subject == o.subject && reply == o.reply &&
           headers == o.headers && payload == o.payload && status_text == o.status_text &&
           sid == o.sid && status == o.status;
  }
};

std::vector<Seen> parse_in_pieces(const std::string& bytes, size_t piece, Parser parser = Parser{}) {
  std::vector<Seen> seen;
  for (size_t at = 0; at < bytes.size(); at += piece) {
    parser.feed(std::string_view(bytes).substr(at, piece), [&](const ServerOp& o) {
      seen.push_back(Seen{o.op, std::string(o.text), std::string(o.subject), std::string(o.reply),
                          std::string(o.headers), std::string(o.payload),
                          std::string(o.status_text), o.sid, o.status});
    });
  }
  return seen;
}

const std::string kStream =
    "INFO {\"server_id\":\"x\",\"headers\":true,\"max_payload\":1048576}\r\n"
    "PING\r\n"
    "+OK\r\n"
    "MSG _INBOX.a.7 1 38\r\n{\"stream\":\"CLOUD_LIVE_app\",\"seq\":12}\r\n\r\n"
    "MSG cloud:live:app 2 _INBOX.r 7\r\nab\r\ncd\r\r\n"
    "HMSG _INBOX.a.8 1 16 16\r\nNATS/1.0 503\r\n\r\n\r\n"
    "HMSG $JS.x 3 $JS.ACK.S.C.1.5.1.0.0 36 39\r\nNATS/1.0\r\nNats-Msg-Id: u-1\r\nX: y\r\n\r\nabc\r\n"
    "PONG\r\n"
    "-ERR 'Authorization Violation'\r\n";

}  // namespace

TEST_CASE("nats wire: every operation a server sends, whatever pieces it arrives in") {
  const auto whole = parse_in_pieces(kStream, kStream.size());
  REQUIRE(whole.size() == 9);
  CHECK(whole[0].op == Op::info);
  CHECK(whole[0].text == "{\"server_id\":\"x\",\"headers\":true,\"max_payload\":1048576}");
  CHECK(whole[1].op == Op::ping);
  CHECK(whole[2].op == Op::ok);
  CHECK(whole[3].op == Op::msg);
  CHECK(whole[3].subject == "_INBOX.a.7");
  CHECK(whole[3].sid == 1);
  CHECK(whole[3].reply.empty());
  CHECK(whole[3].payload == "{\"stream\":\"CLOUD_LIVE_app\",\"seq\":12}\r\n");
  // A payload may hold CR LF: its size, not a line end, says where it stops.
  CHECK(whole[4].reply == "_INBOX.r");
  CHECK(whole[4].payload == "ab\r\ncd\r");
  CHECK(whole[5].status == 503);  // no responders: no stream listens on the subject
  CHECK(whole[5].payload.empty());
  CHECK(whole[6].reply == "$JS.ACK.S.C.1.5.1.0.0");
  CHECK(whole[6].payload == "abc");
  CHECK(whole[6].status == 0);
  CHECK(header_value(whole[6].headers, "nats-msg-id") == std::optional<std::string_view>("u-1"));
  CHECK(header_value(whole[6].headers, "X") == std::optional<std::string_view>("y"));
  CHECK_FALSE(header_value(whole[6].headers, "Nats-Msg").has_value());
  CHECK(whole[7].op == Op::pong);
  CHECK(whole[8].op == Op::err);
  CHECK(whole[8].text == "Authorization Violation");
  for (size_t piece = 1; piece < 24; ++piece) {
    INFO("pieces of " << piece << " bytes");
    CHECK(parse_in_pieces(kStream, piece) == whole);
  }
}

TEST_CASE("nats wire: a status line's code and description") {
  const std::string bytes = "HMSG _INBOX.p 1 32 32\r\nNATS/1.0 408 Request Timeout\r\n\r\n\r\n";
  const auto seen = parse_in_pieces(bytes, bytes.size());
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].status == 408);
  CHECK(seen[0].status_text == "Request Timeout");
}

TEST_CASE("nats wire: what a server does not send is refused") {
  const auto refuses = [](const std::string& bytes, Limits limits = {}) {
    Parser parser(limits);
    CHECK_THROWS_AS(parser.feed(bytes, [](const ServerOp&) {}), ProtocolError);
  };
  refuses("HELLO\r\n");
  refuses("MSG a 1\r\n");                   // no size
  refuses("MSG a x 3\r\nabc\r\n");          // a sid that is not a number
  refuses("MSG a 1 -3\r\n");                // nor a size
  refuses("MSG a 1 b c 3\r\nabc\r\n");      // too many arguments
  refuses("MSG a 1 3\r\nabcXY");            // no CRLF after the payload
  refuses("HMSG a 1 9 3\r\nabc\r\n");       // headers larger than the message
  refuses("HMSG a 1 3 3\r\nabc\r\n");       // a header block without NATS/
  refuses("INFO{}\r\n");                    // an op glued to its argument
  // The limits, on each side.
  Limits small;
  small.max_control_line = 16;
  small.max_payload = 4;
  Parser ok(small);
  int ops = 0;
  ok.feed("MSG abcdef 1 4\r\n" "abcd\r\n", [&](const ServerOp&) { ++ops; });  // a 14-byte line, 4 bytes
  CHECK(ops == 1);
  refuses("MSG abcdefgh 12 4\r\nabcd\r\n", small);  // a 17-byte control line
  refuses("MSG a 1 5\r\nabcde\r\n", small);        // a payload past max_payload
  refuses(std::string(17, 'P'), small);            // 17 bytes and still no line end
  // A 16-byte line whose CRLF is cut in two is still within the limit.
  Parser cut(small);
  int cut_ops = 0;
  cut.feed("MSG abcdefgh 1 4\r", [&](const ServerOp&) { ++cut_ops; });
  cut.feed("\nabcd\r\n", [&](const ServerOp&) { ++cut_ops; });
  CHECK(cut_ops == 1);
  Parser waiting(small);
  waiting.feed(std::string(16, 'P'), [](const ServerOp&) {});  // 16 bytes may still end well
  CHECK(waiting.buffered() == 16);
}

TEST_CASE("nats wire: an op the callback throws on stays in the buffer, those before it do not") {
  Parser parser;
  int calls = 0;
  const auto throw_on_second = [&](const ServerOp&) {
    if (++calls == 2) throw std::runtime_error("stop");
  };
  CHECK_THROWS(parser.feed("PING\r\nPONG\r\n", throw_on_second));
  CHECK(parser.buffered() == 6);  // "PONG\r\n"
  std::vector<Op> after;
  parser.feed("", [&](const ServerOp& o) { after.push_back(o.op); });
  CHECK(after == std::vector<Op>{Op::pong});
}

TEST_CASE("nats wire: what a client sends") {
  std::string out;
  append_connect(out, R"({"verbose":false,"headers":true})");
  append_sub(out, "_INBOX.x.*", 1);
  append_publish(out, "cloud:live:app", "", {}, "{}");
  append_publish(out, "cloud:live:app", "_INBOX.x.7", {{"Nats-Msg-Id", "u-7"}, {"Outlive-Created-At", "12"}},
                 "{\"v\":1}");
  append_unsub(out, 1);
  append_ping(out);
  append_pong(out);
  const std::string hdr = "NATS/1.0\r\nNats-Msg-Id: u-7\r\nOutlive-Created-At: 12\r\n\r\n";
  CHECK(out ==
        "CONNECT {\"verbose\":false,\"headers\":true}\r\n"
        "SUB _INBOX.x.* 1\r\n"
        "PUB cloud:live:app 2\r\n{}\r\n"
        "HPUB cloud:live:app _INBOX.x.7 " + std::to_string(hdr.size()) + " " +
            std::to_string(hdr.size() + 7) + "\r\n" + hdr + "{\"v\":1}\r\n"
        "UNSUB 1\r\nPING\r\nPONG\r\n");
  // What the server would deliver of that HPUB parses back to the same parts.
  Parser parser;
  std::string payload, id;
  parser.feed("HMSG cloud:live:app 9 _INBOX.x.7 " + std::to_string(hdr.size()) + " " +
                  std::to_string(hdr.size() + 7) + "\r\n" + hdr + "{\"v\":1}\r\n",
              [&](const ServerOp& o) {
                payload = o.payload;
                id = std::string(header_value(o.headers, "Nats-Msg-Id").value_or(""));
              });
  CHECK(payload == "{\"v\":1}");
  CHECK(id == "u-7");
}

TEST_CASE("nats wire: a subject, reply or header that would break the protocol is refused") {
  std::string out;
  CHECK_THROWS_AS(append_publish(out, "", "", {}, "x"), std::invalid_argument);
  CHECK_THROWS_AS(append_publish(out, "a b", "", {}, "x"), std::invalid_argument);
  CHECK_THROWS_AS(append_publish(out, "a", "r\r\n", {}, "x"), std::invalid_argument);
  CHECK_THROWS_AS(append_publish(out, "a", "", {{"K", "v\r\nInjected: 1"}}, "x"), std::invalid_argument);
  CHECK_THROWS_AS(append_publish(out, "a", "", {{"K:", "v"}}, "x"), std::invalid_argument);
  CHECK_THROWS_AS(append_sub(out, "a\tb", 1), std::invalid_argument);
  CHECK(out.empty());
}
