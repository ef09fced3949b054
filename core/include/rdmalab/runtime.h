// How harness threads run and wait. One interface, two implementations: the model's
// deterministic scheduler on a virtual clock (core/model/sim_runtime.h) and real threads on
// CLOCK_MONOTONIC (core/verbs). Stack helpers (drain, dispatcher) are written against this
// only, so they never ask which backend runs them (STYLE.md, FoundationDB's INetwork).
#pragma once

#include <functional>
#include <limits>
#include <string>

#include "rdmalab/error.h"
#include "rdmalab/mutation.h"
#include "rdmalab/types.h"

namespace rdmalab {

class Runtime {
 public:
  virtual ~Runtime() = default;

  virtual TimeNs now_ns() const = 0;

  // Starts a harness thread (an event loop, a handler worker). In the model it is a
  // simulated thread: only one runs at a time and the seeded scheduler picks which.
  virtual void spawn(const std::string& name, std::function<void()> body) = 0;

  // Blocks the calling thread until pred() holds or the deadline passes; returns pred().
  // pred must be cheap and free of side effects. Never call it while holding a mutex that
  // another harness thread may take: in the model that would stop the whole simulation.
  virtual bool wait_until(const std::function<bool()>& pred, TimeNs deadline_ns) = 0;

  // wait_until for a pred that reads only state whose every change is followed by
  // notify_all (a queue or flag a harness thread sets under its lock). Real threads then sleep
  // until a notify instead of re-checking every millisecond: in a TCG guest each idle worker
  // polling 1000 times a second cost a tenth of a vCPU. The model has one kind of wait.
  virtual bool wait_notified(const std::function<bool()>& pred, TimeNs deadline_ns) {
    return wait_until(pred, deadline_ns);
  }

  // Wakes waiters after a change that a pred may depend on (real threads need it; the
  // model re-evaluates every pred when it schedules, so there it is a no-op).
  virtual void notify_all() = 0;

  // True once the owner is shutting down: thread bodies must return soon after.
  virtual bool stopping() const = 0;

  // A planted defect (rdmalab/mutation.h) is on: only a model lab made with it says so.
  virtual bool mutated(Mutation /*m*/) const { return false; }

  // Lets d ns pass. A negative d is refused (Error EINVAL), not taken as no time at all;
  // a d past the end of the clock waits until its end.
  void sleep_for(TimeNs d) {
    wait_until([] { return false; }, deadline_after("sleep_for", d));
  }

  // now_ns() + d for a duration a caller gave: Error(verb, EINVAL) when d is negative,
  // clamped to the clock's end (no overflow) when it is beyond it.
  TimeNs deadline_after(const std::string& verb, TimeNs d) const {
    if (d < 0) throw Error(verb, EINVAL, "duration_ns = " + std::to_string(d) + " is negative");
    const TimeNs now = now_ns();
    return d > std::numeric_limits<TimeNs>::max() - now ? std::numeric_limits<TimeNs>::max()
                                                        : now + d;
  }

  // How often a harness loop that blocks in a read (rdma_get_cm_event, ibv_get_async_event)
  // or waits for work should wake to look at its own flags (stop, pause), given the interval
  // real threads need. Real threads must poll: a read cannot see the flags. The model wakes
  // such a loop through WakeOn instead and answers a long backstop, so an idle loop does not
  // cost a scheduling step (an OS thread switch) every few ms of virtual time.
  virtual TimeNs poll_interval_ns(TimeNs real_ns) const { return real_ns; }

  // While one is in scope, the calling thread's waits may also end early, returning pred(), as
  // soon as wake() holds (a stop or pause flag). The model re-checks wake with the thread's
  // pred at every scheduling step; real threads ignore it and poll. wake: as cheap and
  // side-effect free as a pred.
  class WakeOn {
   public:
    WakeOn(Runtime& rt, const std::function<bool()>& wake) : rt_(rt), prev_(rt.set_wake(&wake)) {}
    ~WakeOn() { rt_.set_wake(prev_); }
    WakeOn(const WakeOn&) = delete;
    WakeOn& operator=(const WakeOn&) = delete;

   private:
    Runtime& rt_;
    const std::function<bool()>* prev_;
  };

 protected:
  // The calling thread's wake condition (nullptr: none); returns the previous one.
  virtual const std::function<bool()>* set_wake(const std::function<bool()>* /*wake*/) {
    return nullptr;
  }
};

}  // namespace rdmalab
