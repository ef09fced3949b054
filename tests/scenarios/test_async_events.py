"""Async events a device raises by itself (semantics.md E, vmlab.md): CQ overflow, SRQ limit,
port down and up, SQ drained, communication established. Each test names the event it needs;
a device that does not raise it skips with that reason."""

import pytest

from rdmalab import Hung, ms, sec
from rdmalab.api.resources import RCPair
from rdmalab.api.stack import Dispatcher


class Events:
    def __init__(self):
        self.seen = []

    def __call__(self, ev):
        self.seen.append(ev.type)


@pytest.mark.requires(event="CQ_ERR")
def test_cq_overflow_raises_cq_err(lab):
    # ibv_create_cq(4) rounds up (b.cq.cqe: 7 on rxe and mlx5, 4 on siw, 14 on cxgb4); the
    # ring may hold more than that (mlx5 cqe + 1, cxgb4 about twice, at least 62): 2 * cqe + 64
    # completions overflow every provider's CQ.
    pair = RCPair(lab, cqe=4, max_recv_wr=256, max_send_wr=256)
    a, b = pair.a, pair.b
    n = 2 * b.cq.cqe + 64
    assert b.cq.cqe >= 4 and n <= 256
    got = Events()
    with Dispatcher(lab, b.ctx) as d:
        d.watch(b.cq, got)
        b.post_recv(length=64, count=n)
        a.post_send(length=64, count=n)
        # b never polls: its CQ overflows.
        assert d.wait_event(b.cq, "CQ_ERR", timeout_ns=sec(1)), "no CQ_ERR on overflow"
    assert "CQ_ERR" in got.seen


@pytest.mark.requires("srq", event="SRQ_LIMIT_REACHED")
def test_srq_limit_fires_once_and_disarms(lab):
    pair = RCPair(lab, srq=True, max_recv_wr=16)
    a, b = pair.a, pair.b
    got = Events()
    b.post_recv(length=64, count=8)
    b.srq.arm_limit(4)
    with Dispatcher(lab, b.ctx) as d:
        d.watch(b.srq, got)
        a.post_send(length=64, count=6)  # 8 -> 2 WQEs: crosses the limit of 4 once
        assert a.wait_completions(6, timeout_ns=sec(1))
        assert d.wait_event(b.srq, "SRQ_LIMIT_REACHED", timeout_ns=ms(100))
        lab.run_for(ms(10))
    assert got.seen == ["SRQ_LIMIT_REACHED"]
    assert b.srq.limit == 0                # the event disarms the limit


@pytest.mark.requires(event=["PORT_ERR", "PORT_ACTIVE"])
def test_port_down_and_up(lab):
    pair = RCPair(lab)
    got = Events()
    with Dispatcher(lab, pair.a.ctx) as d:
        d.set_default_handler(got)
        lab.faults.port_down("a")
        lab.wait_until(lambda: "PORT_ERR" in got.seen, sec(1), "PORT_ERR")
        assert pair.a.ctx.query_port() == "DOWN"
        lab.faults.port_up("a")
        lab.wait_until(lambda: "PORT_ACTIVE" in got.seen, sec(1), "PORT_ACTIVE")
    assert got.seen == ["PORT_ERR", "PORT_ACTIVE"]
    assert pair.a.ctx.query_port() == "ACTIVE"


