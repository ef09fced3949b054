"""Connection management (semantics.md A, B, F; seeds 001 and 004) through rdma_cm.

Every scenario asserts the event sequence of each id and, where the protocol has timers, the
time bound computed from the kernel's formulas (rdmalab.api.cm_timing)."""

import threading
import time

import pytest

from rdmalab import CM_PROTOCOL_STATE, VIRTUAL_TIME, Error, FaultNotSupported, ms, sec
from rdmalab.run import checks
from rdmalab.api.cm_timing import (WAIT_PAST_BOUND_NS, IbCmTiming, early_bound_ns, late_bound_ns,
                                   late_span_bound_ns, stood_still, tcp_syn_give_up_range_ns)
from rdmalab.api.resources import CmPair

IB_FAMILY = ["IB", "RoCE"]


def names(conn):
    return [e.name for e in conn.events]


def is_iwarp(lab):
    return lab.host("a").caps().transport == "iWARP"


def assert_soon(lab, ev, what, t0, bound_ns, hosts=("a", "b")):
    """ev came within bound_ns of t0: exactly on the model; on a device + lab.tolerance_ns and
    the time the hosts stood still in between (late_span_bound_ns), said in the message."""
    took, late = ev.t_ns - t0, late_span_bound_ns(lab, hosts, t0, ev.t_ns, bound_ns)
    assert took <= late, \
        f"{what}: {ev.name} {took / 1e6:.1f} ms later; at most {late / 1e6:.1f} ms " \
        f"({bound_ns / 1e6:.0f} ms + tolerance + stall: {stood_still(lab, hosts, t0, ev.t_ns)})"


def test_connect_and_disconnect(lab):
    pair = CmPair(lab)
    client, server = pair.client.conn, pair.server.conn
    # Data flows over the connection the CM made.
    pair.server.post_recv(length=64)
    pair.client.post_send(length=64)
    assert pair.server.wait_completions(1) and pair.client.wait_completions(1)

    t0 = lab.now_ns
    client.disconnect()
    # Generous waits, bounds after (with the time the hosts stood still): assert_soon.
    sev = server.wait("DISCONNECTED", ms(100) + WAIT_PAST_BOUND_NS)
    assert_soon(lab, sev, "b after a's rdma_disconnect", t0, ms(100))
    t1 = lab.now_ns
    server.disconnect()
    assert_soon(lab, client.wait("DISCONNECTED", ms(100) + WAIT_PAST_BOUND_NS),
                "a after b's rdma_disconnect", t1, ms(100))
    if is_iwarp(lab):
        lab.run_for(sec(5))
        # iWARP: only CLOSE reaches rdma_cm users; never TIMEWAIT_EXIT (iwcm.c, cma_iw_handler).
        assert names(client) == ["ADDR_RESOLVED", "ROUTE_RESOLVED", "ESTABLISHED", "DISCONNECTED"]
        assert names(server) == ["CONNECT_REQUEST", "ESTABLISHED", "DISCONNECTED"]
    else:
        timing = IbCmTiming.for_caps(lab.host("a").caps())  # the wheel's TIMEWAIT, + slack
        w0 = lab.now_ns
        for host, conn in (("a", client), ("b", server)):  # generous waits, exact bounds after
            ev = conn.wait("TIMEWAIT_EXIT", timing.timewait_ns + sec(10))
            bound = late_bound_ns(lab, host, w0, ev.t_ns, timing.timewait_ns + ms(10))
            assert ev.t_ns - w0 <= bound, \
                f"{host}: TIMEWAIT_EXIT {(ev.t_ns - w0) / 1e6:.1f} ms after DISCONNECTED; at " \
                f"most {bound / 1e6:.1f} ms (the wheel's TIMEWAIT + slack + stall: " \
                f"{stood_still(lab, host, w0, ev.t_ns)})"
        assert names(client) == ["ADDR_RESOLVED", "ROUTE_RESOLVED", "ESTABLISHED",
                                 "DISCONNECTED", "TIMEWAIT_EXIT"]
        assert names(server) == ["CONNECT_REQUEST", "ESTABLISHED", "DISCONNECTED",
                                 "TIMEWAIT_EXIT"]
        # A clean disconnect is quick: the active side's DISCONNECTED comes with the DREP, a
        # round trip after b's rdma_disconnect, not a timeout. Counted from t1, not t0: the DREP
        # waits for b's rdma_disconnect, and on a device the controller's calls between the two
        # disconnects take hundreds of ms on a loaded TCG guest (fresh clone: 670 ms).
        assert_soon(lab, client.events[3], "a after b's rdma_disconnect (the DREP)", t1, ms(10))
    assert all(e.status == 0 for e in [*client.events, *server.events])
    caps = lab.host("a").caps()
    if caps.reports_qp_state:  # siw does not (test_qp_state)
        # siw (iw_close_timeout_s 0) releases the closer's socket at once and leaves its QP in
        # CLOSING (SQD) until the user moves it to ERROR (siw_qp_cm_drop); others: ERR.
        closing = is_iwarp(lab) and caps.iw_close_timeout_s == 0
        assert pair.client.qp.state == ("SQD" if closing else "ERR")


