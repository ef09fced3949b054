"""The IB CM's timers as the kernel computes them (drivers/infiniband/core/cm.c, cma.c;
docs/semantics.md A). Scenarios derive their time bounds from these, on every backend, so a
device that keeps other time shows up as a failed bound, not a silently wider one.

    t = IbCmTiming.for_caps(ctx.caps)          # cma.c defaults: 20 / 15 / 16
    t.dreq_give_up_ns                          # DISCONNECTED(-ETIMEDOUT) after every DREP lost
"""

from __future__ import annotations

import dataclasses

NS_PER_MS = 1_000_000


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


@dataclasses.dataclass(frozen=True)
class IbCmTiming:
    cm_response_timeout: int = 20  # CMA_CM_RESPONSE_TIMEOUT
    max_cm_retries: int = 15       # CMA_MAX_CM_RETRIES
    packet_life_time: int = 18     # CMA_IBOE_PACKET_LIFETIME (Linux 6.1 cma.c; 16 before)
    local_ca_ack_delay: int = 16   # ibv_device_attr.local_ca_ack_delay of both ends

    @classmethod
    def for_caps(cls, caps, **overrides) -> "IbCmTiming":
        return cls(local_ca_ack_delay=caps.local_ca_ack_delay, **overrides)

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
    def dreq_give_up_ns(self) -> int:
        """DREQ from the active side with no DREP: every attempt times out, then DREQ_ERROR."""
        return self.attempts * self.active_timeout_ns

    @property
    def timewait_ns(self) -> int:
        """cm_enter_timewait: cm_convert_to_ms(av.timeout), where av.timeout is the local ACK
        timeout cm_ack_timeout(ack delay, packet life time)."""
        return cm_convert_to_ms(cm_ack_timeout(self.local_ca_ack_delay,
                                               self.packet_life_time)) * NS_PER_MS
