// The timer wheel's rounding against numbers worked by hand from kernel/time/timer.c, and
// against what rxe showed in the VM lab (16 DREQs 6.4 s apart: docs/semantics.md A).
#include "rdmalab/kernel_timer.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace rdmalab {
namespace {

constexpr int64_t kMs = 1'000'000;

TEST(KernelTimer, MsecsToJiffiesRoundsUp) {
  EXPECT_EQ(msecs_to_jiffies(6144, 250), 1536u);
  EXPECT_EQ(msecs_to_jiffies(6145, 250), 1537u);
  EXPECT_EQ(msecs_to_jiffies(1, 250), 1u);
  EXPECT_EQ(msecs_to_jiffies(10, 100), 1u);
  EXPECT_EQ(msecs_to_jiffies(2048, 1000), 2048u);
}

TEST(KernelTimer, LevelsFollowLvlStart) {
  EXPECT_EQ(timer_wheel_level(62, 250), 0);
  EXPECT_EQ(timer_wheel_level(63, 250), 1);  // LVL_START(1) = 63
  EXPECT_EQ(timer_wheel_level(503, 250), 1);
  EXPECT_EQ(timer_wheel_level(504, 250), 2);  // LVL_START(2) = 63 << 3
  EXPECT_EQ(timer_wheel_level(1536, 250), 2);
  EXPECT_EQ(timer_wheel_level(4032, 250), 3);
}

TEST(KernelTimer, BucketRoundsUpToTheLevelGranularity) {
  // Level 0: the next jiffy after expires (a timer armed late in a tick never runs early).
  EXPECT_EQ(timer_wheel_bucket_expiry(1000, 1010, 250), 1011u);
  // Level 2 (64 jiffies): 1536 ahead of a clock on a 64 boundary runs 1600 later.
  EXPECT_EQ(timer_wheel_bucket_expiry(6400, 6400 + 1536, 250), 6400u + 1600);
  // ... and 63 jiffies later in the bucket it runs at the same boundary.
  EXPECT_EQ(timer_wheel_bucket_expiry(6463, 6463 + 1536, 250), 6400u + 1600);
  EXPECT_EQ(timer_wheel_bucket_expiry(5, 3, 250), 5u);  // already expired
}

TEST(KernelTimer, DreqRetriesAt250HzAre6400MsApart) {
  // cm.c: 2 * 2^(18-8) + 2^(20-8) = 6144 ms per DREQ with rdma_cm's defaults on RoCE.
  EXPECT_EQ(kernel_timer_rearm_period_ns(6144, 250), 6400 * kMs);
  auto [lo, hi] = kernel_timer_delay_range_ns(6144, 250);
  EXPECT_EQ(lo, 6144 * kMs + 1);
  EXPECT_EQ(hi, 6400 * kMs);
  // 16 attempts: the first from any phase, then 15 steady periods: 102.144-102.4 s.
  EXPECT_EQ(lo + 15 * kernel_timer_rearm_period_ns(6144, 250), 102144 * kMs + 1);
  EXPECT_EQ(hi + 15 * kernel_timer_rearm_period_ns(6144, 250), 102400 * kMs);
}

TEST(KernelTimer, TimewaitOf2048MsEndsNear2304Ms) {
  auto [lo, hi] = kernel_timer_delay_range_ns(2048, 250);  // 512 jiffies: level 2
  EXPECT_EQ(lo, 2048 * kMs + 1);
  EXPECT_EQ(hi, 2304 * kMs);
}

TEST(KernelTimer, DelayFromAKnownInstantFallsInTheRange) {
  auto [lo, hi] = kernel_timer_delay_range_ns(6144, 250);
  for (int64_t now = 0; now < 2000 * kMs; now += 1'300'001) {
    const int64_t d = kernel_timer_delay_ns(now, 6144, 250);
    EXPECT_GE(d, lo) << now;
    EXPECT_LE(d, hi) << now;
    // A timer re-armed when this one runs runs one steady period later.
    EXPECT_EQ(kernel_timer_delay_ns(now + d, 6144, 250), 6400 * kMs) << now;
  }
}

TEST(KernelTimer, HzOf1000HasAFinerWheel) {
  // 6144 jiffies: level 3 (512 jiffies = 512 ms).
  EXPECT_EQ(kernel_timer_rearm_period_ns(6144, 1000), 6656 * kMs);
  EXPECT_EQ(kernel_timer_rearm_period_ns(10, 1000), 11 * kMs);  // level 0: next jiffy
}

TEST(KernelTimer, BadHzIsRefused) {
  EXPECT_THROW(kernel_timer_delay_range_ns(10, 0), std::invalid_argument);
}

}  // namespace
}  // namespace rdmalab
