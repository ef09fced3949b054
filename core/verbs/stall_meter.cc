#include "verbs/stall_meter.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include <pthread.h>

#include "verbs/events.h"

namespace rdmalab::verbs {

namespace {
TimeNs steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

StallMeter::StallMeter(Clock clock, std::function<void(const Stall&)> on_stall, Clock monotonic)
    : clock_(std::move(clock)),
      monotonic_(monotonic ? std::move(monotonic) : Clock(steady_now_ns)),
      on_stall_(std::move(on_stall)),
      thread_([this] { run(); }) {}

StallMeter::~StallMeter() {
  stop();
}

void StallMeter::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  std::lock_guard<std::mutex> lock(join_mu_);
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void StallMeter::run() {
  pthread_setname_np(pthread_self(), kThreadName);  // for top -H, gdb and the tests
  TimeNs due = monotonic_() + kPeriodNs;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const TimeNs wait = std::max<TimeNs>(0, due - monotonic_());
    if (cv_.wait_for(lock, std::chrono::nanoseconds(wait), [this] { return stop_; })) break;
    const TimeNs woke = monotonic_();
    const TimeNs late = woke - due;
    due = woke + kPeriodNs;  // a stall is counted once, not caught up
    if (late <= kLateNs) continue;
    const Stall s{clock_(), late};
    stalls_.push_back(s);
    if (stalls_.size() > kKept) stalls_.pop_front();
    if (on_stall_) {
      lock.unlock();  // the observer may take other locks (the history's)
      on_stall_(s);
      lock.lock();
    }
  }
}

TimeNs StallMeter::stalled_ns(TimeNs from_ns, TimeNs to_ns) const {
  std::lock_guard<std::mutex> lock(mu_);
  TimeNs total = 0;
  TimeNs previous_end = std::numeric_limits<TimeNs>::min();
  for (const Stall& s : stalls_) {  // in the order they ended
    // From the sleep's start, not its deadline: counted from the deadline, a make test with two
    // device labs failed a drain bound by 15 ms with 347 ms of stalls counted (rxe, 6.1). Not
    // before the previous stall's end: stamped a little after their wake-ups, the two could
    // overlap by the difference and be counted twice (TSan in a TCG guest: 60 us).
    const TimeNs lo = std::max({from_ns, s.end_ns - s.late_ns - kPeriodNs, previous_end});
    const TimeNs hi = std::min(to_ns, s.end_ns);
    if (hi > lo) total += hi - lo;
    previous_end = s.end_ns;
  }
  return total;
}

std::vector<StallMeter::Stall> StallMeter::stalls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {stalls_.begin(), stalls_.end()};
}

TimeNs wait_slice_ns(const StallMeter* meter, TimeNs start_ns, TimeNs deadline_ns,
                     TimeNs now_ns, TimeNs slice_ns) {
  TimeNs end = deadline_ns;
  if (now_ns >= end && meter != nullptr) {  // only then: stalled_ns walks the kept stalls
    end += std::min(kMaxStallCreditNs, meter->stalled_ns(start_ns, now_ns));
  }
  return now_ns >= end ? 0 : std::min(slice_ns, end - now_ns);
}

namespace {
std::mutex g_meter_mu;
const StallMeter* g_meter = nullptr;
}  // namespace

void attach_process_meter(const StallMeter* meter) {
  std::lock_guard<std::mutex> lock(g_meter_mu);
  g_meter = meter;
}

void detach_process_meter(const StallMeter* meter) {
  std::lock_guard<std::mutex> lock(g_meter_mu);
  if (g_meter == meter) g_meter = nullptr;
}

// Consecutive waits of one thread on the same deadline are one budget (cm_connect's address
// step, then its route step): credited the stalls since the first of them began. Counted from
// each wait's own start, the stalls of the address step were lost to the route step, which a
// loaded TCG guest's connect then failed by (rxe, 6.1: 240 ms of stalls, 20 ms left).
namespace {
TimeNs budget_start_ns(TimeNs start_ns, TimeNs deadline_ns) {
  thread_local TimeNs t_deadline = 0;
  thread_local TimeNs t_start = 0;
  if (deadline_ns != t_deadline) {
    t_deadline = deadline_ns;
    t_start = start_ns;
  }
  t_start = std::min(t_start, start_ns);
  return t_start;
}
}  // namespace

TimeNs process_wait_slice_ns(TimeNs start_ns, TimeNs deadline_ns, TimeNs slice_ns) {
  const TimeNs first = budget_start_ns(start_ns, deadline_ns);
  const TimeNs now = monotonic_now_ns();
  if (now < deadline_ns) return std::min(slice_ns, deadline_ns - now);
  std::lock_guard<std::mutex> lock(g_meter_mu);  // the meter outlives no detach
  return wait_slice_ns(g_meter, first, deadline_ns, now, slice_ns);
}

}  // namespace rdmalab::verbs
