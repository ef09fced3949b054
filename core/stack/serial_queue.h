// The serial event queue under CmEventPump and AsyncDispatcher: seed 001's per-id ordered work
// list (iwcm.c's work_list), which seed 002's per-object handlers need too. Events are queued
// per key (a CM id, a watched object): a key's events are handled one at a time in arrival
// order, different keys' in parallel on the workers. The ready list holds the keys that have
// events and no worker; a worker takes the first, handles its oldest event, and puts the key
// back if more wait.
//
// The owner's mutex guards the queue and what the owner keeps per key, so that routing an
// event and destroying its key see one state; the queue takes it for its own short sections
// and runs the owner's part of an event (records, the handler, the ack) without it.
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "rdmalab/runtime.h"

namespace rdmalab::stack {

// A key's work list, the base of the owner's per-key entry.
template <class E>
struct SerialLane {
  using Event = E;
  std::deque<Event> fifo;          // queued, not yet taken by a worker
  int running = 0;                 // its events being handled: 0 or 1
  std::thread::id running_thread;  // the worker handling one (a destroy from its own handler)
  bool in_ready = false;
};

// The threads' side: the stop flag and the owner's live threads (its reader and the workers).
class SerialThreads {
 public:
  SerialThreads(Runtime& rt, std::mutex& mu) : rt_(rt), mu_(mu) {}

  // Guarded by the owner's mutex; the owner sets them when it starts its threads.
  bool stop = false;
  int live_threads = 0;

  // After a thread's loop: one fewer live, waiters woken.
  void thread_ended();
  // Wakes every waiter and waits until no thread is live; false at the deadline.
  bool join(TimeNs deadline_ns);

 protected:
  // How long an idle worker waits before it looks at the flags again: only a safety net, as
  // stop notifies the workers (every wake-up of an idle thread costs a TCG guest about 0.4 ms
  // of its vCPU).
  static constexpr TimeNs kWorkerPollNs = kNsPerSec;

  Runtime& rt_;
  std::mutex& mu_;
};

// Entry: the owner's per-key entry, derived from SerialLane<Event>.
template <class Entry>
class SerialQueue : public SerialThreads {
 public:
  using Event = typename Entry::Event;

  // The owner's part of handling one event.
  class Runner {
   public:
    virtual ~Runner() = default;
    // Mutex held, the event taken and its key marked running: what the owner tracks of it.
    virtual void taken_locked(Entry& e, const Event& ev) = 0;
    // Without the mutex: records, the handler, the ack. True if the handler failed.
    virtual bool run(Entry& e, Event& ev) = 0;
    // Mutex held, the key no longer running: the owner's counts.
    virtual void done_locked(Entry& e, const Event& ev, bool failed) = 0;
  };

  SerialQueue(Runtime& rt, std::mutex& mu, Runner& runner)
      : SerialThreads(rt, mu), runner_(runner) {}

  // Puts e on the ready list if it has events and no worker holds it (mutex held). The owner
  // calls it once the event's routing is recorded, so that the record precedes the handler's.
  void schedule_locked(const std::shared_ptr<Entry>& e) {
    if (!e->fifo.empty() && !e->in_ready && e->running == 0) {
      e->in_ready = true;
      ready_.push_back(e);
    }
  }
  bool has_ready_locked() const { return !ready_.empty(); }
  // After stop, with every key's events taken off by the owner.
  void clear_ready_locked() { ready_.clear(); }

  // Sets stop, unless no thread is live and nothing is ready: then false, nothing to stop.
  bool begin_stop() {
    std::lock_guard lock(mu_);
    if (live_threads == 0 && ready_.empty()) return false;
    stop = true;
    return true;
  }

  // A worker's body: waits for a ready key or stop, handles what is ready, until stop.
  void worker_loop() {
    while (!rt_.stopping()) {
      rt_.wait_notified(
          [this] {
            std::lock_guard lock(mu_);
            return stop || !ready_.empty();
          },
          rt_.now_ns() + rt_.poll_interval_ns(kWorkerPollNs));
      {
        std::lock_guard lock(mu_);
        if (stop) break;
      }
      while (run_one()) {
      }
    }
  }

 private:
  // Takes the first ready key's oldest event and handles it. False when none was ready.
  bool run_one() {
    std::shared_ptr<Entry> e;
    Event ev;
    {
      std::lock_guard lock(mu_);
      if (stop || ready_.empty()) return false;
      e = ready_.front();
      ready_.pop_front();
      e->in_ready = false;
      if (e->fifo.empty()) return true;  // its events were dropped by a destroy
      ev = std::move(e->fifo.front());
      e->fifo.pop_front();
      ++e->running;
      e->running_thread = std::this_thread::get_id();
      runner_.taken_locked(*e, ev);
    }
    const bool failed = runner_.run(*e, ev);
    {
      std::lock_guard lock(mu_);
      --e->running;
      e->running_thread = {};
      runner_.done_locked(*e, ev, failed);
      schedule_locked(e);
    }
    rt_.notify_all();
    return true;
  }

  Runner& runner_;
  std::deque<std::shared_ptr<Entry>> ready_;
};

}  // namespace rdmalab::stack
