"""QP_FATAL on a real device, raised by the wire (seed 002 on siw): a SEND whose DDP header
fails siw's receive checks (an untagged queue number other than 0: siw_send_check_ntoh, Linux
6.1) makes siw raise QP_FATAL at the receiver. Fired while the receiver's owner destroys the
QP, the user-visible contract holds: destroy returns, nothing hangs, no event reaches a handler
after destroy returns, every event read is acked.

The corruption is a switch rule (layer "ddp", byte 9 = the low byte of the DDP queue number,
with the TCP checksum recomputed so the segment reaches siw); the model's fabric has no corrupt
action (its QP_FATAL scenarios inject the event instead: test_qp_fatal_destroy)."""

import pytest

from rdmalab.run import checks
from rdmalab import ms, sec
from rdmalab.api.resources import RCPair
from rdmalab.api.stack import Dispatcher

pytestmark = pytest.mark.requires(transport="iWARP", event="QP_FATAL")

# How long after the poisoned SEND the destroy starts: from "before it can arrive" to "after
# the event was surely raised", so some runs land the event mid-destroy.
OFFSETS_NS = [0, ms(1), ms(2), ms(5), ms(10), ms(20)]


def corrupt_next_send(lab):
    return lab.faults.corrupt(rdmap_opcode="SEND", src_host="a", layer="ddp", offset=9,
                              xor=0x01, count=1)


def test_corrupt_ddp_header_raises_qp_fatal(lab):
    pair = RCPair(lab)
    a, b = pair.a, pair.b
    seen = []
    b.post_recv(length=64)
    with Dispatcher(lab, b.ctx) as d:
        d.watch(b.qp, lambda ev: seen.append(ev.type))
        rule = corrupt_next_send(lab)
        a.post_send(length=64)
        assert d.wait_event(b.qp, "QP_FATAL", timeout_ns=sec(2) + lab.tolerance_ns), \
            f"no QP_FATAL at b after a corrupted DDP header (switch acted {rule.hits} times)"
    assert rule.hits == 1
    assert seen[0] == "QP_FATAL"


@pytest.mark.parametrize("offset_ns", OFFSETS_NS, ids=[f"{o // 10**6}ms" for o in OFFSETS_NS])
def test_qp_fatal_from_the_wire_mid_destroy(lab, offset_ns):
    pair = RCPair(lab)
    a, b = pair.a, pair.b
    calls = []
    b.post_recv(length=64)
    with Dispatcher(lab, b.ctx) as d:
        d.watch(b.qp, lambda ev: calls.append((ev.type, lab.now_ns)))
        corrupt_next_send(lab)
        a.post_send(length=64)
        if offset_ns:
            lab.sleep(offset_ns)
        d.destroy(b.qp, timeout_ns=sec(2))     # must return, whatever the event does
        returned = lab.now_ns
        lab.sleep(ms(50))                      # a late event would show here
        stats = d.stats()
    assert b.qp.destroyed
    assert all(t <= returned for _, t in calls), f"handler ran after destroy returned: {calls}"
    assert stats.read == stats.delivered + stats.dropped, f"an event read was not settled: {stats}"
    result = checks.no_handler_after_destroy(lab.history())
    assert result.valid, str(result)
