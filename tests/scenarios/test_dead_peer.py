"""A dead peer: every packet from b is lost, so a's SEND is retried retry_cnt times, each after
the transport timeout (4.096 us x 2^timeout), and then completes with RETRY_EXC_ERR (IBA
9.7.6.1.3). By the IB specification and ibv_modify_qp(3) only rnr_retry 7 means "retry for
ever"; retry_cnt 7 is seven retries. rxe treats retry_cnt 7 as infinite (rxe_comp.c), and the
model's roce personality, which stands in for rxe, does the same: both are the finding."""

import pytest

from rdmalab import ms, sec
from rdmalab.api.cm_timing import stalled_ns
from rdmalab.api.resources import RCPair

TIMEOUT = 10                           # 4.096 us x 2^10 = 4.2 ms per try
TRY_NS = 4096 * 2**TIMEOUT
WARM_UPS = 3


def dead_peer_send(lab, retry_cnt: int, wait_ns: int):
    """Connects a and b, kills b's half of the wire, posts one SEND on a; returns a's
    completions after waiting up to wait_ns for the second (the first is the warm-up)."""
    for _ in range(WARM_UPS):
        pair = RCPair(lab, params={"timeout": TIMEOUT, "retry_cnt": retry_cnt})
        a, b = pair.a, pair.b
        b.post_recv(length=64)
        t0 = lab.now_ns
        a.post_send(length=64)
        assert a.wait_completions(1, timeout_ns=sec(1)), "the connection does not carry data"
        warm_up = a.traffic.completions()[0]
        if warm_up.ok:
            break
        # The warm-up's tries (retry_cnt + 1 of 4.2 ms) can run out while b's machine stands
        # still (a TCG guest on a loaded host: 275 ms once): b was dead for that long, which
        # is this scenario's outcome, not its start. A fresh pair then; any other cause fails.
        window, stood = (retry_cnt + 1) * TRY_NS, stalled_ns(lab, "b", t0, lab.now_ns)
        assert warm_up.status == "RETRY_EXC_ERR" and stood >= window, (
            f"the warm-up SEND completed {warm_up.status} while b stood still "
            f"{stood / 1e6:.1f} ms (its tries take {window / 1e6:.1f} ms)")
    else:
        pytest.fail(f"b stood still through each of {WARM_UPS} warm-up SENDs' tries")
    lab.faults.drop(src_host="b")      # the peer is dead: no ACK, no NAK
    a.post_send(length=64)
    a.wait_completions(2, timeout_ns=wait_ns)
    return a.traffic.completions()


@pytest.mark.requires(transport=["IB", "RoCE"])
def test_dead_peer_with_retry_cnt_3_ends_in_retry_exc_err(lab):
    bound = 4 * TRY_NS
    wcs = dead_peer_send(lab, 3, 10 * bound + ms(100) + lab.tolerance_ns)
    assert len(wcs) == 2, "no completion for the SEND to a dead peer"
    assert wcs[-1].status == "RETRY_EXC_ERR"


@pytest.mark.requires(transport=["IB", "RoCE"])
@pytest.mark.finding("rxe-retry-cnt-7-is-infinite")
def test_dead_peer_with_retry_cnt_7_ends_in_retry_exc_err(lab):
    bound = 8 * TRY_NS
    wcs = dead_peer_send(lab, 7, 10 * bound + ms(100) + lab.tolerance_ns)
    assert len(wcs) == 2, (f"no completion {(10 * bound + ms(100)) / 1e6:.0f} ms after the "
                           "SEND to a dead peer with retry_cnt 7 (8 tries take "
                           f"{bound / 1e6:.0f} ms)")
    assert wcs[-1].status == "RETRY_EXC_ERR"
