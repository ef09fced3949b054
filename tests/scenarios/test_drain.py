"""Seed 000 (Steve Wise, 2015): draining a QP safely on IB and iWARP.

Contract asserted on every device: after the drain every posted WR completed exactly once
(success or WR_FLUSH_ERR), flushes came in posting order per work queue, the drain finished
within its bound, and it took the portable path the provider allows: markers where posts in
ERR are flushed, counting where they are refused (user-space libcxgb4).
"""

import pytest

from rdmalab import SRQ_OCCUPANCY, ms, sec
from rdmalab.api.cm_timing import late_bound_ns, stood_still
from rdmalab.api.resources import RCPair

N = 128                 # WRs posted on each queue
DRAIN_BOUND_NS = ms(100)  # a drain is local work: flushes, no wire round trips


def expected_method(caps) -> str:
    # refuse (libcxgb4) and strand (user-space siw): a marker would fail or never complete.
    return "counting" if caps.err_post in ("refuse", "strand") else "marker"


def assert_exactly_once(player, still_queued=0):
    """still_queued: receives legitimately waiting in an SRQ (they belong to the SRQ, not to
    a drained QP, so they have no outcome yet)."""
    report = player.traffic.check()
    assert not report.violations, f"{player}: ledger violations {report.violations}"
    assert report.unknown == still_queued, f"{player}: {report.unknown} WRs with no outcome"
    accounted = report.succeeded + report.flushed + report.errored + report.implied
    accounted += still_queued
    assert accounted == report.posted, f"{player}: {accounted} outcomes for {report.posted} posts"
    return report


def timed_drain(lab, player, **kw):
    """player.drain(**kw) and the lab times the call began and returned (the drain measures
    itself, report.elapsed_ns, inside that window on the player's host)."""
    start = lab.now_ns
    report = player.drain(**kw)
    return report, start, lab.now_ns


def assert_drain_in_time(lab, player, timed, took_time=False):
    """A drain is local work: within DRAIN_BOUND_NS, exactly on the model; on a device + the
    time the player's machine stood still while it ran (a TCG guest's vCPU on a loaded
    machine), measured (lab.stalled_ns), never a guessed tolerance. took_time: it had work to
    do, so it took some time."""
    report, start, end = timed
    host = player.host.name
    bound = late_bound_ns(lab, host, start, end, DRAIN_BOUND_NS, timers=0)
    assert report.elapsed_ns > 0 or not took_time, f"{player}: a drain with work took no time"
    assert report.elapsed_ns < bound, \
        f"{player}: the drain took {report.elapsed_ns / 1e6:.1f} ms; under " \
        f"{bound / 1e6:.1f} ms ({DRAIN_BOUND_NS / 1e6:.0f} ms + the time {host} stood still: " \
        f"{stood_still(lab, host, start, end)})"


