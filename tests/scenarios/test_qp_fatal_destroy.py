"""Seed 002 (mana_ib QP error events, 2024) and seed 001's per-id queue: QP_FATAL dispatched
while the QP is destroyed.

Contract: no event reaches a handler after destroy returns; destroy waits for a handler that
is running; events of one QP are handled one at a time in arrival order; a QPN handed out
again (mana) never receives the old QP's event.
"""

import pytest

from rdmalab.run import checks
from rdmalab import ms, sec
from rdmalab.api.resources import Player
from rdmalab.api.stack import Dispatcher

pytestmark = pytest.mark.requires(event="QP_FATAL")

HANDLER_NS = ms(5)  # a slow handler: still running when destroy starts


class Recorder:
    """A handler that notes what it got and when, optionally taking HANDLER_NS."""

    def __init__(self, lab, slow=False):
        self.lab, self.slow, self.calls = lab, slow, []

    def __call__(self, ev):
        self.calls.append((ev.type, ev.qp_num, self.lab.now_ns))
        if self.slow:
            self.lab.sleep(HANDLER_NS)


def player(lab, host="a", **kw):
    return Player(lab, host, **kw)


def test_destroy_waits_for_a_running_handler(lab):
    p = player(lab)
    handler = Recorder(lab, slow=True)
    with Dispatcher(lab, p.ctx) as d:
        d.watch(p.qp, handler)
        lab.faults.inject_async_event("a", "QP_FATAL", p.qp.qp_num)
        lab.wait_until(lambda: handler.calls, ms(10), "the QP_FATAL handler to start")
        started = handler.calls[0][2]
        d.destroy(p.qp, timeout_ns=sec(1))
        returned = lab.now_ns

    assert returned >= started + HANDLER_NS, "destroy returned while the handler still ran"
    history = lab.history()
    for check in (checks.destroy_waits_for_handlers, checks.no_handler_after_destroy):
        result = check(history)
        assert result.valid, str(result)
    assert p.qp.destroyed


def test_qp_fatal_fired_mid_destroy_never_reaches_the_handler_afterwards(lab):
    p = player(lab)
    handler = Recorder(lab)
    fired = []

    def fire_at_destroy(call):
        # The timing fault: QP_FATAL raised by the device while ibv_destroy_qp is in flight.
        lab.faults.inject_async_event(call.host, "QP_FATAL", call.qp_num)
        fired.append(lab.now_ns)

    lab.faults.on_verb(fire_at_destroy, verb="ibv_destroy_qp")
    with Dispatcher(lab, p.ctx) as d:
        d.watch(p.qp, handler)
        d.destroy(p.qp, timeout_ns=sec(1))
        returned = lab.now_ns
        lab.run_for(ms(50))  # anything late has had time to arrive

    assert fired, "the fault never fired"
    assert not [c for c in handler.calls if c[2] >= returned], handler.calls
    result = checks.no_handler_after_destroy(lab.history())
    assert result.valid, str(result)
    assert lab.faults.counts().get("async_event", 0) >= 1


def test_event_queued_when_destroy_starts_is_dropped_and_acked(lab):
    """The event thread has read QP_FATAL but its handler has not started when destroy
    begins: the dispatcher drops it (and acks it, so the backend destroy does not block)."""
    p = player(lab)
    busy, victim = Recorder(lab, slow=True), Recorder(lab)
    other_qp = p.ctx.create_qp(p.pd, "RC", cq=p.cq)
    with Dispatcher(lab, p.ctx, workers=1) as d:
        # One worker, kept busy by another QP's slow handler: the victim's event waits in its queue.
        d.watch(other_qp, busy)
        d.watch(p.qp, victim)
        lab.faults.inject_async_event("a", "QP_FATAL", other_qp.qp_num)
        lab.wait_until(lambda: busy.calls, ms(10), "the busy handler to start")
        lab.faults.inject_async_event("a", "QP_FATAL", p.qp.qp_num)
        lab.wait_until(lambda: d.count_events(p.qp, "QP_FATAL") == 1, ms(10),
                       "the victim's QP_FATAL to be read")
        d.destroy(p.qp, timeout_ns=sec(1))
        lab.run_for(ms(20))
        stats = d.stats()

    assert victim.calls == []
    assert stats.dropped >= 1
    assert checks.records(lab.history(), "event_dropped_after_destroy")


