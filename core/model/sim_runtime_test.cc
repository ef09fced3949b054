#include "model/sim_runtime.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace rdmalab::model {
namespace {

TEST(SimRuntime, TimersRunInTimeOrderAndFifoAtEqualTimes) {
  SimRuntime rt(1);
  std::vector<std::string> order;
  rt.schedule_at(30, [&] { order.push_back("c@" + std::to_string(rt.now_ns())); });
  rt.schedule_at(10, [&] { order.push_back("a@" + std::to_string(rt.now_ns())); });
  rt.schedule_at(10, [&] { order.push_back("b@" + std::to_string(rt.now_ns())); });
  const auto cancelled = rt.schedule_at(20, [&] { order.push_back("x"); });
  rt.cancel(cancelled);
  EXPECT_FALSE(rt.wait_until([] { return false; }, 100));
  EXPECT_EQ(rt.now_ns(), 100);
  EXPECT_EQ(order, (std::vector<std::string>{"a@10", "b@10", "c@30"}));
}

TEST(SimRuntime, WaitReturnsWhenPredicateBecomesTrue) {
  SimRuntime rt(1);
  bool flag = false;
  rt.schedule_at(5 * kNsPerMs, [&] { flag = true; });
  EXPECT_TRUE(rt.wait_until([&] { return flag; }, kNsPerSec));
  EXPECT_EQ(rt.now_ns(), 5 * kNsPerMs);  // virtual time jumps straight to the event
}

TEST(SimRuntime, SpawnedThreadsRunOnlyWhileTheControllerWaits) {
  SimRuntime rt(7);
  int steps = 0;
  rt.spawn("worker", [&] {
    for (int i = 0; i < 3; ++i) {
      ++steps;
      rt.sleep_for(kNsPerMs);
    }
  });
  EXPECT_EQ(steps, 0);  // the controller holds the baton
  EXPECT_TRUE(rt.wait_until([&] { return steps == 3; }, kNsPerSec));
  EXPECT_EQ(rt.now_ns(), 2 * kNsPerMs);
}

std::string interleaving(uint64_t seed) {
  SimRuntime rt(seed);
  std::string trace;
  for (char c : std::string("abc")) {
    rt.spawn(std::string(1, c), [&rt, &trace, c] {
      for (int i = 0; i < 4; ++i) {
        trace += c;
        rt.wait_until([] { return false; }, rt.now_ns());  // yield without advancing time
      }
    });
  }
  rt.wait_until([&] { return trace.size() == 12; }, kNsPerSec);
  return trace;
}

TEST(SimRuntime, SameSeedSameInterleaving) {
  EXPECT_EQ(interleaving(3), interleaving(3));
  bool differs = false;
  for (uint64_t s = 4; s < 12 && !differs; ++s) differs = interleaving(s) != interleaving(3);
  EXPECT_TRUE(differs) << "the seed should steer the interleaving";
}

TEST(SimRuntime, ShutdownEndsWaitingThreads) {
  auto rt = std::make_unique<SimRuntime>(1);
  bool exited = false;
  rt->spawn("forever", [&] {
    while (!rt->stopping()) rt->sleep_for(kNsPerSec);
    exited = true;
  });
  rt->wait_until([] { return false; }, kNsPerMs);
  rt->shutdown();
  EXPECT_TRUE(exited);
  EXPECT_FALSE(rt->wait_until([] { return false; }, rt->now_ns() + kNsPerSec));  // returns at once
}

TEST(SimRuntime, ExceptionInThreadIsRecordedNotFatal) {
  SimRuntime rt(1);
  rt.spawn("boom", [] { throw std::runtime_error("bad"); });
  rt.wait_until([] { return false; }, kNsPerMs);
  ASSERT_EQ(rt.thread_errors().size(), 1u);
  EXPECT_EQ(rt.thread_errors()[0], "boom: bad");
}

TEST(SimRuntime, DeadlockReturnsInsteadOfHanging) {
  SimRuntime rt(1);
  EXPECT_FALSE(rt.wait_until([] { return false; }, SimRuntime::kForever));
}

TEST(SimRuntime, WakeOnEndsAWaitWithoutAdvancingTheClock) {
  SimRuntime rt(1);
  bool stop = false;
  std::vector<std::pair<bool, TimeNs>> got;  // (what the wait returned, when)
  rt.spawn("reader", [&] {
    const std::function<bool()> stopped = [&] { return stop; };
    const Runtime::WakeOn wake(rt, stopped);
    const bool r = rt.wait_until([] { return false; }, rt.now_ns() + rt.poll_interval_ns(0));
    got.emplace_back(r, rt.now_ns());
  });
  rt.schedule_at(3 * kNsPerMs, [&] { stop = true; });
  EXPECT_TRUE(rt.wait_until([&] { return !got.empty(); }, kNsPerSec));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_FALSE(got[0].first);  // ended by the wake, not by its pred
  EXPECT_EQ(got[0].second, 3 * kNsPerMs);  // at the flag, not at the 10 s backstop
  EXPECT_EQ(rt.poll_interval_ns(10 * kNsPerMs), SimRuntime::kPollBackstopNs);
}

TEST(SimRuntime, WakeOnIsScopedToItsThread) {
  SimRuntime rt(1);
  bool flag = false;
  TimeNs other_done = -1;
  rt.spawn("other", [&] {  // no WakeOn: the flag does not end its wait
    rt.sleep_for(20 * kNsPerMs);
    other_done = rt.now_ns();
  });
  {
    const std::function<bool()> wake = [&] { return flag; };
    const Runtime::WakeOn on(rt, wake);
    rt.schedule_at(kNsPerMs, [&] { flag = true; });
    EXPECT_FALSE(rt.wait_until([] { return false; }, kNsPerSec));
    EXPECT_EQ(rt.now_ns(), kNsPerMs);
  }
  EXPECT_FALSE(rt.wait_until([] { return false; }, 5 * kNsPerMs));  // WakeOn gone: the deadline
  EXPECT_EQ(rt.now_ns(), 5 * kNsPerMs);
  EXPECT_TRUE(rt.wait_until([&] { return other_done >= 0; }, kNsPerSec));
  EXPECT_EQ(other_done, 20 * kNsPerMs);
}

// Threads come from a process-wide pool and finished ones leave the scheduler's list: many
// short threads over several runtimes all run, in order, and the dump lists only live ones.
TEST(SimRuntime, ManyShortThreadsAcrossRuntimesAllRun) {
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    SimRuntime rt(seed);
    int ran = 0;
    for (int i = 0; i < 200; ++i) {
      rt.spawn("t" + std::to_string(i), [&ran] { ++ran; });
      ASSERT_TRUE(rt.wait_until([&] { return ran == i + 1; }, rt.now_ns() + kNsPerMs));
    }
    const TimeNs t0 = rt.now_ns();
    rt.spawn("parked", [&rt] { rt.sleep_for(kNsPerSec); });
    rt.wait_until([] { return false; }, t0 + 1);  // lets it start and wait
    EXPECT_EQ(rt.dump_threads(), "controller [running]\nparked [waiting] until " +
                                     std::to_string(t0 + kNsPerSec) + " ns\n");
  }
}

}  // namespace
}  // namespace rdmalab::model
