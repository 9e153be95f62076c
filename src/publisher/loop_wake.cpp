#include "publisher/loop_wake.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <limits>

#include "common/log.hpp"
#include "outbox/partitions.hpp"

namespace outlive::publisher {

LoopWake::LoopWake(std::string database_url, const Clock& clock)
    : url_(std::move(database_url)),
      clock_(clock),
      event_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

LoopWake::~LoopWake() {
  close();
  ::close(event_fd_);
}

void LoopWake::signal() {
  const uint64_t one = 1;
  [[maybe_unused]] const auto n = ::write(event_fd_, &one, sizeof one);
}

bool LoopWake::listen() {
  if (conn_ || clock_.now() < next_attempt_) return false;
  next_attempt_ = clock_.now() + std::chrono::seconds(1);
  try {
    conn_ = std::make_unique<outbox::WakeConnection>(url_);
    slot_.set(conn_->socket());
    outage_.succeeded();
    return true;
  } catch (const std::exception& e) {
    outage_.failed(std::string("cannot connect: ") + e.what());
    return false;
  }
}

int LoopWake::poll_timeout_ms(Clock::duration timeout) {
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(timeout).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, std::numeric_limits<int>::max()));
}

std::vector<std::string> LoopWake::wait(Clock::duration timeout) {
  pollfd fds[2] = {{event_fd_, POLLIN, 0}, {conn_ ? conn_->socket() : -1, POLLIN, 0}};
  if (::poll(fds, 2, poll_timeout_ms(timeout)) <= 0) return {};
  if (fds[0].revents & POLLIN) {
    uint64_t count = 0;
    [[maybe_unused]] const auto n = ::read(event_fd_, &count, sizeof count);
  }
  if (!conn_ || fds[1].revents == 0) return {};
  try {
    return conn_->take();
  } catch (const std::exception& e) {
    outage_.failed(std::string("lost its connection: ") + e.what());
    close();
    return {};
  }
}

void LoopWake::close() {
  slot_.clear();
  conn_.reset();
}

}  // namespace outlive::publisher
