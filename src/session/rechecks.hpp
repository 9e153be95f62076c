#pragma once
// Credential re-checks (SPEC: every 60 s per socket) of the sockets of one io thread that fall due
// together, run as one pool task whose queries go out in one round trip per statement
// (auth::Authenticator::resolve_all), their answers handed back in one post. A re-check alone cost
// a pool hand-off, a blocking round trip and a wake-up of each thread: ~85 us of replica CPU, most
// of it context switches, about as much as the 5,000 frames it sat beside at 1 update/s.
// Sockets opened together (a deploy, the bench's 5,000) fall due together: the deadline wheel
// fires their far deadlines in one slot, so a batch forms without waiting for one.
#include <cstddef>
#include <memory>
#include <vector>

#include "auth/auth.hpp"

namespace outlive::session {

struct Context;

// A socket as its re-checks see it (session::Session). Rechecks holds it weakly: a socket gone
// before its answer came is not answered.
class Recheckable {
 public:
  virtual size_t io_index() const = 0;  // the io thread it lives on, where its answer is posted
  virtual const auth::Credential& credential() const = 0;
  // From a pool worker: a batch whose sockets all closed is dropped.
  virtual bool closed() const = 0;
  // The answer, on the socket's io thread.
  virtual void on_recheck(const auth::Resolution& answer) = 0;

 protected:
  ~Recheckable() = default;
};

class Rechecks {
 public:
  // At most this many credentials per pool task: a batch's round trip stays short, and a burst
  // spreads over the pool's workers.
  static constexpr size_t kBatch = 64;

  Rechecks(Context& context, size_t io_threads) : context_(context), pending_(io_threads) {}

  // On the socket's io thread: check its credential again; the answer comes back through
  // on_recheck() on that thread (a full pool answers at once, as a failure). What does not answer
  // is the socket's to time out.
  void add(const std::shared_ptr<Recheckable>& socket);

 private:
  struct Due {
    std::weak_ptr<Recheckable> socket;
    auth::Credential credential;
  };
  void flush(size_t io_index);
  void run(size_t io_index, std::vector<Due> batch);

  Context& context_;
  std::vector<std::vector<Due>> pending_;  // per io thread, touched on that thread only
};

}  // namespace outlive::session
