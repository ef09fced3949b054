"""Reordering on the wire (issue 5: the same rule on every backend). RC over BTH delivers in
PSN order: a SEND that arrives after the one behind it is a sequence error, the responder NAKs
(NAK_SEQ, IBA 9.7.5.2.2) and the requester goes back to the lost PSN; every message still
lands once and in order. iWARP runs over TCP, which hides reordering from the RDMA layer."""

import pytest

from rdmalab.run import checks
from rdmalab import sec
from rdmalab.api.resources import RCPair

# The reorder rule holds the first SEND until the next frame of its flow (a's packets to b's
# QP) has passed, or until hold_ns (faults/rules.h; the model's fabric does the same). The gap
# needs that next frame to be the second SEND. On a device the two posts are two calls into
# a's agent, which a loaded TCG guest can take hundreds of ms over: a deadline of 100 ms (the
# switch's default) then let the first SEND go alone, in order, and so did a's retransmission
# of it after the QP's transport timeout (14, the default: 4.096 us * 2^14 = 67 ms), being the
# next frame of the flow itself. Both are far past any such wait here, so the second SEND is
# the next frame whatever the timing; each is only a backstop.
HOLD_NS = sec(10)
TRANSPORT_TIMEOUT = 20  # 4.096 us * 2^20 = 4.3 s before a retransmits the held SEND


def release_causes(history) -> list:
    """How each held packet went on: "next frame" (right after the next frame of its flow),
    "deadline" (hold_ns passed), as the model's fabric or the fault switch recorded it
    (rdmalab.faults.records)."""
    causes = []
    for r in history:
        by = r["data"].get("released_by") if r["kind"] == "reorder_release" else None
        if by in ("packet", "deadline", "dropped_at_shutdown"):  # not a delay's end
            causes.append("next frame" if by == "packet" else by)
    return causes


@pytest.mark.requires(transport=["IB", "RoCE"])
def test_reordered_send_is_retransmitted_and_lands_once_in_order(lab):
    pair = RCPair(lab, params={"timeout": TRANSPORT_TIMEOUT})
    a, b = pair.a, pair.b
    naks = lab.faults.watch(opcode="ACKNOWLEDGE", syndrome="NAK_SEQ", src_host="b")
    rule = lab.faults.reorder(opcode="SEND_ONLY", src_host="a", count=1, hold_ns=HOLD_NS)
    a.mr.write(0, b"first...second..")
    for i in range(2):
        b.post_recv(length=8, offset=8 * i, wr_id=20 + i)
    for i in range(2):
        a.post_send(length=8, offset=8 * i, wr_id=10 + i)
    bound = sec(1) + lab.tolerance_ns
    assert b.wait_completions(2, bound) and a.wait_completions(2, bound), \
        "the reordered SENDs did not both complete"
    assert rule.hits == 1, f"the reorder rule took {rule.hits} packets"
    history = lab.history()
    assert release_causes(history) == ["next frame"], \
        f"the held SEND went on by {release_causes(history)}, not after the second SEND: " \
        "no sequence gap was made"
    assert naks.hits >= 1, "no NAK_SEQ from the responder for the sequence gap"
    assert b.mr.read(0, 16) == b"first...second..", "messages landed out of order"
    held = checks.holds_released(history)
    assert held, held
    for side in (a, b):
        ledger = side.traffic.check()
        assert ledger.exactly_once(), ledger.violations
        assert all(wc.status == "SUCCESS" for wc in side.traffic.completions())
