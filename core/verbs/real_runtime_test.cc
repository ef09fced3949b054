#include "verbs/real_runtime.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>

#include "rdmalab/error.h"

namespace rdmalab::verbs {
namespace {

TEST(RealRuntime, ClockIsMonotonic) {
  RealRuntime rt;
  const TimeNs a = rt.now_ns();
  rt.sleep_for(2 * kNsPerMs);
  const TimeNs b = rt.now_ns();
  EXPECT_GE(b - a, 2 * kNsPerMs);
}

TEST(RealRuntime, WaitUntilReturnsFalseAtDeadline) {
  RealRuntime rt;
  const TimeNs start = rt.now_ns();
  EXPECT_FALSE(rt.wait_until([] { return false; }, start + 5 * kNsPerMs));
  EXPECT_GE(rt.now_ns() - start, 5 * kNsPerMs);
}

TEST(RealRuntime, WaitUntilTrueAtOnceWhenPredHolds) {
  RealRuntime rt;
  EXPECT_TRUE(rt.wait_until([] { return true; }, rt.now_ns() - 1));
}

TEST(RealRuntime, SpawnedThreadWakesWaiterByNotify) {
  RealRuntime rt;
  std::atomic<bool> flag{false};
  rt.spawn("setter", [&] {
    rt.sleep_for(kNsPerMs);
    flag = true;
    rt.notify_all();
  });
  EXPECT_TRUE(rt.wait_until([&] { return flag.load(); }, rt.now_ns() + 5 * kNsPerSec));
  rt.shutdown();
  EXPECT_TRUE(rt.thread_errors().empty());
}

TEST(RealRuntime, WaiterSeesUnnotifiedChangeWithinPoll) {
  RealRuntime rt;
  std::atomic<bool> flag{false};
  rt.spawn("quiet", [&] { flag = true; });  // never calls notify_all
  EXPECT_TRUE(rt.wait_until([&] { return flag.load(); }, rt.now_ns() + 5 * kNsPerSec));
}

// With the backstop and the deadline at 60 s, only the notify can wake the waiter before 30 s:
// no bound on how fast the machine schedules the two threads (a bound of 50 ms failed under
// ASan with stress-ng and the guests of make test beside it: 212 ms).
TEST(RealRuntime, WaitNotifiedWakesOnNotifyNotByPolling) {
  constexpr TimeNs kLong = 60 * kNsPerSec;
  RealRuntime rt(kLong);
  std::atomic<int> checks{0};
  std::atomic<bool> flag{false};
  rt.spawn("setter", [&] {
    rt.sleep_for(20 * kNsPerMs);
    flag = true;
    rt.notify_all();
  });
  const TimeNs start = rt.now_ns();
  EXPECT_TRUE(rt.wait_notified(
      [&] {
        ++checks;
        return flag.load();
      },
      start + kLong));
  EXPECT_LT(rt.now_ns() - start, kLong / 2);  // the notify woke it
  EXPECT_LE(checks.load(), 3);  // a check before the notify and one after (wait_until: ~20)
  rt.shutdown();
}

TEST(RealRuntime, ShutdownStopsWaitingThreadsAndJoins) {
  RealRuntime rt;
  std::atomic<bool> returned{false};
  rt.spawn("loop", [&] {
    while (!rt.stopping()) rt.wait_until([] { return false; }, rt.now_ns() + 60 * kNsPerSec);
    returned = true;
  });
  const TimeNs start = rt.now_ns();
  rt.shutdown();
  EXPECT_TRUE(returned.load());
  EXPECT_LT(rt.now_ns() - start, 10 * kNsPerSec);
  EXPECT_TRUE(rt.stopping());
  rt.shutdown();  // idempotent
}

TEST(RealRuntime, ExceptionInThreadIsRecorded) {
  RealRuntime rt;
  rt.spawn("thrower", [] { throw std::runtime_error("boom"); });
  rt.shutdown();
  ASSERT_EQ(rt.thread_errors().size(), 1u);
  EXPECT_EQ(rt.thread_errors()[0], "thrower: boom");
}

TEST(RealRuntime, SpawnAfterShutdownThrowsEshutdown) {
  RealRuntime rt;
  rt.shutdown();
  try {
    rt.spawn("late", [] {});
    FAIL() << "spawn after shutdown did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.err(), ESHUTDOWN);
  }
}

}  // namespace
}  // namespace rdmalab::verbs
