"""The verbs objects through the Python API, and misuse: every wrong call raises (an Error
naming the verb and errno, or a TypeError/ValueError), never crashes or hangs."""

import errno

import pytest

import rdmalab
from rdmalab import ms


@pytest.fixture
def ctx():
    with rdmalab.model_lab(seed=1, hosts={"a": "ib", "b": "ib"}) as lab:
        yield lab.host("a").process("p").open_device()


def make_qp(ctx, **kw):
    pd = ctx.alloc_pd()
    cq = ctx.create_cq(16)
    return ctx.create_qp(pd, "RC", cq=cq, **kw)


def to_init(qp):
    qp.modify(qp_state="INIT", pkey_index=0, port_num=1, qp_access_flags="LOCAL_WRITE")


def test_objects_and_their_properties(ctx):
    assert ctx.caps.transport == "IB" and ctx.caps.personality == "ib"
    assert ctx.query_port() == "ACTIVE"
    pd = ctx.alloc_pd()
    mr = ctx.reg_mr(pd, 256, access="LOCAL_WRITE|REMOTE_READ")
    mr.write(0, b"hello")
    assert mr.read(0, 5) == b"hello" and mr.length == 256
    assert mr.sge(16, 8) == (mr.addr + 16, 8, mr.lkey)
    qp = make_qp(ctx)
    assert (qp.qp_type, qp.state) == ("RC", "RESET")
    assert qp.label.startswith("qp:") and not qp.destroyed
    to_init(qp)
    assert qp.state == "INIT" and qp.query().qp_state == "INIT"


def test_post_to_destroyed_qp_is_ebadf(ctx):
    qp = make_qp(ctx)
    qp.destroy()
    assert qp.destroyed
    with pytest.raises(rdmalab.Error) as info:
        qp.post_send(wr_id=1)
    assert (info.value.verb, info.value.errno) == ("ibv_post_send", errno.EBADF)


def test_invalid_transition_is_einval(ctx):
    qp = make_qp(ctx)
    with pytest.raises(rdmalab.Error) as info:
        qp.modify(qp_state="RTS")
    assert (info.value.verb, info.value.errno) == ("ibv_modify_qp", errno.EINVAL)
    assert qp.state == "RESET"


def test_missing_attribute_is_einval(ctx):
    qp = make_qp(ctx)
    with pytest.raises(rdmalab.Error) as info:
        qp.modify(qp_state="INIT", pkey_index=0, qp_access_flags=0)  # no port_num
    assert (info.value.verb, info.value.errno) == ("ibv_modify_qp", errno.EINVAL)
    assert qp.state == "RESET"


def test_destroy_with_an_unacked_event_is_ebusy():
    with rdmalab.model_lab(seed=1, hosts={"a": "ib"}) as lab:
        ctx = lab.host("a").process("p").open_device()
        qp = make_qp(ctx)
        to_init(qp)
        lab.faults.inject_async_event("a", "QP_FATAL", qp.qp_num)
        ev = ctx.get_async_event(ms(1))
        assert ev is not None and (ev.type, ev.kind, ev.qp_num) == ("QP_FATAL", "QP", qp.qp_num)
        with pytest.raises(rdmalab.Error) as info:
            qp.destroy(timeout_ns=ms(1))
        assert (info.value.verb, info.value.errno) == ("ibv_destroy_qp", errno.EBUSY)
        assert not qp.destroyed
        ctx.ack_async_event(ev)
        qp.destroy()
        assert qp.destroyed


@pytest.mark.parametrize("kind", ["srq", "cq"])
def test_srq_and_cq_destroy_honour_the_callers_deadline(kind):
    """ibv_destroy_srq / ibv_destroy_cq wait for the acks of the events read on the object
    (rdma-core ibv_cmd_destroy_srq / ibv_cmd_destroy_cq), as ibv_destroy_qp does: the wait
    ends at the caller's timeout_ns, EBUSY after, never at a fixed second."""
    with rdmalab.model_lab(seed=1, hosts={"a": "ib"}) as lab:
        ctx = lab.host("a").process("p").open_device()
        if kind == "srq":
            obj = ctx.create_srq(ctx.alloc_pd())
            lab.faults.inject_async_event("a", "SRQ_ERR", obj.srq_num)
        else:
            obj = ctx.create_cq(16)
            lab.faults.inject_async_event("a", "CQ_ERR", obj.id)
        ev = ctx.get_async_event(ms(1))
        assert ev is not None and ev.type == ("SRQ_ERR" if kind == "srq" else "CQ_ERR")
        t0 = lab.now_ns
        with pytest.raises(rdmalab.Error) as info:
            obj.destroy(timeout_ns=ms(5))
        assert (info.value.verb, info.value.errno) == (f"ibv_destroy_{kind}", errno.EBUSY)
        assert lab.now_ns - t0 == ms(5)
        assert not obj.destroyed
        ctx.ack_async_event(ev)
        obj.destroy(timeout_ns=0)
        assert obj.destroyed


def test_wrong_argument_types(ctx):
    pd = ctx.alloc_pd()
    with pytest.raises(TypeError):
        ctx.reg_mr("not a pd", 64)
    with pytest.raises(ValueError, match="unknown QP type 'RCX'"):
        ctx.create_qp(pd, "RCX", cq=ctx.create_cq(4))
    with pytest.raises(TypeError, match="QP state must be a str"):
        make_qp(ctx).modify(qp_state=2)
    with pytest.raises(TypeError, match="unexpected keyword 'state'"):
        make_qp(ctx).modify(state="INIT")
    with pytest.raises(TypeError):
        ctx.create_cq("many")


def test_async_event_timeout_returns_none(ctx):
    assert ctx.get_async_event(ms(1)) is None


def test_roce_cannot_raise_qp_fatal():
    with rdmalab.model_lab(seed=1, hosts={"a": "roce"}) as lab:
        ctx = lab.host("a").process("p").open_device()
        qp = make_qp(ctx)
        with pytest.raises(rdmalab.FaultNotSupported) as info:
            lab.faults.inject_async_event("a", "QP_FATAL", qp.qp_num)
        assert info.value.errno == errno.EOPNOTSUPP
        assert info.value.fault == "inject_async_event(QP_FATAL)"


def test_killed_process_objects_are_ebadf():
    with rdmalab.model_lab(seed=1, hosts={"a": "ib"}) as lab:
        proc = lab.host("a").process("victim")
        ctx = proc.open_device()
        qp = make_qp(ctx)
        proc.kill()
        assert not proc.alive
        with pytest.raises(rdmalab.Error) as info:
            qp.modify(qp_state="INIT", pkey_index=0, port_num=1, qp_access_flags=0)
        assert info.value.errno == errno.EBADF
