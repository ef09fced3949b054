// How long this machine did not run us. A thread sleeps kPeriodNs at a time (absolute
// deadlines on CLOCK_MONOTONIC) and notes every wake-up that comes more than kLateNs after it
// was due. In a TCG guest on a loaded host a vCPU can stand still for hundreds of ms while the
// clock goes on; every kernel timer and event in the guest is then late by as much. A test that
// bounds a kernel timer adds the stall measured in its window, instead of a guessed tolerance.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "rdmalab/types.h"

namespace rdmalab::verbs {

class StallMeter {
 public:
  static constexpr TimeNs kPeriodNs = 5 * kNsPerMs;
  static constexpr TimeNs kLateNs = kNsPerMs;  // below this: the scheduler's ordinary jitter
  static constexpr size_t kKept = 4096;        // newest stalls kept (a bounded ring)

  struct Stall {
    TimeNs end_ns;   // when the thread ran again, on clock()
    TimeNs late_ns;  // how long after its deadline: the machine stood still in [end - late, end]
  };

  using Clock = std::function<TimeNs()>;
  // clock: the lab's clock (CLOCK_MONOTONIC plus the controller's offset, which the agent
  // sets after the start), in which stalls are stamped so that windows given in event times
  // line up. on_stall: called (from the meter's thread) for each stall. monotonic: the clock
  // lateness is measured on (CLOCK_MONOTONIC; a test gives one that jumps).
  explicit StallMeter(Clock clock, std::function<void(const Stall&)> on_stall = nullptr,
                      Clock monotonic = nullptr);
  ~StallMeter();
  StallMeter(const StallMeter&) = delete;
  StallMeter& operator=(const StallMeter&) = delete;

  // The time in [from_ns, to_ns] that the machine stood still, summed over the stalls kept.
  TimeNs stalled_ns(TimeNs from_ns, TimeNs to_ns) const;
  std::vector<Stall> stalls() const;

 private:
  void run();

  Clock clock_;
  Clock monotonic_;
  std::function<void(const Stall&)> on_stall_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<Stall> stalls_;
  std::thread thread_;  // last: started once the rest is built
};

}  // namespace rdmalab::verbs
