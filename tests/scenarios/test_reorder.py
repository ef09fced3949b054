"""Reordering on the wire (issue 5: the same rule on every backend). RC over BTH delivers in
PSN order: a SEND that arrives after the one behind it is a sequence error, the responder NAKs
(NAK_SEQ, IBA 9.7.5.2.2) and the requester goes back to the lost PSN; every message still
lands once and in order. iWARP runs over TCP, which hides reordering from the RDMA layer."""

import pytest

from rdmalab import checks, ms, sec
from rdmalab.resources import RCPair


@pytest.mark.requires(transport=["IB", "RoCE"])
def test_reordered_send_is_retransmitted_and_lands_once_in_order(lab):
    pair = RCPair(lab)
    a, b = pair.a, pair.b
    naks = lab.faults.watch(opcode="ACKNOWLEDGE", syndrome="NAK_SEQ", src_host="b")
    rule = lab.faults.reorder(opcode="SEND_ONLY", src_host="a", count=1, hold_ns=ms(100))
    a.mr.write(0, b"first...second..")
    for i in range(2):
        b.post_recv(length=8, offset=8 * i, wr_id=20 + i)
    for i in range(2):
        a.post_send(length=8, offset=8 * i, wr_id=10 + i)
    bound = sec(1) + lab.tolerance_ns
    assert b.wait_completions(2, bound) and a.wait_completions(2, bound), \
        "the reordered SENDs did not both complete"
    assert rule.hits == 1, f"the reorder rule took {rule.hits} packets"
    assert naks.hits >= 1, "no NAK_SEQ from the responder for the sequence gap"
    assert b.mr.read(0, 16) == b"first...second..", "messages landed out of order"
    held = checks.holds_released(lab.history())
    assert held, held
    for side in (a, b):
        ledger = side.traffic.check()
        assert ledger.exactly_once(), ledger.violations
        assert all(wc.status == "SUCCESS" for wc in side.traffic.completions())
