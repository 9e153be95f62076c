#include "session/checks.hpp"

#include <boost/asio/steady_timer.hpp>
#include <utility>

#include "db/pool.hpp"
#include "session/context.hpp"

namespace outlive::session {

namespace net = boost::asio;
using json = nlohmann::json;
using error_code = boost::system::error_code;

void Checks::run(std::function<json(db::Connection&)> work, Then then) {
  run_async(
      [this, work = std::move(work)](Reply reply) {
        std::weak_ptr<void> weak = socket_.keep_alive();
        CheckedSocket& socket = socket_;
        const bool queued = context_.services.pool->post(
            [work, reply](db::Connection& conn) {
              json result;
              std::string failure;
              for (bool again = true;;) {
                try {
                  result = work(conn);
                } catch (const std::exception& e) {
                  // A connection that died with its server (a restart) fails no check: the
                  // check runs once more on a fresh one (issue 47).
                  if (std::exchange(again, false) && db::reopen_if_lost(conn, &e)) continue;
                  failure = e.what();
                  if (failure.empty()) failure = "check failed";
                }
                break;
              }
              reply(std::move(result), std::move(failure));
            },
            [weak, &socket] {
              auto alive = weak.lock();
              return alive && !socket.closed();
            });
        if (!queued) reply(nullptr, "the database pool has no room");
      },
      std::move(then));
}

void Checks::run_async(std::function<void(Reply)> start, Then then) {
  struct State {
    explicit State(net::any_io_executor ex) : deadline(ex) {}
    net::steady_timer deadline;
    bool done = false;
  };
  auto state = std::make_shared<State>(socket_.executor());
  // `keep` holds the socket, and so these checks, until the check answered or timed out.
  auto keep = socket_.keep_alive();
  state->deadline.expires_after(context_.settings.check_timeout);
  state->deadline.async_wait([this, keep, state](error_code ec) {
    if (ec || state->done || socket_.closing()) return;
    state->done = true;
    socket_.check_timed_out();
  });
  auto finish = [this, keep, state, then = std::move(then)](json result, std::string failure) {
    if (state->done || socket_.closing()) return;
    state->done = true;
    state->deadline.cancel();
    if (!failure.empty()) return socket_.check_failed(failure);
    then(result);
  };
  start([this, keep, finish](json result, std::string failure) {
    context_.post_from_worker(socket_.executor(), [finish, result = std::move(result),
                                                   failure = std::move(failure)]() mutable {
      finish(std::move(result), std::move(failure));
    });
  });
}

}  // namespace outlive::session
