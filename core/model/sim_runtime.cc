#include "model/sim_runtime.h"

#include <sstream>
#include <stdexcept>

namespace rdmalab::model {

struct SimRuntime::SimThread {
  enum class State { kNew, kRunning, kWaiting, kDone };
  SimRuntime* rt = nullptr;
  uint64_t id = 0;
  std::string name;
  State state = State::kNew;
  const std::function<bool()>* pred = nullptr;
  TimeNs deadline = 0;
  std::thread::id os_id;
  std::thread thread;

  bool runnable(TimeNs now) const {
    if (state == State::kNew) return true;
    if (state != State::kWaiting) return false;
    return now >= deadline || (*pred)();
  }
};

namespace {
thread_local SimRuntime::SimThread* tls_current = nullptr;

const char* state_name(int s) {
  static const char* names[] = {"new", "running", "waiting", "done"};
  return names[s];
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
  running_ = controller->id;
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

void SimRuntime::spawn(const std::string& name, std::function<void()> body) {
  auto t = std::make_unique<SimThread>();
  t->rt = this;
  t->id = next_thread_id_++;
  t->name = name;
  SimThread* raw = t.get();
  threads_.push_back(std::move(t));
  raw->thread = std::thread(
      [this, raw, body = std::move(body)]() mutable { thread_main(raw, std::move(body)); });
}

void SimRuntime::thread_main(SimThread* t, std::function<void()> body) {
  tls_current = t;
  t->os_id = std::this_thread::get_id();
  {
    std::unique_lock<std::mutex> lock(baton_mu_);
    baton_cv_.wait(lock, [&] { return running_ == t->id; });
  }
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
  t->state = SimThread::State::kDone;
  // Hand the baton on; this thread never runs again.
  SimThread* next = pick_next();
  if (next == nullptr) next = threads_[0].get();  // deadlock: the controller's wait gives up
  {
    std::lock_guard<std::mutex> lock(baton_mu_);
    running_ = next->id;
  }
  baton_cv_.notify_all();
}

SimRuntime::SimThread* SimRuntime::pick_next() {
  for (;;) {
    if (stopping_) return threads_[0].get();
    std::vector<SimThread*> runnable;
    for (size_t i = 0; i < threads_.size(); ++i) {
      if (threads_[i]->runnable(now_)) runnable.push_back(threads_[i].get());
    }
    if (!runnable.empty()) return runnable[sched_rng_.uniform(runnable.size())];

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
  {
    std::lock_guard<std::mutex> lock(baton_mu_);
    running_ = next->id;
  }
  baton_cv_.notify_all();
  std::unique_lock<std::mutex> lock(baton_mu_);
  baton_cv_.wait(lock, [&] { return running_ == me->id; });
}

bool SimRuntime::wait_until(const std::function<bool()>& pred, TimeNs deadline_ns) {
  SimThread* me = self();
  for (;;) {
    if (pred()) return true;
    if (stopping_ || now_ >= deadline_ns) return false;
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
  for (size_t i = 1; i < threads_.size(); ++i) {
    if (threads_[i]->thread.joinable()) threads_[i]->thread.join();
  }
  threads_.resize(1);
  timers_.clear();
  timer_time_.clear();
}

std::string SimRuntime::dump_threads() const {
  std::ostringstream out;
  for (const auto& t : threads_) {
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
