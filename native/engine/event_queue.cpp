#include "engine/event_queue.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#if defined(__linux__)
#include <sys/eventfd.h>
#endif

namespace ninfer {

EventQueue::EventQueue() {
#if defined(__linux__)
  read_fd_ = write_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (read_fd_ >= 0) return;
#endif
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error(std::string("event queue: pipe failed: ") + std::strerror(errno));
  for (int fd : fds) {
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  read_fd_ = fds[0];
  write_fd_ = fds[1];
}

EventQueue::~EventQueue() {
  if (write_fd_ != read_fd_ && write_fd_ >= 0) ::close(write_fd_);
  if (read_fd_ >= 0) ::close(read_fd_);
}

void EventQueue::push(std::vector<EngineEvent>&& events) {
  if (events.empty()) return;
  {
    std::lock_guard lock(mu_);
    for (auto& e : events) events_.push_back(std::move(e));
  }
  signal();
}

void EventQueue::push(EngineEvent&& event) {
  {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(event));
  }
  signal();
}

std::vector<EngineEvent> EventQueue::drain() {
  // Clear the readiness first: a push racing with this drain then re-arms the descriptor
  // instead of leaving an event behind with no wake-up.
  clear_signal();
  std::vector<EngineEvent> out;
  std::lock_guard lock(mu_);
  out.swap(events_);
  return out;
}

size_t EventQueue::size() const {
  std::lock_guard lock(mu_);
  return events_.size();
}

void EventQueue::signal() {
  if (write_fd_ == read_fd_) {
    const uint64_t one = 1;
    // EAGAIN only when the counter is saturated, which still leaves it readable.
    [[maybe_unused]] auto n = ::write(write_fd_, &one, sizeof one);
  } else {
    const char byte = 1;
    [[maybe_unused]] auto n = ::write(write_fd_, &byte, 1);  // a full pipe is readable anyway
  }
}

void EventQueue::clear_signal() {
  char buffer[64];
  while (::read(read_fd_, buffer, write_fd_ == read_fd_ ? sizeof(uint64_t) : sizeof buffer) > 0) {
  }
}

}  // namespace ninfer
