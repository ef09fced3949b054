#include "model/sim_runtime.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <sstream>
#include <stdexcept>

namespace rdmalab::model {

// Where an OS thread sleeps while another holds the baton. Only the baton holder hands out a
// turn: it clears its own, sets the next thread's (release) and wakes that one alone, and only
// if it sleeps, so a handoff is at most one futex wake and the next thread sees all the
// previous one did (acquire). No spinning: on a loaded machine (a swarm on every core) a
// spinning waiter takes the core the baton holder needs.
struct SimBaton {
  static constexpr uint32_t kIdle = 0, kMine = 1, kAsleep = 2;
  std::atomic<uint32_t> turn{kIdle};
  // A pooled thread is moved onto the CPU of whoever hands it the baton (0: the controller,
  // whose affinity is the user's and stays as it is).
  pthread_t os = 0;
  int cpu = -1;

  // Only one simulation thread runs at a time, and waking a thread on the other CPU (an IPI;
  // on a VM, an idle vCPU woken) costs several times the step it runs: measured on this
  // 2-core VM, 1,500 connect+disconnect cycles/s without the move, 3,700 with it.
  void hand_to() {
    const int here = sched_getcpu();
    if (os != 0 && here >= 0 && here != cpu) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(here, &set);
      if (pthread_setaffinity_np(os, sizeof set, &set) == 0) {
        cpu = here;
      } else {
        os = 0;  // not allowed here (a cpuset): leave this thread where the kernel puts it
      }
    }
    give();
  }

  void give() {
    if (turn.exchange(kMine, std::memory_order_release) == kAsleep) {
      syscall(SYS_futex, &turn, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
    }
  }
  void await() {
    uint32_t idle = kIdle;
    turn.compare_exchange_strong(idle, kAsleep, std::memory_order_acquire);
    while (turn.load(std::memory_order_acquire) != kMine) {
      syscall(SYS_futex, &turn, FUTEX_WAIT_PRIVATE, kAsleep, nullptr, nullptr, 0);
    }
  }
};

// A pooled OS thread and its current job (set by spawn, on the baton holder).
struct SimRuntime::Worker {
  SimBaton baton;
  SimRuntime* rt = nullptr;
  SimThread* thread = nullptr;
  std::function<void()> body;
};

struct SimRuntime::SimThread {
  enum class State { kNew, kRunning, kWaiting, kDone };
  SimRuntime* rt = nullptr;
  uint64_t id = 0;
  std::string name;
  State state = State::kNew;
  const std::function<bool()>* pred = nullptr;
  const std::function<bool()>* wake = nullptr;  // Runtime::WakeOn
  TimeNs deadline = 0;
  std::thread::id os_id;  // the controller's; pooled threads change hands
  SimBaton* baton = nullptr;

