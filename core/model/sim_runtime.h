// The model's Runtime: a discrete-event simulator on a virtual clock with deterministic,
// seeded scheduling of harness threads. Harness threads run on real OS threads, but only the
// one holding the baton runs; whoever blocks in wait_until runs the scheduler: it picks the
// next runnable thread with the seeded generator, or, when none is runnable, advances the
// clock to the next timer or wait deadline and runs that. Same seed, same interleaving.
// Model code (fabric, devices) runs only on the baton holder, so it needs no locks.
// The OS threads come from a process-wide pool of parked ones (a spawn costs no thread
// creation), and the baton goes straight to the next thread (one futex wake, no broadcast).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "rdmalab/runtime.h"

namespace rdmalab::model {

// All randomness of the model comes from instances of this, seeded from the lab seed.
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  uint64_t next() { return gen_(); }
  uint64_t uniform(uint64_t n) { return n == 0 ? 0 : gen_() % n; }  // [0, n)
  bool chance_ppm(uint32_t ppm) { return ppm > 0 && uniform(1000000) < ppm; }

 private:
  std::mt19937_64 gen_;  // fully specified by the standard: same sequence everywhere
};

class SimRuntime final : public Runtime {
 public:
  using TimerId = uint64_t;
  static constexpr TimeNs kForever = INT64_MAX;
  // poll_interval_ns on the model: loops are woken by their WakeOn and by their preds, which
  // the scheduler re-checks at every step; the poll only bounds a wait (every wait has one).
  static constexpr TimeNs kPollBackstopNs = 10 * kNsPerSec;

  explicit SimRuntime(uint64_t seed);
  ~SimRuntime() override;
  SimRuntime(const SimRuntime&) = delete;
  SimRuntime& operator=(const SimRuntime&) = delete;

  TimeNs now_ns() const override { return now_; }
  void spawn(const std::string& name, std::function<void()> body) override;
  bool wait_until(const std::function<bool()>& pred, TimeNs deadline_ns) override;
  void notify_all() override {}
  bool stopping() const override { return stopping_; }
  TimeNs poll_interval_ns(TimeNs /*real_ns*/) const override { return kPollBackstopNs; }
  bool mutated(Mutation m) const override { return mutations_.on(m); }
  void set_mutations(MutationSet m) { mutations_ = m; }

  // Timers: the model's events (packet arrivals, transport timeouts). fn runs on the baton
  // holder at virtual time t (>= now). Same t: FIFO.
  TimerId schedule_at(TimeNs t, std::function<void()> fn);
  TimerId schedule_after(TimeNs d, std::function<void()> fn) {
    return schedule_at(now_ + d, std::move(fn));
  }
  void cancel(TimerId id);
  size_t pending_timers() const { return timers_.size(); }

  Rng& rng() { return rng_; }

  // Stops every harness thread (their waits return at once) and joins them. Idempotent.
  void shutdown();

  // Names of harness threads and what they wait for, for diagnostic dumps.
  std::string dump_threads() const;

  // Exceptions that escaped a harness thread's body ("name: what"), in order.
  const std::vector<std::string>& thread_errors() const { return thread_errors_; }

  struct SimThread;  // opaque; public only so the .cc can keep a thread_local pointer
  struct Worker;     // a pooled OS thread; public for the same reason

 protected:
  const std::function<bool()>* set_wake(const std::function<bool()>* wake) override;

 private:
  SimThread* self();
  SimThread* pick_next();
  void switch_to(SimThread* self, SimThread* next);
  SimThread* run_thread(SimThread* t, std::function<void()>& body);
  static void worker_main(Worker* w);

  TimeNs now_ = 0;
  MutationSet mutations_;
  bool stopping_ = false;
  Rng rng_;
  Rng sched_rng_;
  uint64_t next_timer_seq_ = 1;
  std::map<std::pair<TimeNs, uint64_t>, std::function<void()>> timers_;
  std::map<TimerId, TimeNs> timer_time_;

  // [0] is the controller thread; finished threads are dropped at the next scheduling step.
  std::vector<std::unique_ptr<SimThread>> threads_;
  size_t finished_ = 0;  // kDone entries still in threads_
  std::vector<SimThread*> runnable_;  // pick_next's scratch list
  uint64_t next_thread_id_ = 0;
  std::vector<std::string> thread_errors_;
};

}  // namespace rdmalab::model
