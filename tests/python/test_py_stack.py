"""Stack helpers and resource sets through the Python API, with faults and handlers."""

import errno

import pytest

import rdmalab
from rdmalab import ms, us
from rdmalab.api.resources import RCPair, XrcPair
from rdmalab.api.stack import Dispatcher


@pytest.fixture
def ib_lab():
    with rdmalab.model_lab(seed=1, hosts={"a": "ib", "b": "ib"}) as lab:
        yield lab


def test_rc_pair_send_recv_exactly_once(ib_lab):
    pair = RCPair(ib_lab)
    assert pair.a.qp.state == "RTS" and pair.b.qp.state == "RTS"
    pair.b.mr.write(0, b"\0" * 8)
    pair.a.mr.write(0, b"payload!")
    rid = pair.b.post_recv(length=8)
    sid = pair.a.post_send(length=8, signaled=True)
    assert pair.b.wait_completions(1, ms(10)) and pair.a.wait_completions(1, ms(10))
    recv = pair.b.traffic.completions()
    assert [(w.wr_id, w.status, w.opcode, w.byte_len) for w in recv] == [
        (rid, "SUCCESS", "RECV", 8)]
    assert pair.a.traffic.completions()[0].wr_id == sid
    assert pair.b.mr.read(0, 8) == b"payload!"
    for player in pair.players:
        assert player.traffic.check().exactly_once()


def test_rdma_write_to_peer(ib_lab):
    pair = RCPair(ib_lab)
    pair.a.mr.write(0, b"written")
    pair.a.post_send(length=7, opcode="RDMA_WRITE", peer=pair.b)
    assert pair.a.wait_completions(1, ms(10))
    assert pair.b.mr.read(0, 7) == b"written"


def test_drain_flushes_every_posted_recv(ib_lab):
    pair = RCPair(ib_lab)
    ids = [pair.b.post_recv(length=16) for _ in range(4)]
    report = pair.b.drain(timeout_ns=ms(100))
    assert report.complete and report.flushed == len(ids)
    assert pair.b.qp.state == "ERR"
    assert pair.b.traffic.check().exactly_once()


def test_count_posts_that_many_wrs_each_with_its_own_wr_id(ib_lab):
    pair = RCPair(ib_lab, max_recv_wr=16, max_send_wr=16)
    last = pair.b.post_recv(length=8, count=5)
    assert pair.b.traffic.outstanding(pair.b.qp, "RQ") == 5
    pair.a.post_send(length=8, count=3)
    assert pair.b.wait_completions(3, ms(10)) and pair.a.wait_completions(3, ms(10))
    ids = [w.wr_id for w in pair.b.traffic.completions()]
    assert len(set(ids)) == 3 and last not in ids  # in order: the last two still wait
    assert pair.b.traffic.outstanding(pair.b.qp, "RQ") == 2
    assert pair.b.drain(timeout_ns=ms(100)).flushed == 2
    for player in pair.players:
        assert player.traffic.check().exactly_once()


@pytest.mark.parametrize("count, wr_id, want", [
    (0, 0, "Traffic::post_recv: EINVAL (22): count = 0: at least one WR"),
    (2, 7, "Traffic::post_recv: EINVAL (22): count = 2 with wr_id = 7: each WR needs its own "
           "wr_id"),
])
def test_a_count_that_cannot_be_posted_is_refused_before_any_post(ib_lab, count, wr_id, want):
    pair = RCPair(ib_lab)
    with pytest.raises(rdmalab.Error) as err:
        pair.b.post_recv(length=8, wr_id=wr_id, count=count)
    assert str(err.value) == want and err.value.errno == errno.EINVAL
    with pytest.raises(TypeError, match="count must be an int, not str"):
        pair.b.post_recv(length=8, count="2")
    assert pair.b.traffic.outstanding(pair.b.qp, "RQ") == 0


def test_dropped_packet_rule_counts_hits(ib_lab):
    pair = RCPair(ib_lab)
    rule = ib_lab.faults.drop(opcode="SEND_ONLY", count=1)
    pair.b.post_recv(length=8)
    pair.a.post_send(length=8)
    assert pair.b.wait_completions(1, ms(500))  # the retransmission gets through
    assert rule.hits == 1
    assert ib_lab.faults.counts().get("drop", 0) >= 1


def test_a_bad_wire_rule_is_a_clear_error_before_any_packet(ib_lab):
    """Wire rules are the fault switch's fields, checked when given: no predicate runs per
    packet, so none can fail halfway through a scenario."""
    with pytest.raises(TypeError, match="a Python predicate would run for every packet"):
        ib_lab.faults.drop(lambda packet: True)
    with pytest.raises(ValueError, match="rule.opcode: unknown opcode 'SEND_ONYL'"):
        ib_lab.faults.drop(opcode="SEND_ONYL")
    assert ib_lab.faults.rules() == []


def test_verb_hook_sees_destroy(ib_lab):
    calls = []
    ib_lab.faults.on_verb(lambda call: calls.append((call.verb, call.host)),
                          verb="ibv_destroy_qp")
    pair = RCPair(ib_lab)
    pair.a.qp.destroy()
    assert calls == [("ibv_destroy_qp", "a")]