def sample_hits(rule, stop: threading.Event, out: list) -> None:
    """On a device: when a watch rule's count changes, every ~50 ms (the model has exact times
    in its history instead). A read takes time (a switch request, or `nft` in the host, slow
    in a TCG guest), so each change is known to lie in a window: after the start of the last
    read that did not see it, before the end of the first that did. out: (earliest, latest,
    hits) per change."""
    last, prev_start = 0, time.monotonic_ns()
    while not stop.wait(0.05):
        start = time.monotonic_ns()
        hits = rule.hits
        end = time.monotonic_ns()
        if hits != last:
            out.append((prev_start, end, hits))
            last = hits
        prev_start = start


def gap_windows_ms(changes: list) -> list[tuple[int, int]]:
    """(shortest, longest) time between consecutive changes that their windows allow, in ms."""
    return [(round((b[0] - a[1]) / 1e6), round((b[1] - a[0]) / 1e6))
            for a, b in zip(changes, changes[1:])]


@pytest.mark.finding("ib-addr-neighbour-update-lost")
def test_resolve_addr_completes_when_the_neighbour_does(lab):
    """rdma_resolve_addr to a peer whose neighbour entry is gone: the request for it goes out
    and its answer comes back in microseconds, and ADDR_RESOLVED follows the answer, not the
    resolve timeout (4 s here; rdma_resolve_addr(3): "Time to wait for resolution to
    complete")."""
    try:
        lab.faults.neigh_flush("a")
    except FaultNotSupported as e:
        pytest.skip(f"needs a neighbour table to flush: {e}")
    if not lab.share_a_kernel("a", "b"):
        pytest.skip("needs a and b on one kernel (the netns lab): only there does the answer "
                    "come inside a's own rdma_resolve_addr call, the window this reaches; "
                    "across kernels that window is microseconds and not reproducible")
    since = len(lab.history())
    pair = CmPair(lab, timeout_ns=sec(6), resolve_timeout_ns=sec(4))
    asked = [r for r in checks.records(lab.history()[since:], "verb", host="a")
             if r["data"].get("verb") == "rdma_resolve_addr"]
    assert len(asked) == 1, f"one rdma_resolve_addr by a, got {asked}"
    assert_soon(lab, pair.client.conn.events[0], "a's rdma_resolve_addr after a forgot its "
                "neighbours", asked[0]["t_ns"], ms(100))


def test_user_moving_the_qp_to_err_ends_only_an_iwarp_connection(lab):
    """ibv_modify_qp to ERR on a connected QP. iWARP: the provider ends the LLP connection
    (siw_qp_nextstate_from_rts: drop_conn, siw_qp_cm_drop, a FIN; cxgb4 c4iw_modify_qp:
    abort = 1, an RST), so both ids see DISCONNECTED. IB/RoCE: nothing is sent (rdma_cm's
    DREQ comes only from rdma_disconnect), so neither id sees an event. Found by the
    differential swarm (vm:siw seed 4: a drain's move to ERR; DISCONNECTED on siw only)."""
    pair = CmPair(lab)
    client, server = pair.client.conn, pair.server.conn
    before = (names(client), names(server))
    pair.client.qp.modify(qp_state="ERR")
    t0 = lab.now_ns
    if is_iwarp(lab):
        cev = client.wait("DISCONNECTED", ms(100) + WAIT_PAST_BOUND_NS)
        sev = server.wait("DISCONNECTED", ms(100) + WAIT_PAST_BOUND_NS)
        print(f"DISCONNECTED status: client {cev.status}, server {sev.status}")
        for ev, who in ((cev, "a"), (sev, "b")):
            assert_soon(lab, ev, f"{who} after a's QP went to ERR", t0, ms(100))
    else:
        lab.run_for(ms(500))  # a DREQ would reach the peer within a round trip
        assert (names(client), names(server)) == before


