"""The IB CM's timers as the kernel computes them (drivers/infiniband/core/cm.c, cma.c;
docs/semantics.md A). Scenarios derive their time bounds from these, on every backend, so a
device that keeps other time shows up as a failed bound, not a silently wider one.

    t = IbCmTiming.for_caps(ctx.caps)          # cma.c defaults: 20 / 15 / 18 (16 from 6.2), the host's HZ
    lo, hi = t.dreq_give_up_range_ns           # DISCONNECTED(-ETIMEDOUT) after every DREP lost
    t.dreq_give_up_ns                          # hi: the latest it may come

A kernel timeout of N ms is not N ms: mad.c and cm.c arm msecs_to_jiffies(N) on the timer
wheel, which runs a timer at the end of its level's bucket (rdmalab/kernel_timer.h, bound here
as _core.kernel_timer_*). Armed at an unknown instant, a timer runs within a range; re-armed as
it runs (mad.c's retries), it runs a fixed period later. At HZ=250 a 6144 ms DREQ timeout runs
6144-6400 ms after rdma_disconnect, then every 6400 ms. With the host's HZ unknown
(caps.kernel_hz 0), the ranges span every HZ Linux offers.
"""

from __future__ import annotations

import dataclasses

from .. import _core
from ..kernel import release_version

NS_PER_MS = 1_000_000
KERNEL_HZ_CHOICES = (100, 250, 300, 1000)  # kernel/Kconfig.hz


def kernel_timer_range_ns(ms: int, hz: int) -> tuple[int, int]:
    """(earliest, latest) a kernel timer of ms armed at an unknown instant runs, in ns."""
    if hz:
        return tuple(_core.kernel_timer_delay_range_ns(ms, hz))
    ranges = [_core.kernel_timer_delay_range_ns(ms, h) for h in KERNEL_HZ_CHOICES]
    return min(r[0] for r in ranges), max(r[1] for r in ranges)


# How much longer than its bound a scenario waits for what it bounds afterwards: the wait
# only has to end; the assertion after it adds what a device may add (timer slack, tolerance,
# the measured stall) and says by how much a late device missed.
WAIT_PAST_BOUND_NS = 10 * 10**9


def _names(hosts) -> tuple[str, ...]:
    return (hosts,) if isinstance(hosts, str) else tuple(hosts)


def stalled_ns(lab, hosts, start_ns: int, end_ns: int) -> int:
    """How long the machines of hosts (a name or several) stood still in [start_ns, end_ns],
    summed (lab.stalled_ns each): a span that runs through several hosts, a round trip or a
    call into each host's agent, is late by at most the sum. 0 on the model."""
    return sum(int(lab.stalled_ns(h, start_ns, end_ns)) for h in _names(hosts))


def stood_still(lab, hosts, start_ns: int, end_ns: int) -> str:
    """For a failure message: "host a stood still 0.0 ms, host b 740.2 ms" in the span."""
    return ", ".join(f"host {h} stood still {lab.stalled_ns(h, start_ns, end_ns) / 1e6:.1f} ms"
                     for h in _names(hosts))


def late_bound_ns(lab, host, start_ns: int, end_ns: int, bound_ns: int,
                  timers: int = 1) -> int:
    """The most a span that kernel timers bound to bound_ns (exactly, on the model) may measure
    on lab, when host's timers ran it from start_ns to end_ns: + lab.timer_slack_ns per timer
    (softirq, workqueue, the event's way to the harness) + the time host's machine stood still
    in between (lab.stalled_ns: a TCG guest's vCPU on a loaded machine; 0 on the model). host:
    a name, or the names of every host the span runs through (their stalls summed).
    Measured, never guessed: a device late for any other reason fails the bound."""
    return bound_ns + timers * lab.timer_slack_ns + stalled_ns(lab, host, start_ns, end_ns)


def early_bound_ns(lab, host, start_ns: int, bound_ns: int, before_ns: int) -> int:
    """The least a span that kernel timers bound to bound_ns may measure on lab when it starts
    at an event read at start_ns: the read was late by up to lab.timer_slack_ns and the time
    host's machine stood still in the before_ns up to start_ns, and the span is short by as
    much (under stress-ng: TIMEWAIT measured 496 ms against the wheel's 512). Measured, as
    late_bound_ns."""
    return bound_ns - lab.timer_slack_ns - stalled_ns(lab, host, start_ns - before_ns, start_ns)


