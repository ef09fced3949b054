// The verbs backend's Runtime: real std::threads on CLOCK_MONOTONIC. wait_until re-checks its
// predicate on every notify_all and at least every kPollNs, so a pred that depends on state
// nobody notifies about (a device, another process) is still seen within a poll interval;
// wait_notified re-checks on notify_all, and every kNotifiedBackstopNs only as a safety net.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rdmalab/runtime.h"

namespace rdmalab::verbs {

class RealRuntime final : public Runtime {
 public:
  static constexpr TimeNs kPollNs = kNsPerMs;
  static constexpr TimeNs kNotifiedBackstopNs = 50 * kNsPerMs;

  // notified_backstop_ns: how often wait_notified re-checks without a notify (a test sets it
  // past its deadline, so that only a notify can wake the waiter in time).
  explicit RealRuntime(TimeNs notified_backstop_ns = kNotifiedBackstopNs)
      : notified_backstop_ns_(notified_backstop_ns) {}
  ~RealRuntime() override;
  RealRuntime(const RealRuntime&) = delete;
  RealRuntime& operator=(const RealRuntime&) = delete;

  // monotonic_now_ns(): CLOCK_MONOTONIC plus the process's offset. A controller driving
  // several machines sets each one's offset so that all their times (histories, event times,
  // deadlines) fall on the controller's clock. The offset is the process's, not this
  // runtime's: the event and CM waits of the verbs objects read the same clock.
  TimeNs now_ns() const override;
  static void set_clock_offset(TimeNs offset_ns);
  void spawn(const std::string& name, std::function<void()> body) override;
  bool wait_until(const std::function<bool()>& pred, TimeNs deadline_ns) override;
  bool wait_notified(const std::function<bool()>& pred, TimeNs deadline_ns) override;
  void notify_all() override;
  bool stopping() const override;

  // Sets stopping (waits return at once), wakes every waiter and joins the spawned threads.
  // Idempotent; must not be called from a spawned thread.
  void shutdown();

  // Exceptions that escaped a spawned thread's body ("name: what"), in order.
  std::vector<std::string> thread_errors() const;

 private:
  void run_body(const std::string& name, const std::function<void()>& body);
  // wait_until with pred re-checked on every notify_all and at least every recheck_ns.
  bool wait(const std::function<bool()>& pred, TimeNs deadline_ns, TimeNs recheck_ns);

  const TimeNs notified_backstop_ns_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;  // bumped by notify_all: a waiter never misses a notify
  bool stopping_ = false;
  std::vector<std::thread> threads_;
  std::vector<std::string> thread_errors_;
};

}  // namespace rdmalab::verbs