def test_destroying_a_connected_qp_ends_only_an_iwarp_connection(lab):
    """ibv_destroy_qp under a connected id moves the QP to ERR first (siw_destroy_qp,
    c4iw_destroy_qp): on iWARP that ends the connection as the user's move does, DISCONNECTED
    on both ids, the destroyed QP's own id included. IB/RoCE: no event until the id goes.
    Found by the differential swarm (vm:siw seed 7)."""
    pair = CmPair(lab)
    client, server = pair.client.conn, pair.server.conn
    before = (names(client), names(server))
    pair.client.qp.destroy()
    t0 = lab.now_ns
    if is_iwarp(lab):
        for conn, who in ((client, "a"), (server, "b")):
            assert_soon(lab, conn.wait("DISCONNECTED", ms(100) + WAIT_PAST_BOUND_NS),
                        f"{who} after a's QP was destroyed", t0, ms(100))
    else:
        lab.run_for(ms(500))
        assert (names(client), names(server)) == before


@pytest.mark.requires(transport=IB_FAMILY)
def test_every_drep_dropped(lab):
    """Seed 004: a DREQ that never gets its DREP is retried, then DREQ_ERROR: the disconnecting
    side sees DISCONNECTED(-ETIMEDOUT) after the retry budget, then TIMEWAIT_EXIT; the peer
    sees DISCONNECTED at once. The times are the kernel's: each 6144 ms timeout runs at the end
    of a 64-jiffy bucket of the timer wheel (HZ=250), so the DREQs go 6400 ms apart and the
    16th times out 102.144-102.4 s after rdma_disconnect (rdmalab.api.cm_timing)."""
    timing = IbCmTiming.for_caps(lab.host("a").caps())
    pair = CmPair(lab)
    client, server = pair.client.conn, pair.server.conn
    lab.faults.drop(cm="DREP")
    dreqs = lab.faults.watch(cm="DREQ", src_host="a")

    sends, stop = [], threading.Event()
    if not lab.has(VIRTUAL_TIME):  # real time: sample the DREQ counter as it goes
        threading.Thread(target=sample_hits, args=(dreqs, stop, sends), daemon=True).start()
    t0 = lab.now_ns
    client.disconnect()
    peer_ev = server.wait("DISCONNECTED", ms(100) + WAIT_PAST_BOUND_NS)
    assert peer_ev.status == 0
    assert_soon(lab, peer_ev, "b after a's rdma_disconnect", t0, ms(10))
    server.disconnect()                    # sends the DREP, which is lost

    # Generous waits, exact assertions after: a device that is late shows by how much.
    lo, hi = timing.dreq_give_up_range_ns
    ev = client.wait("DISCONNECTED", hi + sec(10))
    assert ev.status_name == "ETIMEDOUT"
    tw_lo, tw_hi = timing.timewait_range_ns
    exit_ev = client.wait("TIMEWAIT_EXIT", tw_hi + sec(1))
    stop.set()
    assert names(client)[-2:] == ["DISCONNECTED", "TIMEWAIT_EXIT"]
    assert dreqs.hits == timing.max_cm_retries + 1
    assert lab.faults.counts().get("drop", 0) >= 1
    # A device's timer runs a little after its tick (softirq, workqueue) and its event reaches
    # the harness a little later: lab.timer_slack_ns per timer, 0 on the model. A machine that
    # stood still (a TCG guest's vCPU on a loaded host) makes every timer late by as long as
    # it stood: that is measured (lab.stalled_ns), never guessed, and said in the message.
    timewait = exit_ev.t_ns - ev.t_ns
    tw_bound = late_bound_ns(lab, "a", ev.t_ns, exit_ev.t_ns, tw_hi)
    tw_least = early_bound_ns(lab, "a", ev.t_ns, tw_lo, tw_hi)  # DISCONNECTED read late
    assert tw_least <= timewait <= tw_bound, \
        f"TIMEWAIT lasted {timewait / 1e6:.1f} ms; the wheel gives {tw_lo / 1e6:.1f}-" \
        f"{tw_hi / 1e6:.1f} ms, {tw_least / 1e6:.1f}-{tw_bound / 1e6:.1f} ms with slack and " \
        f"the time host a stood still ({stood_still(lab, 'a', ev.t_ns - tw_hi, ev.t_ns)} " \
        f"before, {stood_still(lab, 'a', ev.t_ns, exit_ev.t_ns)} during)"
    elapsed = ev.t_ns - t0
    bound = late_bound_ns(lab, "a", t0, ev.t_ns, hi, timers=timing.attempts)
    period_lo, period_hi = timing.retry_period_range_ns
    gaps = gap_windows_ms(sends)
    assert lo <= elapsed <= bound, \
        f"DISCONNECTED(ETIMEDOUT) {elapsed / 1e9:.4f} s after rdma_disconnect; the kernel's " \
        f"timers give {lo / 1e9:.4f}-{hi / 1e9:.4f} s, at most {bound / 1e9:.4f} s with " \
        f"slack and the time host a stood still ({stood_still(lab, 'a', t0, ev.t_ns)}); DREQ " \
        f"count changes (shortest, longest) ms apart as sampled: {gaps}"
    # Between retries the wheel's period: each gap's window (what the reads allow) must hold
    # it, give or take a timer's slack and the time host a stood still during that gap. A
    # stall delays a DREQ after its timer fired: the gap before it grows and the one after it
    # shrinks by as much, so the stall counts on both sides (a fresh clone with both VM lanes
    # busy: one gap 6383 ms at most as sampled, while host a stood still 31.8 s of 102 s).
    for (shortest, longest), a, b in zip(gaps[1:], sends[1:], sends[2:]):
        stall = lab.stalled_ns("a", a[0], b[1])
        assert shortest * ms(1) - lab.timer_slack_ns - stall <= period_hi and \
            period_lo <= longest * ms(1) + lab.timer_slack_ns + stall, \
            f"DREQs {gaps} ms apart (windows as sampled); the wheel gives " \
            f"{period_lo / 1e6:.0f}-{period_hi / 1e6:.0f} ms; this gap ({shortest}, " \
            f"{longest}) ms: {stood_still(lab, 'a', a[0], b[1])}"