  bool woken() const { return wake != nullptr && (*wake)(); }
  bool runnable(TimeNs now) const {
    if (state == State::kNew) return true;
    if (state != State::kWaiting) return false;
    return now >= deadline || (*pred)() || woken();
  }
};

namespace {
thread_local SimRuntime::SimThread* tls_current = nullptr;
thread_local SimBaton tls_controller_baton;  // of a thread that constructs a SimRuntime

const char* state_name(int s) {
  static const char* names[] = {"new", "running", "waiting", "done"};
  return names[s];
}

// Parked OS threads, shared by every SimRuntime of the process: a lab's event pumps and
// workers cost no thread creation once the pool has grown to the most ever alive at once.
// Workers are never freed (a parked one may still be in its last futex call).
struct Pool {
  std::mutex mu;
  std::vector<SimRuntime::Worker*> idle;
};
Pool* g_pool = nullptr;
std::once_flag g_pool_once;

Pool& pool() {
  std::call_once(g_pool_once, [] {
    g_pool = new Pool;
    // A forked child has none of the parked threads (and maybe a held mutex): a fresh pool.
    pthread_atfork(nullptr, nullptr, [] { g_pool = new Pool; });
  });
  return *g_pool;
}
}  // namespace

SimRuntime::SimRuntime(uint64_t seed) : rng_(seed), sched_rng_(seed ^ 0x9e3779b97f4a7c15ULL) {
  // The constructing thread is the controller: it holds the baton whenever it is not waiting.
  auto controller = std::make_unique<SimThread>();
  controller->rt = this;
  controller->id = next_thread_id_++;
  controller->name = "controller";
  controller->state = SimThread::State::kRunning;
  controller->os_id = std::this_thread::get_id();
  controller->baton = &tls_controller_baton;
  tls_controller_baton.turn.store(SimBaton::kMine, std::memory_order_relaxed);
  threads_.push_back(std::move(controller));
}

SimRuntime::~SimRuntime() {
  shutdown();
}

SimRuntime::SimThread* SimRuntime::self() {
  if (tls_current != nullptr && tls_current->rt == this) return tls_current;
  if (std::this_thread::get_id() == threads_[0]->os_id) return threads_[0].get();
  throw std::logic_error("SimRuntime: wait_until called from a thread the simulation does not own");
}

const std::function<bool()>* SimRuntime::set_wake(const std::function<bool()>* wake) {
  SimThread* me = self();
  const std::function<bool()>* prev = me->wake;
  me->wake = wake;
  return prev;
}

void SimRuntime::spawn(const std::string& name, std::function<void()> body) {
  auto t = std::make_unique<SimThread>();
  t->rt = this;
  t->id = next_thread_id_++;
  t->name = name;
  Worker* w = nullptr;
  {
    Pool& p = pool();
    std::lock_guard lock(p.mu);
    if (!p.idle.empty()) {
      w = p.idle.back();
      p.idle.pop_back();
    }
  }
  if (w == nullptr) {  // a new OS thread, parked until its first job is handed over
    w = new Worker;
    try {
      std::thread os(worker_main, w);
      w->baton.os = os.native_handle();
      os.detach();
    } catch (...) {
      delete w;
      throw;
    }
  }
  // The worker reads its job when the scheduler first gives it the baton.
  w->rt = this;
  w->thread = t.get();
  w->body = std::move(body);
  t->baton = &w->baton;
  threads_.push_back(std::move(t));
}

void SimRuntime::worker_main(Worker* w) {
  for (;;) {
    w->baton.await();  // the scheduler picked this worker's thread for the first time
    SimThread* next = w->rt->run_thread(w->thread, w->body);
    SimBaton* to = next->baton;
    w->rt = nullptr;
    w->thread = nullptr;
    w->baton.turn.store(SimBaton::kIdle, std::memory_order_relaxed);
    {
      Pool& p = pool();
      std::lock_guard lock(p.mu);
      p.idle.push_back(w);
    }
    to->hand_to();  // from here on this thread touches no simulation memory
  }
}

// Runs t's body on the calling pooled thread; returns the thread to hand the baton to.
SimRuntime::SimThread* SimRuntime::run_thread(SimThread* t, std::function<void()>& body) {
  tls_current = t;
  t->state = SimThread::State::kRunning;
  if (!stopping_) {
    try {
      body();
    } catch (const std::exception& e) {
      thread_errors_.push_back(t->name + ": " + e.what());
    } catch (...) {
      thread_errors_.push_back(t->name + ": unknown exception");
    }
  }
  body = nullptr;  // its captures die while this thread still holds the baton
  tls_current = nullptr;
  t->state = SimThread::State::kDone;
  t->baton = nullptr;
  ++finished_;
  SimThread* next = pick_next();  // may drop t from threads_: t is not used after this
  return next != nullptr ? next : threads_[0].get();  // deadlock: the controller gives up
}

SimRuntime::SimThread* SimRuntime::pick_next() {
  if (finished_ > 0 && !stopping_) {  // shutdown walks threads_ itself: leave it whole then
    std::erase_if(threads_, [](const auto& t) { return t->state == SimThread::State::kDone; });
    finished_ = 0;
  }
  for (;;) {
    if (stopping_) return threads_[0].get();
    runnable_.clear();
    for (const auto& t : threads_) {
      if (t->runnable(now_)) runnable_.push_back(t.get());
    }
    if (!runnable_.empty()) return runnable_[sched_rng_.uniform(runnable_.size())];

    // Nothing can run now: advance the clock to the next timer or wait deadline.
    TimeNs next_t = kForever;
    for (const auto& t : threads_) {
      if (t->state == SimThread::State::kWaiting) next_t = std::min(next_t, t->deadline);
    }
    if (!timers_.empty() && timers_.begin()->first.first <= next_t) {
      auto it = timers_.begin();
      now_ = std::max(now_, it->first.first);
      std::function<void()> fn = std::move(it->second);
      timer_time_.erase(it->first.second);
      timers_.erase(it);
      fn();
      continue;
    }
    if (next_t == kForever) return nullptr;  // every thread waits forever with nothing pending
    now_ = std::max(now_, next_t);
  }
}

void SimRuntime::switch_to(SimThread* me, SimThread* next) {
  SimBaton* mine = me->baton;
  mine->turn.store(SimBaton::kIdle, std::memory_order_relaxed);
  next->baton->hand_to();
  mine->await();
}

bool SimRuntime::wait_until(const std::function<bool()>& pred, TimeNs deadline_ns) {
  SimThread* me = self();
  for (;;) {
    if (pred()) return true;
    if (stopping_ || now_ >= deadline_ns || me->woken()) return false;
    me->pred = &pred;
    me->deadline = deadline_ns;
    me->state = SimThread::State::kWaiting;
    SimThread* next = pick_next();
    if (next != nullptr && next != me) switch_to(me, next);
    me->state = SimThread::State::kRunning;
    me->pred = nullptr;
    if (next == nullptr) return pred();  // deadlock: no event and no deadline can ever wake anyone
  }
}

SimRuntime::TimerId SimRuntime::schedule_at(TimeNs t, std::function<void()> fn) {
  const TimerId id = next_timer_seq_++;
  const TimeNs when = std::max(t, now_);
  timers_.emplace(std::make_pair(when, id), std::move(fn));
  timer_time_.emplace(id, when);
  return id;
}

void SimRuntime::cancel(TimerId id) {
  auto it = timer_time_.find(id);
  if (it == timer_time_.end()) return;
  timers_.erase(std::make_pair(it->second, id));
  timer_time_.erase(it);
}

void SimRuntime::shutdown() {
  if (stopping_ && threads_.size() <= 1) return;
  SimThread* me = threads_[0].get();
  if (std::this_thread::get_id() != me->os_id && !(tls_current && tls_current->rt == this)) {
    // Only the controller may stop the simulation; anything else is a harness bug.
    std::terminate();
  }
  stopping_ = true;
  // Give each unfinished thread the baton until it returns; with stopping_ set its waits
  // return at once and it hands the baton straight back to the controller.
  for (size_t i = 1; i < threads_.size(); ++i) {
    SimThread* t = threads_[i].get();
    while (t->state != SimThread::State::kDone) switch_to(me, t);
  }
  // Their OS threads are parked in the pool again: nothing to join.
  threads_.resize(1);
  finished_ = 0;
  timers_.clear();
  timer_time_.clear();
}

std::string SimRuntime::dump_threads() const {
  std::ostringstream out;
  for (const auto& t : threads_) {
    if (t->state == SimThread::State::kDone) continue;  // dropped at the next step anyway
    out << t->name << " [" << state_name(static_cast<int>(t->state)) << "]";
    if (t->state == SimThread::State::kWaiting) {
      out << " until "
          << (t->deadline == kForever ? std::string("forever") : std::to_string(t->deadline))
          << " ns";
    }
    out << "\n";
  }
  return out.str();
}

}  // namespace rdmalab::model