def test_fault_rule_arguments(ib_lab):
    with pytest.raises(ValueError, match="rule.cm: unknown CM message \"DREQQ\""):
        ib_lab.faults.drop(cm="DREQQ")
    with pytest.raises(ValueError, match="rule.qpn: unknown key"):
        ib_lab.faults.drop(qpn=3)
    rule = ib_lab.faults.drop(cm="DREP")
    assert rule.rule == {"action": "drop", "cm": "DREP"}


def test_dispatcher_delivers_events_and_parks_handler_errors(ib_lab):
    pair = RCPair(ib_lab)
    seen = []

    def handler(ev):
        seen.append((ev.type, ev.qp_num))
        raise RuntimeError("handler bug")

    with Dispatcher(ib_lab, pair.a.ctx) as d:
        d.watch(pair.a.qp, handler)
        ib_lab.faults.inject_async_event("a", "QP_FATAL", pair.a.qp.qp_num, driver_delay_ns=us(5))
        with pytest.raises(RuntimeError, match="handler bug"):
            ib_lab.run_for(ms(1))  # the handler runs meanwhile; its error comes back here
        assert seen == [("QP_FATAL", pair.a.qp.qp_num)]
        assert d.stats().handler_errors == 1
        d.destroy(pair.a.qp)
    assert pair.a.qp.destroyed


@pytest.mark.parametrize("kind", ["qp", "srq", "cq"])
def test_dispatcher_destroy_passes_the_callers_deadline_down(ib_lab, kind):
    """Dispatcher.destroy(obj, timeout_ns): where an event of obj was read and not acked
    (here read by the scenario itself, the dispatcher not started), the backend's
    ack wait ends at the caller's deadline for a QP, an SRQ and a CQ alike."""
    lab = ib_lab
    ctx = lab.host("a").process("p").open_device()
    pd = ctx.alloc_pd()
    cq = ctx.create_cq(16)
    if kind == "qp":
        obj = ctx.create_qp(pd, "RC", cq=cq)
        obj.modify(qp_state="INIT", pkey_index=0, port_num=1, qp_access_flags=0)
        lab.faults.inject_async_event("a", "QP_FATAL", obj.qp_num)
    elif kind == "srq":
        obj = ctx.create_srq(pd)
        lab.faults.inject_async_event("a", "SRQ_ERR", obj.srq_num)
    else:
        obj = cq
        lab.faults.inject_async_event("a", "CQ_ERR", cq.id)
    ev = ctx.get_async_event(ms(1))
    assert ev is not None
    d = Dispatcher(lab, ctx)
    t0 = lab.now_ns
    with pytest.raises(rdmalab.Error) as info:
        d.destroy(obj, timeout_ns=ms(3))
    assert info.value.errno == errno.EBUSY
    assert lab.now_ns - t0 == ms(3)
    assert not obj.destroyed
    ctx.ack_async_event(ev)
    d.destroy(obj, timeout_ns=ms(3))
    assert obj.destroyed


def test_xrc_pair_reaches_an_srq(ib_lab):
    xrc = XrcPair(ib_lab, path="/xrc/test")
    assert xrc.sender.qp.state == "RTS" and xrc.receiver.qp.state == "RTR"
    rid = xrc.receiver.post_recv(srq_index=1, length=16)
    xrc.sender.post_send(xrc.receiver.srqs[1], length=16)
    assert xrc.sender.wait_completions(1, ms(10))
    assert xrc.receiver.traffic.wait_completions(xrc.receiver.cq, 1, ms(10))
    assert [w.wr_id for w in xrc.receiver.traffic.completions()] == [rid]
    proc, ctx, xrcd, handle = xrc.receiver.open_in("joiner")
    assert handle.is_open_handle and handle.qp_num == xrc.receiver.qp.qp_num


def test_handlers_and_hooks_may_call_the_engine(ib_lab):
    """Callbacks run on simulated threads; calling verbs from them must not deadlock on the
    GIL (every bound call releases it)."""
    pair = RCPair(ib_lab)
    states, hook_states = [], []
    ib_lab.faults.on_verb(lambda call: hook_states.append(pair.b.qp.state),
                          verb="ibv_destroy_qp")
    with Dispatcher(ib_lab, pair.a.ctx) as d:
        d.watch(pair.a.qp, lambda ev: states.append((pair.a.qp.query().qp_state, ib_lab.now_ns)))
        ib_lab.faults.inject_async_event("a", "QP_FATAL", pair.a.qp.qp_num)
        assert d.wait_event(pair.a.qp, "QP_FATAL", ms(1))
        ib_lab.run_for(ms(1))
        d.destroy(pair.a.qp)
    pair.b.qp.destroy()
    assert len(states) == 1 and states[0][0] in ("RTS", "ERR")
    assert hook_states == ["RTS", "RTS"]  # a's destroy (via the dispatcher), then b's
