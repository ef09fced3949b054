#include "verbs/stall_meter.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace rdmalab::verbs {
namespace {

TimeNs steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A machine that stands still for 300 ms: the monotonic clock jumps while the meter sleeps.
TEST(StallMeter, CountsAJumpOnceAndOnlyInsideTheWindow) {
  std::atomic<TimeNs> jump{0};
  std::atomic<int> seen{0};
  auto clock = [&] { return steady_ns() + jump.load(); };
  StallMeter meter(clock, [&](const StallMeter::Stall&) { ++seen; }, clock);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const TimeNs before = clock();
  jump = 300 * kNsPerMs;
  const TimeNs deadline = steady_ns() + 5 * kNsPerSec;
  while (seen.load() == 0 && steady_ns() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const TimeNs after = clock();
  ASSERT_FALSE(meter.stalls().empty()) << "no stall seen within 5 s";
  const StallMeter::Stall s = meter.stalls().back();
  EXPECT_GE(s.late_ns, 300 * kNsPerMs - StallMeter::kPeriodNs);
  EXPECT_LE(s.late_ns, 300 * kNsPerMs + 100 * kNsPerMs);  // the sleep's own lateness is small
  // Stalls never overlap (the next deadline is set from the wake-up), so a window that is the
  // stall holds exactly it and one holding half of it, half, whatever else a loaded machine
  // (a TCG guest under ThreadSanitizer) adds around it. A window from a period before the jump
  // holds it and no more than the window itself.
  EXPECT_EQ(meter.stalled_ns(s.end_ns - s.late_ns, s.end_ns), s.late_ns);
  EXPECT_EQ(meter.stalled_ns(s.end_ns - s.late_ns / 2, s.end_ns), s.late_ns / 2);
  const TimeNs wide = meter.stalled_ns(before - 50 * kNsPerMs, after);
  EXPECT_GE(wide, s.late_ns);
  EXPECT_LE(wide, after - (before - 50 * kNsPerMs));
}

TEST(StallMeter, AnIdleMachineHasNoStall) {
  StallMeter meter([] { return steady_ns(); });
  const TimeNs t0 = steady_ns();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  // Scheduler jitter under kLateNs is not a stall; a loaded test machine may still have one,
  // so this asserts only that the window arithmetic bounds it by the window.
  EXPECT_LE(meter.stalled_ns(t0, steady_ns()), steady_ns() - t0);
  EXPECT_EQ(meter.stalled_ns(t0, t0), 0);
}

}  // namespace
}  // namespace rdmalab::verbs