@pytest.mark.requires(transport=IB_FAMILY)
def test_rebooted_peer_reconnects_with_the_same_qpn(lab):
    """Seed 004 / vmlab.md: the client host reboots (same GUID, same first QPN) and connects
    again. Its REQ looks like the stale connection the server still holds: REJECTED(10), and
    the server's old id sends a DREQ that the rebooted host answers with a DREP for an unknown
    connection: DISCONNECTED(0) on the survivor. The retry connects."""
    lab.fresh_hosts("a")                   # a's first QP is the one the reboot gives again
    pair = CmPair(lab)
    old_qpn = pair.client.qp.qp_num
    survivor = pair.server.conn

    lab.faults.reboot("a", sec(1))
    lab.run_for(sec(1) + ms(1))
    ch = lab.host("a").process("cm-client-2").event_channel()
    retry = ch.connect("b", 7471)
    assert retry.qp.qp_num == old_qpn, "the rebooted host should hand out its first QPN again"
    rej = retry.wait("REJECTED", sec(2))
    assert rej.status_name == "STALE_CONN"
    old = survivor.wait("DISCONNECTED", sec(2))
    assert old.status == 0
    assert "TIMEWAIT_EXIT" not in names(retry)

    again = ch.connect("b", 7471)
    req = pair.listener.wait_request(sec(2))
    req.accept()
    again.wait("ESTABLISHED", sec(2))
    req.wait("ESTABLISHED", sec(2))
    assert again.qp.qp_num != old_qpn


