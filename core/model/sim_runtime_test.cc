#include "model/sim_runtime.h"

#include <gtest/gtest.h>

#include <string>
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

}  // namespace
}  // namespace rdmalab::model