def warm_up(pair, n=N // 4):
    """b gets 2n receives; a sends n of them and waits: the connection works, and b keeps n
    receives for the burst that follows."""
    a, b = pair.a, pair.b
    b.post_recv(length=64, count=2 * n)
    a.post_send(length=64, count=n)
    assert a.wait_completions(n, timeout_ns=sec(2)), "warm-up SENDs did not complete"
    assert all(wc.status == "SUCCESS" for wc in a.traffic.completions())
    # Where a SEND completes when handed to TCP (siw) it may not have arrived yet.
    a.lab.sleep(ms(50))


def test_drain_with_many_outstanding_wrs(lab):
    """A burst of SENDs (all with a receive waiting at b) and N receives nobody will consume,
    drained at once: every WR ends exactly once, whether it completed or was flushed."""
    pair = RCPair(lab, max_send_wr=N + 1, max_recv_wr=N + 1, cqe=4 * N)
    caps = pair.a.ctx.caps
    warm_up(pair)
    a = pair.a
    a.post_recv(length=64, count=N)
    a.post_send(length=64, count=N // 4)

    timed = timed_drain(lab, a, timeout_ns=sec(1))
    report = timed[0]

    assert report.complete, f"drain did not finish: {report.detail}"
    assert report.method == expected_method(caps), report.detail
    assert report.outstanding_rq == N
    assert report.outstanding_sq <= N // 4
    assert report.flushed >= N
    assert report.order_kept
    assert_drain_in_time(lab, a, timed, took_time=True)
    assert_exactly_once(a)
    if caps.reports_qp_state:  # siw does not (test_qp_state)
        assert a.qp.state == "ERR"


@pytest.mark.requires(transport=["IB", "RoCE"])
def test_drain_sends_waiting_on_rnr(lab):
    """SENDs beyond the peer's receives wait on RNR NAKs (rnr_retry 7: forever), so they are
    certainly outstanding at the drain; they must flush, in order, exactly once."""
    pair = RCPair(lab, max_send_wr=N + 1, max_recv_wr=N + 1, cqe=4 * N)
    warm_up(pair)                      # leaves b with N/4 receives
    a = pair.a
    a.post_send(length=64, count=N // 2)
    assert a.wait_completions(N // 4, timeout_ns=sec(1))
    timed = timed_drain(lab, a, timeout_ns=sec(1))
    report = timed[0]
    assert report.complete, report.detail
    assert report.outstanding_sq == N // 4, "the SENDs past b's receives should wait on RNR"
    assert report.flushed == N // 4
    assert report.order_kept
    assert_drain_in_time(lab, a, timed)
    assert_exactly_once(a)


@pytest.mark.finding("siw-send-completes-on-tcp-handoff")
def test_drain_with_the_wire_cut(lab):
    """Every packet from a is dropped: its SENDs wait for ACKs that never come, and the drain
    flushes them long before the retry budget runs out. Where a SEND completes when handed to
    the transport (siw: local delivery to TCP, siw_qp_tx.c), every SEND completes SUCCESS
    although nothing arrives, and the drain flushes none of them."""
    from rdmalab import FaultNotSupported

    pair = RCPair(lab, max_send_wr=N + 1, max_recv_wr=N + 1, cqe=4 * N)
    warm_up(pair)
    a = pair.a
    try:
        lab.faults.drop(src_host="a")
    except FaultNotSupported as e:
        pytest.skip(f"needs a wire fault: {e}")
    a.post_send(length=64, count=N // 4)
    lab.run_for(ms(1))                 # retransmissions under way, nothing acknowledged
    report = a.drain(timeout_ns=sec(1))
    assert report.complete, report.detail
    assert report.outstanding_sq == N // 4
    if a.ctx.caps.send_completes_on_handoff:
        assert report.succeeded == N // 4 and report.flushed == 0, \
            f"{report.succeeded} SUCCESS, {report.flushed} flushed: handed to TCP is complete"
    else:
        assert report.flushed == N // 4
    assert report.order_kept
    assert_exactly_once(a)
    # One packet per SEND on IB and RoCE; TCP (iWARP) packs FPDUs into segments as it likes,
    # so there at least one segment of them was on the wire and dropped.
    dropped = lab.faults.counts().get("drop", 0)
    assert dropped >= (1 if a.ctx.caps.transport == "iWARP" else N // 4), dropped


def test_drain_of_an_idle_qp_is_immediate(lab):
    pair = RCPair(lab)
    timed = timed_drain(lab, pair.a, timeout_ns=sec(1))
    report = timed[0]
    assert report.complete
    assert report.outstanding_sq == report.outstanding_rq == 0
    assert report.flushed == 0
    assert_drain_in_time(lab, pair.a, timed)
    assert_exactly_once(pair.a)


def test_both_sides_drain_after_traffic(lab):
    pair = RCPair(lab, max_send_wr=N + 1, max_recv_wr=N + 1, cqe=4 * N)
    warm_up(pair)
    reports = [pair.a.drain(timeout_ns=sec(1)), pair.b.drain(timeout_ns=sec(1))]
    for player, report in zip(pair.players, reports):
        assert report.complete, f"{player}: {report.detail}"
        assert report.order_kept
        assert_exactly_once(player)
    # b never polled before its drain: it reaps the N/4 receives the warm-up consumed and
    # flushes the N/4 left (the report leaves the drain's own markers out).
    assert (reports[1].succeeded, reports[1].flushed) == (N // 4, N // 4)


@pytest.mark.requires("srq")
def test_drain_srq_attached_qp(lab):
    """ib_drain_qp drains only the SQ of an SRQ-attached QP; the RQ side ends with
    QP_LAST_WQE_REACHED where the device raises it (rxe raises none: the drain says so)."""
    from rdmalab.api.stack import Dispatcher

    pair = RCPair(lab, srq=True, max_send_wr=N + 1, max_recv_wr=N + 1, cqe=4 * N)
    caps = pair.b.ctx.caps
    a, b = pair.a, pair.b
    b.post_recv(length=64, count=N // 2)  # to b's SRQ
    a.post_recv(length=64, count=N // 4)  # to a's SRQ
    a.post_send(length=64, count=N // 4)
    assert b.wait_completions(N // 4, timeout_ns=sec(2))
    b.post_send(length=64, count=N // 4)  # a burst from b, drained at once

    with Dispatcher(lab, b.ctx) as dispatcher:
        dispatcher.watch(b.qp, lambda ev: None)
        report = b.drain(timeout_ns=sec(1), dispatcher=dispatcher)

    assert report.srq_attached
    assert report.complete, report.detail
    assert report.outstanding_sq <= N // 4
    assert report.order_kept
    raises = caps.raises_event("QP_LAST_WQE_REACHED")
    if raises is True:
        assert report.last_wqe_reached, report.detail
    elif raises is False:
        assert not report.last_wqe_reached
        assert "LAST_WQE_REACHED" in report.detail
    # The SRQ's unconsumed receives belong to the SRQ, not to the drained QP: the ledger has
    # no outcome for exactly those. (The model also reports the SRQ's occupancy; libibverbs
    # has no verb for it.)
    still_queued = N // 2 - N // 4
    if lab.has(SRQ_OCCUPANCY):
        assert b.srq.outstanding == still_queued
    assert_exactly_once(b, still_queued=still_queued)


@pytest.mark.requires(transport="iWARP")
def test_iwarp_closing_with_outstanding_sends_goes_to_error(lab):
    """iWARP SQD is RDMAC CLOSING: the SQ must be quiesced first; with SQ WRs outstanding
    the QP goes to ERROR and the drain completes (seed 000). b has its receives posted and
    every packet from a is lost, so the SENDs stay outstanding where the provider waits for
    the peer; where a SEND completes when handed to TCP (siw) they complete at once, and SQD
    is an orderly CLOSING."""
    from rdmalab import FaultNotSupported

    pair = RCPair(lab, max_send_wr=N + 1, max_recv_wr=N + 1, cqe=4 * N)
    a, b = pair.a, pair.b
    b.post_recv(length=64, count=8)
    try:
        lab.faults.drop(src_host="a")
    except FaultNotSupported as e:
        pytest.skip(f"needs a wire fault: {e}")
    a.post_send(length=64, count=8)
    lab.run_for(ms(1))                    # on the wire, nothing acknowledged
    handoff = a.ctx.caps.send_completes_on_handoff
    if handoff:
        assert a.wait_completions(8), "SENDs handed to TCP did not complete"
        assert all(wc.status == "SUCCESS" for wc in a.traffic.completions()), \
            "a SEND handed to TCP completed with an error"
    a.qp.modify(qp_state="SQD")
    state_after_sqd = a.qp.state
    report = a.drain(timeout_ns=sec(1))
    assert report.complete, report.detail
    assert report.flushed == (0 if handoff else 8)
    assert_exactly_once(a)
    if a.ctx.caps.reports_qp_state:  # siw does not (test_qp_state)
        assert state_after_sqd == ("SQD" if handoff else "ERR")


@pytest.mark.requires(transport="iWARP")
@pytest.mark.finding("siw-user-posts-in-error-are-never-flushed")
def test_iwarp_send_without_receive_terminates(lab):
    """A SEND that finds no receive at an iWARP responder is a DDP error (RFC 5041, no RNR):
    the responder TERMINATEs (siw_proc_send -> DDP_ECODE_UT_INVALID_MSN_NOBUF), both QPs go to
    ERROR and both ids get DISCONNECTED. SENDs posted afterwards must complete with
    WR_FLUSH_ERR (a post to a QP in ERROR is flushed)."""
    from rdmalab.api.resources import CmPair

    pair = CmPair(lab)
    client, server = pair.client, pair.server
    client.post_send(length=64)          # the server posted no receive
    bound = sec(1) + lab.tolerance_ns
    server.conn.wait("DISCONNECTED", bound)
    client.conn.wait("DISCONNECTED", bound)
    for side in (client, server):
        if side.ctx.caps.reports_qp_state:
            assert side.qp.state == "ERR", f"{side}: {side.qp.state} after the TERMINATE"
    client.wait_completions(1)           # the first SEND: SUCCESS (handoff) or an error
    before = len(client.traffic.completions())
    if client.ctx.caps.err_post == "refuse":   # libcxgb4: a post in ERROR fails (EINVAL)
        from rdmalab import Error
        with pytest.raises(Error) as err:
            client.post_send(length=64)
        assert err.value.errno_name == "EINVAL"
        pair.close()
        return
    client.post_send(length=64, count=4)
    assert client.wait_completions(4), "SENDs posted in ERROR never completed"
    late = client.traffic.completions()[before:]
    assert [wc.status for wc in late] == ["WR_FLUSH_ERR"] * 4
    pair.close()


@pytest.mark.requires(transport="iWARP")
def test_iwarp_no_post_in_closing(lab):
    from rdmalab import Error

    pair = RCPair(lab)
    pair.a.qp.modify(qp_state="SQD")      # nothing outstanding: an orderly CLOSING
    with pytest.raises(Error) as err:
        pair.a.post_send(length=64)
    assert err.value.verb == "ibv_post_send"
    assert pair.a.traffic.check().posted == 0


@pytest.mark.requires(transport=["IB", "RoCE"])
@pytest.mark.finding("rxe-user-recvs-posted-in-error-are-never-flushed")
def test_recv_posted_in_err_is_flushed(lab):
    """Seed 000, found again by the differential swarm (issue 17: schedule seed 3 on rxe, a
    drain then RECVs posted on its QP): a RECV posted to a QP already in ERR completes with
    WR_FLUSH_ERR, as one outstanding at the move to ERR does. __ib_drain_rq relies on it:
    move the QP to ERR, post a RECV, block until its completion."""
    a = RCPair(lab).a
    a.post_recv(wr_id=1)
    a.qp.modify(qp_state="ERR")
    assert a.wait_completions(1, sec(1) + lab.tolerance_ns), \
        "the RECV outstanding at the move to ERR was not flushed"
    before = len(a.traffic.completions())
    a.post_recv(wr_id=2)
    assert a.wait_completions(1, sec(2) + lab.tolerance_ns), \
        "a RECV posted in ERR never completed"
    late = a.traffic.completions()[before:]
    assert [(wc.wr_id, wc.status) for wc in late] == [(2, "WR_FLUSH_ERR")]
