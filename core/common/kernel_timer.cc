// kernel/time/timer.c and include/linux/jiffies.h, as Linux 6.1 computes them (the newest
// trees read compute the same: docs/semantics.md A).
#include "rdmalab/kernel_timer.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace rdmalab {
namespace {

constexpr int64_t kNsPerSec = 1'000'000'000;
constexpr uint64_t kLvlSize = uint64_t{1} << kLvlBits;

int64_t tick_ns(int hz) {
  if (hz <= 0 || hz > 10000) throw std::invalid_argument("kernel HZ " + std::to_string(hz));
  return kNsPerSec / hz;
}

int lvl_shift(int lvl) {
  return lvl * kLvlClkShift;
}
uint64_t lvl_gran(int lvl) {
  return uint64_t{1} << lvl_shift(lvl);
}
// LVL_START(n): the first delta that no longer fits level n - 1.
uint64_t lvl_start(int n) {
  return (kLvlSize - 1) << ((n - 1) * kLvlClkShift);
}

}  // namespace

int timer_wheel_depth(int hz) {
  return hz > 100 ? 9 : 8;
}

uint64_t msecs_to_jiffies(uint64_t ms, int hz) {
  tick_ns(hz);  // validates hz
  return (ms * static_cast<uint64_t>(hz) + 999) / 1000;  // rounds up, as _msecs_to_jiffies
}

uint64_t initial_jiffies(int hz) {
  return static_cast<uint64_t>(static_cast<uint32_t>(-300 * hz));
}

int timer_wheel_level(uint64_t delta, int hz) {
  const int depth = timer_wheel_depth(hz);
  for (int lvl = 0; lvl < depth - 1; ++lvl) {
    if (delta < lvl_start(lvl + 1)) return lvl;
  }
  return depth - 1;
}

uint64_t timer_wheel_bucket_expiry(uint64_t clk, uint64_t expires, int hz) {
  const int depth = timer_wheel_depth(hz);
  const uint64_t cutoff = lvl_start(depth);  // WHEEL_TIMEOUT_CUTOFF
  uint64_t delta = expires - clk;
  if (static_cast<int64_t>(delta) < 0) return clk;  // already expired: the current bucket
  int lvl = timer_wheel_level(delta, hz);
  if (lvl == depth - 1 && delta >= cutoff) {
    expires = clk + cutoff - lvl_gran(depth - 1);  // WHEEL_TIMEOUT_MAX
  }
  // calc_index: round up with the level's granularity so the timer never runs early (it may
  // have been armed late in a tick, and outer levels truncate).
  return ((expires >> lvl_shift(lvl)) + 1) << lvl_shift(lvl);
}

int64_t kernel_timer_delay_ns(int64_t now_ns, uint64_t ms, int hz) {
  const int64_t tick = tick_ns(hz);
  if (now_ns < 0) throw std::invalid_argument("kernel_timer_delay_ns: negative time");
  const uint64_t since_boot = static_cast<uint64_t>(now_ns / tick);
  const uint64_t clk = initial_jiffies(hz) + since_boot;
  const uint64_t bucket = timer_wheel_bucket_expiry(clk, clk + msecs_to_jiffies(ms, hz), hz);
  return static_cast<int64_t>(since_boot + (bucket - clk)) * tick - now_ns;
}

std::pair<int64_t, int64_t> kernel_timer_delay_range_ns(uint64_t ms, int hz) {
  const int64_t tick = tick_ns(hz);
  const uint64_t d = msecs_to_jiffies(ms, hz);
  const uint64_t gran = lvl_gran(timer_wheel_level(d, hz));
  // The bucket ends 1..gran jiffies after clk + d; `now` lies anywhere in the clk'th tick.
  return {static_cast<int64_t>(d) * tick + 1, static_cast<int64_t>(d + gran) * tick};
}

int64_t kernel_timer_rearm_period_ns(uint64_t ms, int hz) {
  const int64_t tick = tick_ns(hz);
  const uint64_t d = msecs_to_jiffies(ms, hz);
  const uint64_t gran = lvl_gran(timer_wheel_level(d, hz));
  // Armed on a bucket boundary of its own level: the next boundary after clk + d.
  return static_cast<int64_t>((d / gran + 1) * gran) * tick;
}

}  // namespace rdmalab
