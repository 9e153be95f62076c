#pragma once
// The read side of a websocket connection, pure (bytes in, what to do out): it assembles the tab's
// frames (ws::FrameReader, messages up to 16 KiB), keeps at most max_waiting_messages for the
// protocol, holds the bytes the tab wrote behind its upgrade request until it is served, and says
// when the socket is not to be read: a full inbox, or read_pause_bytes waiting to be sent (SPEC 5.7
// rev 3). The connection reads the socket, feeds the bytes here and acts on what take() reports.
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "ws/fifo.hpp"
#include "ws/framing.hpp"
#include "ws/liveness.hpp"

namespace outlive::ws {

class ReadSide {
 public:
  static constexpr size_t kMaxMessageBytes = 16 * 1024;  // SPEC 5.7: beyond it, close 1009
  // `settings` outlive the read side (the connection's).
  explicit ReadSide(const ConnectionSettings& settings)
      : settings_(settings), reader_(kMaxMessageBytes) {}

  // Bytes read with the upgrade request (a client that does not wait for the 101): they come
  // before anything read later, so the socket is not read while they are held.
  void hold_early(std::string early);
  // The tab is served: feeds the held bytes (with every limit of later ones). False when none.
  bool feed_early();
  void feed(const char* data, size_t size) { reader_.feed(data, size); }

  // Takes frames while there is room: messages go to the inbox, pongs need nothing. Returns the
  // next frame the connection acts on: a ping (answer with a pong carrying its payload), a close
  // (the tab closes with its code), a failure (close with its code; nothing more is read). Nullopt
  // when more bytes are needed or there is no room with `queued_bytes` waiting to be sent.
  std::optional<Incoming> take(size_t queued_bytes);
  // Room for another frame: after closing always (the close handshake is read), else below
  // read_pause_bytes queued (at or past it reading pauses until resume_due()) and an inbox not
  // full.
  bool room(size_t queued_bytes);
  // Reading paused on the send queue and `queued_bytes` fell to half: true once, and unpaused.
  bool resume_due(size_t queued_bytes);
  void unpause() { paused_ = false; }

  // The socket may be read: no early bytes held, and the tab did not break the protocol.
  bool readable() const { return !early_ && !failed_; }
  bool failed() const { return failed_; }
  bool waiting() const { return !inbox_.empty(); }
  // The next message the tab sent (nullopt inside: a binary message); nullopt when none waits.
  std::optional<std::optional<std::string>> next_message();
  // Closing began: early bytes are dropped unparsed (the tab could not know whether it would be
  // served), waiting messages are not acted on, and later ones are discarded.
  void close();

 private:
  const ConnectionSettings& settings_;
  FrameReader reader_;
  std::unique_ptr<std::string> early_;  // until feed_early() (heap: most tabs wait for the 101)
  Fifo<std::optional<std::string>> inbox_;
  bool paused_ = false;  // too much waits to be sent: not read until it left (resume_due)
  bool failed_ = false;  // the tab broke the protocol: nothing more is read
  bool closed_ = false;
};

}  // namespace outlive::ws
