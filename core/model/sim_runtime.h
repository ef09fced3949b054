// The model's Runtime: a discrete-event simulator on a virtual clock with deterministic,
// seeded scheduling of harness threads. Harness threads are real std::threads, but only the
// one holding the baton runs; whoever blocks in wait_until runs the scheduler: it picks the
// next runnable thread with the seeded generator, or, when none is runnable, advances the
// clock to the next timer or wait deadline and runs that. Same seed, same interleaving.
// Model code (fabric, devices) runs only on the baton holder, so it needs no locks.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
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

  explicit SimRuntime(uint64_t seed);
  ~SimRuntime() override;
  SimRuntime(const SimRuntime&) = delete;
  SimRuntime& operator=(const SimRuntime&) = delete;

  TimeNs now_ns() const override { return now_; }
  void spawn(const std::string& name, std::function<void()> body) override;
  bool wait_until(const std::function<bool()>& pred, TimeNs deadline_ns) override;
  void notify_all() override {}
  bool stopping() const override { return stopping_; }
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

 private:
  SimThread* self();
  SimThread* pick_next();
  void switch_to(SimThread* self, SimThread* next);
  void thread_main(SimThread* t, std::function<void()> body);

  TimeNs now_ = 0;
  MutationSet mutations_;
  bool stopping_ = false;
  Rng rng_;
  Rng sched_rng_;
  uint64_t next_timer_seq_ = 1;
  std::map<std::pair<TimeNs, uint64_t>, std::function<void()>> timers_;
  std::map<TimerId, TimeNs> timer_time_;

  std::vector<std::unique_ptr<SimThread>> threads_;  // [0] is the controller thread
  uint64_t next_thread_id_ = 0;
  std::vector<std::string> thread_errors_;

  // The baton: the id of the only thread allowed to run.
  mutable std::mutex baton_mu_;
  std::condition_variable baton_cv_;
  uint64_t running_ = 0;
};

}  // namespace rdmalab::model
