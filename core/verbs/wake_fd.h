// An eventfd that ends a reader thread's poll(2) as soon as its owner stops it, so the thread
// can wait for its fd without waking up every few ms to look at a stop flag (in a TCG guest
// each wake-up costs about 0.4 ms of a vCPU).
#pragma once

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

  int fd() const { return fd_; }
  // Makes fd() readable for good: every later poll of it returns at once.
  void wake() const {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(fd_, &one, sizeof one);
  }

 private:
  int fd_;
};

}  // namespace rdmalab::verbs