@pytest.mark.finding("siw-connect-is-synchronous")
def test_connect_to_a_port_with_no_listener(lab):
    """No listener: REJECTED (IB: REJ reason 8; iWARP: the RST to the SYN or MPA request).
    Where rdma_connect does the TCP connect itself (siw_connect, a blocking connect), the RST
    fails the call with ECONNREFUSED and no event comes."""
    ch = lab.host("a").process("client").event_channel()
    if lab.host("a").caps().connect_is_synchronous:
        with pytest.raises(Error) as err:
            ch.connect("b", 9999)
        assert (err.value.verb, err.value.errno_name) == ("rdma_connect", "ECONNREFUSED")
        return
    conn = ch.connect("b", 9999)
    ev = conn.wait("REJECTED", sec(2))
    if is_iwarp(lab):
        assert ev.status_name == "ECONNREFUSED"
    else:
        assert ev.status_name == "INVALID_SERVICE_ID"  # REJ reason 8
    lab.run_for(sec(5))
    assert "TIMEWAIT_EXIT" not in names(conn)        # no TIMEWAIT after REJECTED
    if lab.host("a").caps().reports_qp_state:       # siw does not (test_qp_state)
        assert conn.qp.state == "ERR"                # librdmacm moves the QP to ERR on REJECTED


@pytest.mark.requires(transport="iWARP")
def test_connect_to_a_host_that_never_answers(lab):
    """Every SYN is lost. Where rdma_connect does the TCP connect itself (siw), the call blocks
    for TCP's SYN give-up time, (2^(tcp_syn_retries + 1) - 1) s (6.1: TCP_TIMEOUT_INIT 1 s,
    doubling; 127 s at the default 6), and fails with ETIMEDOUT; no event comes."""
    from rdmalab import FaultNotSupported

    caps = lab.host("a").caps()
    if not caps.connect_is_synchronous:
        pytest.skip("needs caps.connect_is_synchronous: an asynchronous connect (cxgb4) gives "
                    "up when its offloaded TCP stops retransmitting the SYN, a time the kernel "
                    "sources read (research Q5/Q6) do not give")
    try:
        lab.faults.drop(opcode="TCP_SYN")
    except FaultNotSupported as e:
        pytest.skip(f"needs a wire fault: {e}")
    # (2^(n+1) - 1) s by the formula; each RTO runs on the timer wheel (cm_timing).
    lo, hi = tcp_syn_give_up_range_ns(caps.tcp_syn_retries, caps.kernel_hz)
    ch = lab.host("a").process("client").event_channel()
    t0 = lab.now_ns
    with pytest.raises(Error) as err:
        ch.connect("b", 7471, timeout_ns=hi + sec(30))
    took_ns = lab.now_ns - t0
    print(f"rdma_connect blocked {took_ns / 1e9:.3f} s; predicted {lo / 1e9:.3f}-"
          f"{hi / 1e9:.3f} s (tcp_syn_retries {caps.tcp_syn_retries}, HZ {caps.kernel_hz})")
    assert (err.value.verb, err.value.errno_name) == ("rdma_connect", "ETIMEDOUT")
    bound = late_bound_ns(lab, "a", t0, t0 + took_ns, hi, timers=caps.tcp_syn_retries + 1)
    assert lo <= took_ns <= bound, \
        f"blocked {took_ns / 1e9:.3f} s, predicted {lo / 1e9:.3f}-{hi / 1e9:.3f} s, at most " \
        f"{bound / 1e9:.3f} s with slack and the time host a stood still " \
        f"({stood_still(lab, 'a', t0, t0 + took_ns)})"


@pytest.mark.requires(transport=IB_FAMILY)
def test_lost_rep_is_retransmitted(lab):
    timing = IbCmTiming.for_caps(lab.host("a").caps())
    reps = lab.faults.watch(cm="REP", src_host="b")   # before the drop: it sees the lost one
    lab.faults.drop(cm="REP", count=1)
    t0 = lab.now_ns
    pair = CmPair(lab, timeout_ns=3 * timing.passive_timeout_ns)
    est = pair.client.conn.wait("ESTABLISHED")
    assert est.t_ns - t0 >= timing.passive_timeout_ns - ms(10)  # after the REP's timeout
    assert reps.hits == 2


