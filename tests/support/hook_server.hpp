#pragma once
// The application's hook endpoint for tests (SPEC 5.1, 5.4 rev 4): HTTP/1.1 with keep-alive on
// 127.0.0.1 with a free port, a thread per connection (so one slow answer holds only its own
// connection, as a real application server's would). The test's handler answers each POST; the
// server checks Outlive-Signature with its secret first and answers 401 when it does not match.
#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace outlive::testing {

class HookServer {
 public:
  struct Request {
    std::string target;
    std::string body;
    std::string signature;  // the Outlive-Signature header
  };
  struct Answer {
    int status = 200;
    std::string body;
    std::chrono::milliseconds delay{0};  // before answering
    bool hang = false;                   // never answer (the connection stays open)
    bool close = false;                  // close the connection without answering
  };
  using Handler = std::function<Answer(const Request&)>;

  // Listening once constructed. `secret` is what signatures are checked with. With `tls_cert` and
  // `tls_key` (PEM files) it speaks https.
  HookServer(std::string secret, Handler handler, std::string tls_cert = {}, std::string tls_key = {});
  ~HookServer();  // stop()
  HookServer(const HookServer&) = delete;
  HookServer& operator=(const HookServer&) = delete;

  std::string url(const std::string& path = "/outlive/hooks") const;  // http:// or https://
  int port() const;

  int connections() const;  // accepted so far
  int requests() const;     // read so far
  int bad_signatures() const;  // answered 401
  bool wait_for_requests(int n, std::chrono::milliseconds timeout) const;

  // Closes the listener and every connection; hanging answers end.
  void stop();

  // Checks an Outlive-Signature value as an application must (SPEC 5.1: the HMAC and a t at most 5
  // minutes old): empty when valid, else why not.
  static std::string check_signature(const std::string& header, const std::string& body,
                                     const std::string& secret);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outlive::testing