def late_span_bound_ns(lab, hosts, start_ns: int, end_ns: int, bound_ns: int) -> int:
    """The most a span the model times exactly (bound_ns) but no kernel timer bounds may
    measure on lab: CM events and round trips through hosts, the harness's calls into their
    agents. + lab.tolerance_ns (0 on the model) + the time the machines of hosts stood still
    from start_ns to end_ns (late_bound_ns with no timer)."""
    return late_bound_ns(lab, hosts, start_ns, end_ns, bound_ns + lab.tolerance_ns, timers=0)


def kernel_timer_period_ns(ms: int, hz: int) -> tuple[int, int]:
    """(shortest, longest) period of a kernel timer of ms re-armed each time it runs."""
    periods = [_core.kernel_timer_rearm_period_ns(ms, h) for h in ((hz,) if hz else
                                                                   KERNEL_HZ_CHOICES)]
    return min(periods), max(periods)


def cm_convert_to_ms(iba_time: int) -> int:
    """4.096 us * 2^t, approximated as cm.c does: 1 << max(t - 8, 0) ms."""
    return 1 << max(iba_time - 8, 0)


def cm_ack_timeout(ca_ack_delay: int, packet_life_time: int) -> int:
    """cm.c cm_ack_timeout: the local ACK timeout from the CA's ACK delay and the path's
    packet life time (each a 4.096 us * 2^t exponent), capped at 31."""
    ack_timeout = packet_life_time + 1
    if ack_timeout >= ca_ack_delay:
        ack_timeout += 1 if ca_ack_delay >= ack_timeout - 1 else 0
    else:
        ack_timeout = ca_ack_delay + (1 if ack_timeout >= ca_ack_delay - 1 else 0)
    return min(31, ack_timeout)


def iboe_packet_life_time(kernel_release: str) -> int:
    """cma.c's CMA_IBOE_PACKET_LIFETIME, the packet life time rdma_cm gives a RoCE path: 18
    up to 6.1 (Debian's 6.1.192), 16 from 6.2 on ("infiniband:cma: change iboe packet life
    time from 18 to 16", applied to rdma for-next 2022-12-07; 16 in Debian's 6.12.117 and
    7.2.13). It sets the CM REQ/DREQ timeout (2 * life + response) and TIMEWAIT (life + 1):
    6144 / 2048 ms on 6.1, 4608 / 512 ms from 6.2. Unknown release: 6.1's."""
    version = release_version(kernel_release)
    return 16 if version is not None and version >= (6, 2) else 18