@pytest.mark.requires(transport=IB_FAMILY)
@pytest.mark.finding("rxe-local-send-error-kills-qp1")
def test_rep_refused_by_the_senders_stack_costs_that_rep_only(lab):
    """A REP that b's own network stack refuses (an nftables drop in b's output hook:
    ip_local_out fails, unlike a loss on the wire) costs that send only. ib_mad's contract
    for QP1 (drivers/infiniband/core/mad.c, mad_error_handler): "Send errors will transition
    the QP to SQE - move QP to RTS and repost flushed work requests". Once the rule is gone,
    the REP goes out again (the CM's retransmission, or the provider's own retry) and the
    connection is made; a second connection to b works. Where the provider moves QP1 to ERR
    instead, b's CM hears nothing more until the device is re-added."""
    if lab.has(VIRTUAL_TIME):
        pytest.skip("needs a host network stack that can refuse a send (nftables in the "
                    "sending host): the model's hosts have none")
    caps = lab.host("b").caps()
    if caps.refused_send_resend_races:
        # rxe before 6.12 resends a refused packet under need_req_skb, which the change that
        # removed it calls racy (driver_facts.cc, rxe): on 6.1.192 the REP went out after the
        # rule was removed in one run and never in another.
        pytest.skip(f"{caps.personality} on {caps.kernel_release}: the outcome of a refused send "
                    "races (need_req_skb resend, removed in 6.12's rxe); not asserted before 6.12")
    timing = IbCmTiming.for_caps(lab.host("a").caps())
    try:
        rule = lab.faults.drop(cm="REP", src_host="b", at="host")
    except FaultNotSupported as e:
        pytest.skip(f"needs a drop in the sending host's stack: {e}")
    wait_ns = 3 * timing.passive_timeout_ns
    made: dict = {}

    def connect() -> None:
        try:
            made["pair"] = CmPair(lab, timeout_ns=wait_ns)
        except Exception as e:  # noqa: BLE001: reported below, with the REPs refused
            made["error"] = e
    t = threading.Thread(target=connect, daemon=True)
    t.start()
    lab.wait_until(lambda: rule.hits > 0, sec(10))  # b's stack refused the REP
    refused = rule.hits
    rule.remove()
    t.join(timeout=(wait_ns + lab.tolerance_ns) / 1e9 + 30)
    try:
        assert not t.is_alive(), "the first connection neither came up nor failed"
        assert "error" not in made, (f"the connection never came up after b's stack refused "
                                     f"{refused} REP(s): {made.get('error')}")
        second = CmPair(lab, port=7472, timeout_ns=sec(2))
        assert second.client.conn.wait("ESTABLISHED", ms(10))
    except BaseException:
        lab.faults.reboot("b", 0)  # b's CM may be deaf now: the next scenario gets it fresh
        raise


@pytest.mark.requires(transport=IB_FAMILY)
@pytest.mark.finding("rxe-local-send-error-kills-qp1")
def test_mad_sent_while_the_port_is_down_costs_that_mad_only(lab):
    """A CM message b sends while its port is down (b disconnects: its DREQ cannot leave, the
    route lookup fails with the link down) costs that message only, by ib_mad's contract for
    QP1 (drivers/infiniband/core/mad.c, mad_error_handler): "Send errors will transition the
    QP to SQE - move QP to RTS and repost flushed work requests". Once b's port is up again a
    new connection to b is made. Where the provider moves QP1 to ERR instead (rxe: the route
    lookup's failure, "Host not reachable" in rxe_prepare, is a local send error), b's CM
    hears nothing more until the device is re-added: the kernel ULPs' port-down campaigns on
    vm:rxe (make test-ulp) found it so."""
    timing = IbCmTiming.for_caps(lab.host("a").caps())
    pair = CmPair(lab)
    lab.faults.port_down("b")
    try:
        pair.server.conn.disconnect()  # the DREQ: a QP1 send with b's link down
        lab.sleep(ms(500))
    finally:
        lab.faults.port_up("b")
    second, error = None, None
    try:
        second = CmPair(lab, port=7473, timeout_ns=3 * timing.passive_timeout_ns,
                        process_server="cm-server-2", process_client="cm-client-2")
    except Exception as e:  # noqa: BLE001: reported below, after b is made fresh
        error = e
        lab.faults.reboot("b", 0)  # b's CM may be deaf now: the next scenario gets it fresh
    assert error is None, (f"no connection to b after its port came back (its DREQ was sent "
                           f"while the port was down): {error}")
    assert second.client.conn.wait("ESTABLISHED", ms(10))


