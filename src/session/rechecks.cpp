#include "session/rechecks.hpp"

#include "db/pool.hpp"
#include "session/context.hpp"

namespace outlive::session {
namespace {

auth::Resolution failed_resolution(std::string why) {
  auth::Resolution r;
  r.failure = std::move(why);
  return r;
}

}  // namespace

void Rechecks::add(const std::shared_ptr<Recheckable>& socket) {
  const size_t i = socket->io_index();
  auto& pending = pending_[i];
  // The first of a loop iteration posts the flush: it runs once the handler that fired this
  // deadline (and the others of its slot) has returned.
  if (pending.empty()) boost::asio::post(context_.io.at(i), [this, i] { flush(i); });
  pending.push_back(Due{socket, socket->credential()});
}

void Rechecks::flush(size_t io_index) {
  auto all = std::move(pending_[io_index]);
  pending_[io_index].clear();
  for (size_t from = 0; from < all.size(); from += kBatch) {
    const size_t to = std::min(all.size(), from + kBatch);
    run(io_index, std::vector<Due>(std::make_move_iterator(all.begin() + from),
                                   std::make_move_iterator(all.begin() + to)));
  }
}

void Rechecks::run(size_t io_index, std::vector<Due> batch) {
  auto due = std::make_shared<std::vector<Due>>(std::move(batch));
  Context& context = context_;
  const bool queued = context.services.pool->post(
      [&context, io_index, due](db::Connection& conn) {
        std::vector<auth::Credential> credentials;
        credentials.reserve(due->size());
        for (const auto& d : *due) credentials.push_back(d.credential);
        std::vector<auth::Resolution> answers;
        const auto failed = [&] {
          for (const auto& a : answers) {
            if (!a.failure.empty()) return true;
          }
          return false;
        };
        try {
          answers = context.services.authenticator->resolve_all(conn, credentials);
          // A connection that died with its server (a restart) costs no socket: the batch is
          // asked once more on a fresh one (issue 47).
          if (failed() && db::reopen_if_lost(conn))
            answers = context.services.authenticator->resolve_all(conn, credentials);
        } catch (const std::exception& e) {  // resolve_all answers each; this is its allocation
          answers.assign(due->size(), failed_resolution(e.what()));
        }
        context.post_from_worker(context.io.at(io_index).get_executor(),
                                 [due, answers = std::move(answers)] {
                                   for (size_t i = 0; i < due->size(); ++i) {
                                     if (auto s = (*due)[i].socket.lock())
                                       s->on_recheck(answers[i]);
                                   }
                                 });
      },
      [due] {
        for (const auto& d : *due) {
          auto s = d.socket.lock();
          if (s && !s->closed()) return true;
        }
        return false;
      });
  if (queued) {
    if (context.recheck_batches) ++*context.recheck_batches;
    return;
  }
  const auth::Resolution full = failed_resolution("the database pool has no room");
  for (const auto& d : *due) {
    if (auto s = d.socket.lock()) s->on_recheck(full);
  }
}

}  // namespace outlive::session