@dataclasses.dataclass(frozen=True)
class IbCmTiming:
    cm_response_timeout: int = 20  # CMA_CM_RESPONSE_TIMEOUT
    max_cm_retries: int = 15       # CMA_MAX_CM_RETRIES
    packet_life_time: int = 18     # CMA_IBOE_PACKET_LIFETIME: iboe_packet_life_time()
    local_ca_ack_delay: int = 16   # ibv_device_attr.local_ca_ack_delay of both ends
    kernel_hz: int = 250           # the host's CONFIG_HZ (Debian amd64); 0 = unknown

    @classmethod
    def for_caps(cls, caps, **overrides) -> "IbCmTiming":
        overrides.setdefault("packet_life_time",
                             iboe_packet_life_time(getattr(caps, "kernel_release", "")))
        return cls(local_ca_ack_delay=caps.local_ca_ack_delay,
                   kernel_hz=getattr(caps, "kernel_hz", 0), **overrides)

    @property
    def active_timeout_ms(self) -> int:
        """ib_send_cm_req: 2 * packet life + the remote's response timeout."""
        return 2 * cm_convert_to_ms(self.packet_life_time) + \
            cm_convert_to_ms(self.cm_response_timeout)

    @property
    def passive_timeout_ms(self) -> int:
        """cm_req_handler: the REQ's local CM response timeout."""
        return cm_convert_to_ms(self.cm_response_timeout)

    @property
    def active_timeout_ns(self) -> int:
        return self.active_timeout_ms * NS_PER_MS

    @property
    def passive_timeout_ns(self) -> int:
        return self.passive_timeout_ms * NS_PER_MS

    @property
    def attempts(self) -> int:
        """mad.c: a send with `retries` retries goes out retries + 1 times."""
        return self.max_cm_retries + 1

    @property
    def retry_period_range_ns(self) -> tuple[int, int]:
        """Between two sends of a retried active-side MAD (REQ, DREQ): mad.c re-arms the
        timeout as the previous one runs, so the wheel gives the same period each time."""
        return kernel_timer_period_ns(self.active_timeout_ms, self.kernel_hz)

    @property
    def dreq_give_up_range_ns(self) -> tuple[int, int]:
        """DREQ from the active side with no DREP: every attempt times out, then DREQ_ERROR.
        The first timeout runs from an unknown phase of the wheel, the others a period apart."""
        first = kernel_timer_range_ns(self.active_timeout_ms, self.kernel_hz)
        period = self.retry_period_range_ns
        return (first[0] + (self.attempts - 1) * period[0],
                first[1] + (self.attempts - 1) * period[1])

    @property
    def dreq_give_up_ns(self) -> int:
        """The latest DREQ_ERROR may come after rdma_disconnect (the formula alone,
        attempts * timeout_ms, is the earliest bound the wheel never meets)."""
        return self.dreq_give_up_range_ns[1]

    @property
    def timewait_ms(self) -> int:
        """cm_enter_timewait: cm_convert_to_ms(av.timeout), where av.timeout is the local ACK
        timeout cm_ack_timeout(ack delay, packet life time)."""
        return cm_convert_to_ms(cm_ack_timeout(self.local_ca_ack_delay, self.packet_life_time))

    @property
    def timewait_range_ns(self) -> tuple[int, int]:
        """TIMEWAIT's length on the wheel: 2048 ms runs 2048-2304 ms later at HZ=250."""
        return kernel_timer_range_ns(self.timewait_ms, self.kernel_hz)

    @property
    def timewait_ns(self) -> int:
        """The longest TIMEWAIT lasts."""
        return self.timewait_range_ns[1]


def tcp_syn_give_up_range_ns(syn_retries: int, hz: int) -> tuple[int, int]:
    """(earliest, latest) a TCP connect that never gets a SYN-ACK fails with ETIMEDOUT after the
    SYN (Linux 6.1 tcp_write_timeout): the SYN and syn_retries retransmissions, each RTO
    (TCP_TIMEOUT_INIT 1 s, doubling) a timer on the wheel; the call gives up when the last RTO
    runs. (2^(n+1) - 1) s by the formula, up to ~4.9 s more at HZ=250 and n = 6."""
    lo = hi = 0
    for i in range(syn_retries + 1):
        a, b = kernel_timer_range_ns(1000 << i, hz)
        lo, hi = lo + a, hi + b
    return lo, hi


@dataclasses.dataclass(frozen=True)
class IwMpaTiming:
    """The iWARP provider's MPA timers, from the engine's personality table (one home:
    Personality::iw_mpa_reply_timeout_ms / iw_mpa_request_timeout_ms, personality.cc cites
    the drivers; docs/semantics.md F). siw: 10 s awaiting the reply (MPAREQ_TIMEOUT), 5 s
    awaiting the request (MPAREP_TIMEOUT); cxgb4: 60 s (ep_timeout_secs) for both.

        t = IwMpaTiming.for_caps(ctx.caps)
        lo, hi = t.reply_timeout_range_ns   # UNREACHABLE(-ETIMEDOUT) after the MPA request
    """
    reply_timeout_ms: int
    request_timeout_ms: int
    kernel_hz: int = 250

    @classmethod
    def for_caps(cls, caps) -> "IwMpaTiming":
        # caps.personality on a device is its driver: the personality that copies it has
        # the timers (the engine's driver facts)
        name = _core.personality_of_driver(caps.personality) or caps.personality
        reply_ms, request_ms = _core.iw_mpa_timeouts_ms(name)
        return cls(reply_ms, request_ms, getattr(caps, "kernel_hz", 0))

    @property
    def reply_timeout_range_ns(self) -> tuple[int, int]:
        """(earliest, latest) the active side's MPA timer runs after its MPA request."""
        return kernel_timer_range_ns(self.reply_timeout_ms, self.kernel_hz)

    @property
    def request_timeout_range_ns(self) -> tuple[int, int]:
        """(earliest, latest) the passive side's MPA timer runs after the TCP accept."""
        return kernel_timer_range_ns(self.request_timeout_ms, self.kernel_hz)