@pytest.mark.requires(transport=IB_FAMILY)
def test_lost_rtu_is_recovered(lab):
    """The passive side stays in REP_SENT and retransmits REP; the active side answers the
    duplicate REP with another RTU (cm_dup_rep_handler)."""
    timing = IbCmTiming.for_caps(lab.host("a").caps())
    rtus = lab.faults.watch(cm="RTU", src_host="a")
    lab.faults.drop(cm="RTU", count=1)
    pair = CmPair(lab, timeout_ns=3 * timing.passive_timeout_ns)
    pair.server.conn.wait("ESTABLISHED", 3 * timing.passive_timeout_ns)
    if lab.has(CM_PROTOCOL_STATE):  # the IB CM state: the kernel keeps it in cm.c
        assert pair.server.conn.protocol_state == "ESTABLISHED"
    assert rtus.hits == 2


@pytest.mark.requires(transport="iWARP")
def test_iwarp_destroy_with_events_still_queued(lab):
    """Seed 001: an iWARP id destroyed while its events wait in the iw_cm work list: destroy
    returns, the queued events are dropped, none reaches the user afterwards, no deadlock."""
    pair = CmPair(lab)
    server = pair.server.conn
    fins = lab.faults.watch(opcode="TCP_FIN", src_host="a")
    pair.client.conn.disconnect()
    # The FIN reaches b, whose iw_cm queues the close events for the id; destroy it at once.
    lab.wait_until(lambda: fins.hits > 0, ms(100) + lab.tolerance_ns, "the FIN from a")
    pair.server.close(ms(100))
    destroyed_at = lab.now_ns
    lab.run_for(ms(100))
    assert all(e.t_ns <= destroyed_at for e in server.events)
    assert server.destroyed
    if lab.has(VIRTUAL_TIME):
        # Only the model can place the destroy between the FIN's arrival and the delivery of
        # its events; on a device the events may already be delivered (a race, not a fault).
        assert "DISCONNECTED" not in names(server)


def test_cm_events_of_one_id_are_serialised_and_none_after_destroy(lab):
    pair = CmPair(lab)
    seen = []

    def slow(ev):
        seen.append((ev.event, lab.now_ns))
        lab.sleep(ms(2))

    pair.server_channel.watch(pair.server.conn, slow)
    t0 = lab.now_ns
    pair.client.conn.disconnect()
    assert_soon(lab, pair.server.conn.wait("DISCONNECTED", ms(100) + WAIT_PAST_BOUND_NS),
                "b after a's rdma_disconnect", t0, ms(100))
    pair.server.conn.disconnect()
    lab.run_for(ms(1))
    # The destroy waits for a running handler: on an agent lab that is a call back into this
    # controller (its 2 ms sleep and the round trip), the harness latency lab.tolerance_ns
    # bounds (a fresh clone under stress-ng waited over 100 ms).
    pair.server.close(ms(100) + lab.tolerance_ns)
    returned = lab.now_ns
    lab.run_for(sec(5))
    assert all(t < returned for _, t in seen), seen
    history = lab.history()
    begins = checks.records(history, "cm_handler_begin", host="b")
    ends = checks.records(history, "cm_handler_end", host="b")
    assert len(begins) == len(ends) >= 1
    for b_, e_ in zip(begins, ends):
        assert b_["seq"] < e_["seq"]
    destroyed = checks.records(history, "cm_destroy_end", host="b")
    assert destroyed and all(b_["seq"] < destroyed[-1]["seq"] for b_ in begins)
