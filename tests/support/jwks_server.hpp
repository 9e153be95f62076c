#pragma once
// A JWKS endpoint for tests (SPEC 5.1 rev 4): HTTP/1.1 on 127.0.0.1 with a free port, on a thread
// of its own. The test changes what it answers (the document and its Cache-Control, a status such
// as 500, or no answer at all), and counts and awaits its requests.
#include <chrono>
#include <memory>
#include <string>

namespace outlive::testing {

class JwksServer {
 public:
  JwksServer();  // listening once constructed
  ~JwksServer();
  JwksServer(const JwksServer&) = delete;
  JwksServer& operator=(const JwksServer&) = delete;

  // http://127.0.0.1:<port>/.well-known/jwks.json
  std::string url() const;
  int port() const;

  // What a GET is answered from now on. `cache_control` empty: no Cache-Control header.
  void set_document(std::string body, std::string cache_control = "");
  void set_status(int status);  // 200 until changed
  // Hanging: requests are read and counted, and never answered (the connection stays open).
  void set_hang(bool hang);

  // Requests read so far.
  int requests() const;
  // Whether requests() reached `n` within `timeout`.
  bool wait_for_requests(int n, std::chrono::milliseconds timeout) const;

  // Closes the listener and every connection: a later connect is refused.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outlive::testing
