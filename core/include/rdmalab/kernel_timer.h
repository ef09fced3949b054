// When a Linux kernel timer really fires. A kernel timeout of N ms is not N ms: it is
// msecs_to_jiffies(N) jiffies (HZ per second), placed on the timer wheel (kernel/time/timer.c),
// whose outer levels have coarse buckets and round the expiry UP to the bucket's end so that no
// timer fires early. The IB CM's MAD timeouts and TIMEWAIT (mad.c wait_for_response, cm.c
// cm_enter_timewait) go through it, so a 6144 ms DREQ timeout fires 6400 ms after the last
// retry at HZ=250 (docs/semantics.md A). The model and rdmalab.cm_timing both use this.
#pragma once

#include <cstdint>
#include <utility>

namespace rdmalab {

// kernel/time/timer.c: levels of 64 buckets, each level 8 times coarser than the one below;
// LVL_DEPTH is 9 levels when HZ > 100, else 8.
inline constexpr int kLvlClkShift = 3;
inline constexpr int kLvlBits = 6;
int timer_wheel_depth(int hz);

// include/linux/jiffies.h: msecs_to_jiffies rounds up to whole jiffies.
uint64_t msecs_to_jiffies(uint64_t ms, int hz);

// kernel/time/timer.c calc_wheel_index: the jiffy at which a timer with `expires`, added when
// the wheel's clock is `clk`, is run (its bucket's expiry; never before `expires`).
uint64_t timer_wheel_bucket_expiry(uint64_t clk, uint64_t expires, int hz);

// The level (0..depth-1) calc_wheel_index puts a timer `delta` jiffies ahead of the clock in.
int timer_wheel_level(uint64_t delta, int hz);

// include/linux/jiffies.h INITIAL_JIFFIES: jiffies at boot, 5 minutes before the 32-bit wrap.
uint64_t initial_jiffies(int hz);

// Time from `now_ns` (since the host booted) until a kernel timer armed then for `ms` ms runs:
// jiffies tick every 1e9/HZ ns from boot; the timer runs at the tick its bucket expires.
int64_t kernel_timer_delay_ns(int64_t now_ns, uint64_t ms, int hz);

// The range of kernel_timer_delay_ns over every phase of `now` (a timer armed at an unknown
// instant): {shortest, longest}.
std::pair<int64_t, int64_t> kernel_timer_delay_range_ns(uint64_t ms, int hz);

// A timer re-armed for `ms` right when the previous one of the same length ran (mad.c
// timeout_sends resends and re-arms at once): the steady period between runs, in ns.
int64_t kernel_timer_rearm_period_ns(uint64_t ms, int hz);

}  // namespace rdmalab