@pytest.mark.requires(transport=["IB", "RoCE"], event="SQ_DRAINED")
@pytest.mark.finding("rxe-sqd-to-rts-does-not-resume-the-sq")
def test_sqd_with_notify_raises_sq_drained(lab):
    """RTS -> SQD stops the SQ after the WRs in progress; SQ_DRAINED says they are done.
    WRs not yet started wait in the SQ until the QP is back in RTS."""
    n = 16
    pair = RCPair(lab, max_send_wr=32, max_recv_wr=32)
    a, b = pair.a, pair.b
    got = Events()
    b.post_recv(length=64, count=n + 1)
    with Dispatcher(lab, a.ctx) as d:
        d.watch(a.qp, got)
        a.post_send(length=64, count=n)
        assert a.wait_completions(n // 4, timeout_ns=sec(1))
        a.qp.modify(qp_state="SQD", en_sqd_async_notify=1)
        assert d.wait_event(a.qp, "SQ_DRAINED", timeout_ns=sec(1))
        assert a.qp.state == "SQD"
        # A WR posted in SQD is accepted but not processed until the QP is back in RTS.
        late = a.post_send(length=64)
        lab.run_for(ms(10))
        assert late not in [wc.wr_id for wc in a.traffic.completions()], "SQD processed a new WR"
        a.qp.modify(qp_state="RTS")
        all_done = lambda: a.traffic.check().posted == a.traffic.check().succeeded  # noqa: E731
        if not a.traffic.poll_until([a.cq], all_done, timeout_ns=sec(1)):
            # Say what the device does instead: does the next post_send restart the SQ?
            b.post_recv(length=64)
            a.post_send(length=64)
            kicked = a.traffic.poll_until([a.cq], all_done, timeout_ns=sec(1))
            raise AssertionError(
                "the WR posted in SQD did not complete within 1 s of SQD -> RTS; after one "
                f"more post_send {'both completed' if kicked else 'still nothing completed'}")
    assert got.seen == ["SQ_DRAINED"]
    report = a.traffic.check()
    assert report.succeeded == n + 1 and not report.violations


@pytest.mark.requires(event="COMM_EST")
def test_first_packet_in_rtr_raises_comm_est(lab):
    """A responder still in RTR that receives its first packet raises COMM_EST (the event
    the IB CM uses for USER_ESTABLISHED when data beats the RTU)."""
    pair = RCPair(lab, connect=False)
    from rdmalab.api.stack import bring_up
    ep_a, ep_b = pair.a.endpoint, pair.b.endpoint
    bring_up(pair.a.qp, ep_a, ep_b)
    # b only to RTR: walk it by hand.
    pair.b.qp.modify(qp_state="INIT", pkey_index=0, port_num=1,
                     qp_access_flags="LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ")
    pair.b.qp.modify(qp_state="RTR", ah_attr={"dgid": ep_a.gid}, path_mtu=1024,
                     dest_qp_num=ep_a.qp_num, rq_psn=ep_a.psn, max_dest_rd_atomic=1,
                     min_rnr_timer=12)
    got = Events()
    with Dispatcher(lab, pair.b.ctx) as d:
        d.watch(pair.b.qp, got)
        pair.b.post_recv(length=64)
        pair.a.post_send(length=64)
        assert d.wait_event(pair.b.qp, "COMM_EST", timeout_ns=sec(1))
    assert got.seen == ["COMM_EST"]
    assert pair.b.wait_completions(1)


def test_device_removal_raises_device_fatal(lab):
    """A driver with disassociate_ucontext (mlx5, mlx4, hns, irdma): `rdma link delete`
    disassociates every user context, whose async fd gets DEVICE_FATAL, so that it can release
    its objects (uverbs_main.c ib_uverbs_remove_one -> ib_uverbs_free_hw_resources)."""
    if not lab.host("a").caps().disassociates:
        pytest.skip("needs caps.disassociates: the driver has no disassociate_ucontext, its "
                    "removal waits for the user (test_device_removal_waits_for_the_user)")
    pair = RCPair(lab)
    got = Events()
    with Dispatcher(lab, pair.a.ctx) as d:
        d.set_default_handler(got)
        lab.faults.rdma_link_delete("a")
        lab.wait_until(lambda: "DEVICE_FATAL" in got.seen, sec(2) + lab.tolerance_ns,
                       "DEVICE_FATAL at a")
    assert got.seen.count("DEVICE_FATAL") == 1


@pytest.mark.finding("device-removal-waits-for-the-user")
def test_device_removal_waits_for_the_user(lab):
    """A driver without disassociate_ucontext (rxe, siw, cxgb4; mana before 7.2): `rdma link
    delete` raises nothing and waits (wait_for_completion) until every process has closed its
    context on the device; then the removal completes and `rdma link add` works."""
    if lab.host("a").caps().disassociates:
        pytest.skip("needs caps.disassociates False: this driver disassociates user contexts "
                    "(test_device_removal_raises_device_fatal)")
    # No other process holds the device (test_rdma_link): a device added again, as new.
    lab.fresh_hosts("a")
    name = lab.host("a").devices[0]
    victim = lab.killable_process("a", "victim")
    ctx = victim.open_device(name)
    got = Events()
    with Dispatcher(lab, ctx) as d:
        d.set_default_handler(got)
        lab.faults.rdma_link_delete("a")
        lab.sleep(sec(2))
        assert "DEVICE_FATAL" not in got.seen, "DEVICE_FATAL from a driver that cannot raise it"
    with pytest.raises(Hung):
        lab.faults.rdma_link_add("a", deadline_s=5.0)   # the removal still waits for victim
    victim.kill()                      # its context closes: the removal completes
    lab.faults.rdma_link_add("a")
    assert name in lab.host("a").devices
