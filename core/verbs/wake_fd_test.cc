// What a reader thread's wait ends with, on a pipe standing in for the uverbs / rdma_cm fd.
#include "verbs/wake_fd.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>

namespace rdmalab::verbs {
namespace {

struct Pipe {
  Pipe() { EXPECT_EQ(pipe(fds), 0); }
  ~Pipe() {
    for (int fd : fds)
      if (fd >= 0) close(fd);
  }
  int fds[2] = {-1, -1};
};

TEST(WakeFd, ReadableWhenTheFdHasData) {
  WakeFd wake;
  Pipe p;
  ASSERT_EQ(write(p.fds[1], "x", 1), 1);
  EXPECT_EQ(wake.wait_readable(p.fds[0]), WakeFd::Ready::kReadable);
}

TEST(WakeFd, WakeEndsTheWaitAtOnceAndForGood) {
  WakeFd wake;
  Pipe p;
  wake.wake();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(wake.wait_readable(p.fds[0]), WakeFd::Ready::kNothing);
  EXPECT_EQ(wake.wait_readable(p.fds[0]), WakeFd::Ready::kNothing);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
}

TEST(WakeFd, GoneWhenTheOtherEndClosed) {
  WakeFd wake;
  Pipe p;
  close(p.fds[1]);
  p.fds[1] = -1;
  EXPECT_EQ(wake.wait_readable(p.fds[0]), WakeFd::Ready::kGone);
}

}  // namespace
}  // namespace rdmalab::verbs