def test_events_of_one_qp_are_serialized_in_order(lab):
    p = player(lab)
    handler = Recorder(lab, slow=True)
    with Dispatcher(lab, p.ctx, workers=3) as d:
        d.watch(p.qp, handler)
        for _ in range(4):
            lab.faults.inject_async_event("a", "QP_FATAL", p.qp.qp_num)
        lab.wait_until(lambda: len(handler.calls) == 4, sec(1), "four QP_FATAL handlers")
        lab.run_for(HANDLER_NS)
        assert d.stats().max_concurrent_per_object == 1
        d.destroy(p.qp, timeout_ns=sec(1))
    starts = [c[2] for c in handler.calls]
    assert all(b - a >= HANDLER_NS for a, b in zip(starts, starts[1:])), starts
    result = checks.handlers_serialized(lab.history())
    assert result.valid, str(result)


def test_reused_qpn_never_receives_the_old_qps_event(lab):
    """A LIFO device (caps.qpn_policy: mana) hands a freed QPN to the next create. An EQE for
    the old QP still waiting in the event queue when it is destroyed must not reach the QP
    that gets its number."""
    p = player(lab)
    old_qp, old_qpn = p.qp, p.qp.qp_num
    old_handler, new_handler = Recorder(lab), Recorder(lab)
    with Dispatcher(lab, p.ctx) as d:
        d.watch(old_qp, old_handler)
        # The EQE is raised now; the driver gets to it 2 ms later, after the destroy.
        lab.faults.inject_async_event("a", "QP_FATAL", old_qpn, driver_delay_ns=ms(2))
        d.destroy(old_qp, timeout_ns=sec(1))
        new_qp = p.ctx.create_qp(p.pd, "RC", cq=p.cq)
        if p.ctx.caps.qpn_policy == "lifo":
            assert new_qp.qp_num == old_qpn, "a LIFO device hands the freed QPN to the next create"
        d.watch(new_qp, new_handler)
        lab.run_for(ms(20))
        assert old_handler.calls == [] and new_handler.calls == [], (old_handler.calls,
                                                                      new_handler.calls)
        # Positive control: an event raised for the new QP does reach its handler.
        lab.faults.inject_async_event("a", "QP_FATAL", new_qp.qp_num)
        lab.wait_until(lambda: new_handler.calls, ms(10), "the new QP's own QP_FATAL")
        d.destroy(new_qp, timeout_ns=sec(1))
    assert [c[:2] for c in new_handler.calls] == [("QP_FATAL", new_qp.qp_num)]
    dropped = checks.records(lab.history(), "eqe_dropped", host="a")
    assert dropped, "the old QP's EQE should be recorded as dropped by the driver"


def test_destroy_with_an_unacked_event_is_refused_not_hung(lab):
    """rdma-core's destroy waits for acks of events it reported; the engine turns that wait
    into EBUSY at the deadline instead of a hang."""
    from rdmalab import Error

    p = player(lab)
    lab.faults.inject_async_event("a", "QP_FATAL", p.qp.qp_num)
    ev = p.ctx.get_async_event(timeout_ns=ms(10))
    assert ev is not None and ev.type == "QP_FATAL"
    with pytest.raises(Error) as err:
        p.qp.destroy(timeout_ns=ms(5))
    assert err.value.verb == "ibv_destroy_qp" and err.value.errno_name == "EBUSY"
    p.ctx.ack_async_event(ev)
    p.qp.destroy(timeout_ns=ms(5))
    assert p.qp.destroyed
