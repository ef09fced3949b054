// How long this machine did not run us. A thread sleeps kPeriodNs at a time (absolute
// deadlines on CLOCK_MONOTONIC) and notes every wake-up that comes more than kLateNs after it
// was due. In a TCG guest on a loaded host a vCPU can stand still for hundreds of ms while the
// clock goes on; every kernel timer and event in the guest is then late by as much. A test that
// bounds a kernel timer adds the stall measured in its window, instead of a guessed tolerance.
// A stall counts from the start of the sleep it ended (it began somewhere in it): at most
// kPeriodNs more than it was, never less, as bounds need. 10 ms, not 5: a wake-up costs ~0.4 ms of
// its vCPU, and at 5 ms two agents' meters took a third of a host core (netns lab, 2026-11-28).
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
  static constexpr TimeNs kPeriodNs = 10 * kNsPerMs;
  static constexpr TimeNs kLateNs = kNsPerMs;  // below this: the scheduler's ordinary jitter
  static constexpr size_t kKept = 4096;        // newest stalls kept (a bounded ring)
  static constexpr const char* kThreadName = "stall-meter";  // the thread's comm

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

  // Ends the measuring (the thread is joined); the stalls kept stay readable. Idempotent. A
  // lab that is shut down stops its meter: an agent makes a lab per scenario, and every meter
  // left running woke its guest 100 times a second (rxe guest, 6.1: one more per scenario).
  void stop();

  // The time in [from_ns, to_ns] that the machine stood still, summed over the stalls kept.
  TimeNs stalled_ns(TimeNs from_ns, TimeNs to_ns) const;
  std::vector<Stall> stalls() const;

 private:
  void run();

  Clock clock_;
  Clock monotonic_;
  std::function<void(const Stall&)> on_stall_;
  mutable std::mutex mu_;
  std::mutex join_mu_;  // stop() from two threads joins once
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<Stall> stalls_;
  std::thread thread_;  // last: started once the rest is built
};

// The wait deadlines of this process do not count the time its machine stood still: a wait
// that began at start_ns ends at deadline_ns plus what `meter` measured since start_ns (at
// most kMaxStallCreditNs). A deadline is the scenario's bound on work the machine has to do,
// and a TCG guest on a loaded host (stress-ng beside make test) can stand still for half of
// every second: that time is measured, not guessed, as timing assertions use it.
inline constexpr TimeNs kMaxStallCreditNs = 30 * kNsPerSec;  // longer: a lost machine

// How long such a wait may sleep next (at most slice_ns) at now_ns; 0 once it is over.
// meter nullptr: the plain deadline.
TimeNs wait_slice_ns(const StallMeter* meter, TimeNs start_ns, TimeNs deadline_ns,
                     TimeNs now_ns, TimeNs slice_ns);

// The process's meter (a VerbsLab's), read by the verbs waits below.
void attach_process_meter(const StallMeter* meter);
void detach_process_meter(const StallMeter* meter);  // only if it is the attached one
// wait_slice_ns with the process's meter, on monotonic_now_ns().
TimeNs process_wait_slice_ns(TimeNs start_ns, TimeNs deadline_ns, TimeNs slice_ns);

}  // namespace rdmalab::verbs
