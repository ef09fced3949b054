// The serial event queue on the model's runtime: a key's events one at a time in arrival order,
// different keys in parallel; stop leaves what was queued to the owner.
#include "stack/serial_queue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "stack/test_lab.h"

namespace rdmalab::stack {
namespace serial_queue_test {

struct Key : SerialLane<int> {
  std::string name;
};

// Handles an event in 10 us of virtual time; a negative event's handler fails.
struct Recorder : SerialQueue<Key>::Runner {
  Recorder(Runtime& r, std::mutex& m) : rt(r), mu(m) {}
  Runtime& rt;
  std::mutex& mu;
  std::vector<std::string> log;  // "a1+" when a's event 1 begins, "a1-" when it ends
  std::map<std::string, int> running;
  int most_per_key = 0;
  int most_at_once = 0;
  int at_once = 0;
  int done = 0;
  int failed = 0;

  void taken_locked(Key& k, const int& /*ev*/) override {
    most_per_key = std::max(most_per_key, ++running[k.name]);
  }
  bool run(Key& k, int& ev) override {
    {
      std::lock_guard lock(mu);
      most_at_once = std::max(most_at_once, ++at_once);
      log.push_back(k.name + std::to_string(ev) + "+");
    }
    rt.sleep_for(10 * kNsPerUs);
    std::lock_guard lock(mu);
    --at_once;
    log.push_back(k.name + std::to_string(ev) + "-");
    return ev < 0;
  }
  void done_locked(Key& k, const int& /*ev*/, bool f) override {
    --running[k.name];
    ++done;
    failed += f ? 1 : 0;
  }
};

struct Fixture {
  fixture::TwoHosts lab{"ib"};
  std::mutex mu;
  Recorder rec{lab.rt(), mu};
  SerialQueue<Key> queue{lab.rt(), mu, rec};

  std::shared_ptr<Key> key(const std::string& name) {
    auto k = std::make_shared<Key>();
    k->name = name;
    return k;
  }
  void push(const std::shared_ptr<Key>& k, int ev) {
    std::lock_guard lock(mu);
    k->fifo.push_back(ev);
    queue.schedule_locked(k);
  }
  void start_workers(int n) {
    {
      std::lock_guard lock(mu);
      queue.live_threads = n;
    }
    for (int i = 0; i < n; ++i) {
      lab.rt().spawn("worker" + std::to_string(i), [this] {
        queue.worker_loop();
        queue.thread_ended();
      });
    }
  }
  bool wait_done(int n) {
    return lab.rt().wait_until(
        [&] {
          std::lock_guard lock(mu);
          return rec.done >= n;
        },
        lab.in(kNsPerSec));
  }
};

TEST(SerialQueueTest, KeysInOrderOneAtATimeAndInParallel) {
  Fixture f;
  auto a = f.key("a");
  auto b = f.key("b");
  for (int i = 1; i <= 3; ++i) {
    f.push(a, i);
    f.push(b, i);
  }
  f.start_workers(2);
  ASSERT_TRUE(f.wait_done(6));
  EXPECT_EQ(f.rec.most_per_key, 1);
  EXPECT_EQ(f.rec.most_at_once, 2);  // a and b on the two workers
  std::map<char, std::vector<std::string>> per_key;
  for (const auto& l : f.rec.log) per_key[l[0]].push_back(l.substr(1));
  const std::vector<std::string> serial = {"1+", "1-", "2+", "2-", "3+", "3-"};
  EXPECT_EQ(per_key['a'], serial);
  EXPECT_EQ(per_key['b'], serial);
  ASSERT_TRUE(f.queue.begin_stop());
  EXPECT_TRUE(f.queue.join(f.lab.in(kNsPerSec)));
  EXPECT_EQ(f.queue.live_threads, 0);
}

TEST(SerialQueueTest, FailedHandlerCountedAndTheKeyGoesOn) {
  Fixture f;
  auto a = f.key("a");
  f.push(a, -1);
  f.push(a, 2);
  f.start_workers(1);
  ASSERT_TRUE(f.wait_done(2));
  EXPECT_EQ(f.rec.failed, 1);
  EXPECT_EQ(f.rec.log, (std::vector<std::string>{"a-1+", "a-1-", "a2+", "a2-"}));
  ASSERT_TRUE(f.queue.begin_stop());
  EXPECT_TRUE(f.queue.join(f.lab.in(kNsPerSec)));
}

// A key whose events were taken off (a destroy) while it was ready is passed over.
TEST(SerialQueueTest, KeyEmptiedWhileReadyIsPassedOver) {
  Fixture f;
  auto a = f.key("a");
  auto b = f.key("b");
  f.push(a, 1);
  f.push(b, 1);
  {
    std::lock_guard lock(f.mu);
    a->fifo.clear();
  }
  f.start_workers(1);
  ASSERT_TRUE(f.wait_done(1));
  EXPECT_EQ(f.rec.log, (std::vector<std::string>{"b1+", "b1-"}));
  f.push(a, 2);  // no longer on the ready list: scheduled again
  ASSERT_TRUE(f.wait_done(2));
  EXPECT_EQ(f.rec.log.back(), "a2-");
  ASSERT_TRUE(f.queue.begin_stop());
  EXPECT_TRUE(f.queue.join(f.lab.in(kNsPerSec)));
}

// Without threads a stop only sets the flag; what is queued stays for the owner to drop.
TEST(SerialQueueTest, StopLeavesQueuedEventsToTheOwner) {
  Fixture f;
  EXPECT_FALSE(f.queue.begin_stop());  // nothing live, nothing ready
  auto a = f.key("a");
  f.push(a, 1);
  ASSERT_TRUE(f.queue.begin_stop());
  EXPECT_TRUE(f.queue.join(f.lab.in(kNsPerSec)));
  std::lock_guard lock(f.mu);
  EXPECT_TRUE(f.queue.stop);
  EXPECT_TRUE(f.queue.has_ready_locked());
  EXPECT_EQ(a->fifo.size(), 1u);
  f.queue.clear_ready_locked();
  EXPECT_FALSE(f.queue.has_ready_locked());
}

}  // namespace serial_queue_test
}  // namespace rdmalab::stack
