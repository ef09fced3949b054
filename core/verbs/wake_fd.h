// An eventfd that ends a reader thread's poll(2) as soon as its owner stops it, so the thread
// can wait for its fd without waking up every few ms to look at a stop flag (in a TCG guest
// each wake-up costs about 0.4 ms of a vCPU).
#pragma once

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "rdmalab/error.h"

namespace rdmalab::verbs {

class WakeFd {
 public:
  WakeFd() : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (fd_ < 0) throw Error("eventfd", errno, "a reader thread's wake-up");
  }
  ~WakeFd() { ::close(fd_); }
  WakeFd(const WakeFd&) = delete;
  WakeFd& operator=(const WakeFd&) = delete;

  // What a reader thread's wait for its fd ended with.
  enum class Ready { kReadable, kGone, kNothing };  // kNothing: woken, timed out or EINTR

  // Waits until fd is readable or gone, or wake() came (a 1-s timeout as a safety net only).
  Ready wait_readable(int fd) const {
    pollfd pfd[2] = {{fd, POLLIN, 0}, {fd_, POLLIN, 0}};
    if (poll(pfd, 2, kBackstopMs) <= 0) return Ready::kNothing;
    if (pfd[0].revents & (POLLNVAL | POLLERR | POLLHUP)) return Ready::kGone;
    return (pfd[0].revents & POLLIN) != 0 ? Ready::kReadable : Ready::kNothing;
  }

  // Makes the wake-up fd readable for good: every later wait_readable returns at once.
  void wake() const {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(fd_, &one, sizeof one);
  }

 private:
  static constexpr int kBackstopMs = 1000;
  int fd_;
};

}  // namespace rdmalab::verbs
