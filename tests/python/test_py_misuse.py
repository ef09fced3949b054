"""API misuse refused with rdmalab.Error (issue 26): objects of one context or host used through
another, handlers that raise judged by the checkers, integers out of their C type's range, and
negative durations. Every case on the model lab."""

import errno
import re
import types

import pytest

import rdmalab
from rdmalab import checkers, ms, us
from rdmalab.api.resources import RCPair
from rdmalab.api.stack import Dispatcher, Traffic, drain

INT64_MAX = 2**63 - 1


@pytest.fixture
def lab():
    with rdmalab.model_lab(seed=1, hosts={"a": "ib", "b": "ib"}) as lab:
        yield lab


class Side:
    """A context on a host with one of each object kind."""

    def __init__(self, lab, host, process="p"):
        self.host = host
        self.ctx = lab.host(host).process(process).open_device()
        self.pd = self.ctx.alloc_pd()
        self.cq = self.ctx.create_cq(16)
        self.srq = self.ctx.create_srq(self.pd)
        self.xrcd = self.ctx.open_xrcd()
        self.qp = self.ctx.create_qp(self.pd, "RC", cq=self.cq)
        self.tgt = self.ctx.create_qp(qp_type="XRC_RECV", xrcd=self.xrcd)


def assert_foreign(info, verb, kind, obj, of, through):
    """The one error for an object of another context or host: rdmalab.Error itself, EINVAL,
    the verb, the object kind and label, where it is from and where it was used."""
    e = info.value
    assert type(e) is rdmalab.Error, repr(e)
    assert e.errno == errno.EINVAL and e.errno_name == "EINVAL"
    assert e.verb == verb
    through_re = (rf"{re.escape(through.ctx.label)} on host {through.host}"
                  if hasattr(through, "ctx") else rf"host {through}")
    want = (rf"{re.escape(kind)} {re.escape(obj.label)} is of {re.escape(of.ctx.label)} on host "
            rf"{of.host}, not of {through_re}$")
    assert re.search(want, e.detail), (e.detail, want)
    assert str(e).startswith(f"{verb}: EINVAL (22): ")


# -- 1. objects of another context or host


def test_verbs_refuse_objects_of_another_host(lab):
    a, b = Side(lab, "a"), Side(lab, "b")
    with pytest.raises(rdmalab.Error) as info:
        b.ctx.reg_mr(a.pd, 64)
    assert_foreign(info, "ibv_reg_mr", "pd", a.pd, a, b)
    with pytest.raises(rdmalab.Error) as info:
        b.ctx.create_qp(a.pd, "RC", cq=b.cq)
    assert_foreign(info, "ibv_create_qp", "pd", a.pd, a, b)
    with pytest.raises(rdmalab.Error) as info:
        b.ctx.create_qp(b.pd, "RC", send_cq=a.cq, recv_cq=b.cq)
    assert_foreign(info, "ibv_create_qp", "send_cq", a.cq, a, b)
    with pytest.raises(rdmalab.Error) as info:
        b.ctx.create_qp(b.pd, "RC", send_cq=b.cq, recv_cq=a.cq)
    assert_foreign(info, "ibv_create_qp", "recv_cq", a.cq, a, b)
    with pytest.raises(rdmalab.Error) as info:
        b.ctx.create_qp(b.pd, "RC", cq=b.cq, srq=a.srq)
    assert_foreign(info, "ibv_create_qp", "srq", a.srq, a, b)
    with pytest.raises(rdmalab.Error) as info:
        b.ctx.create_qp(qp_type="XRC_RECV", xrcd=a.xrcd)
    assert_foreign(info, "ibv_create_qp", "xrcd", a.xrcd, a, b)
    with pytest.raises(rdmalab.Error) as info:
        b.ctx.create_srq(a.pd)
    assert_foreign(info, "ibv_create_srq", "pd", a.pd, a, b)
    with pytest.raises(rdmalab.Error) as info:
        b.ctx.create_srq_xrc(a.pd, b.xrcd, b.cq)
    assert_foreign(info, "ibv_create_srq_ex", "pd", a.pd, a, b)
    with pytest.raises(rdmalab.Error) as info:
        b.ctx.create_srq_xrc(b.pd, a.xrcd, b.cq)
    assert_foreign(info, "ibv_create_srq_ex", "xrcd", a.xrcd, a, b)
    with pytest.raises(rdmalab.Error) as info:
        b.ctx.create_srq_xrc(b.pd, b.xrcd, a.cq)
    assert_foreign(info, "ibv_create_srq_ex", "cq", a.cq, a, b)
    with pytest.raises(rdmalab.Error) as info:
        b.ctx.open_qp(a.xrcd, a.tgt.qp_num)
    assert_foreign(info, "ibv_open_qp", "xrcd", a.xrcd, a, b)


def test_verbs_refuse_objects_of_another_context_on_the_same_host(lab):
    p, q = Side(lab, "a", "p"), Side(lab, "a", "q")
    with pytest.raises(rdmalab.Error) as info:
        q.ctx.create_qp(p.pd, "RC", cq=q.cq)
    assert_foreign(info, "ibv_create_qp", "pd", p.pd, p, q)
    with pytest.raises(rdmalab.Error) as info:
        q.ctx.reg_mr(p.pd, 64)
    assert_foreign(info, "ibv_reg_mr", "pd", p.pd, p, q)


@pytest.mark.parametrize("kind", ["qp", "srq", "cq"])
def test_dispatcher_refuses_objects_of_another_context(lab, kind):
    """b's dispatcher neither watches nor destroys a's objects: a's events would never reach
    the handler, and the destroy would end a's object behind its owner's back."""
    a, b = Side(lab, "a"), Side(lab, "b")
    obj = getattr(a, kind)
    with Dispatcher(lab, b.ctx) as d:
        with pytest.raises(rdmalab.Error) as info:
            d.watch(obj, lambda ev: None)
        assert_foreign(info, "AsyncDispatcher::watch", kind, obj, a, b)
        with pytest.raises(rdmalab.Error) as info:
            d.destroy(obj)
        assert_foreign(info, "destroy", kind, obj, a, b)
        assert not obj.destroyed
        for method, verb in (("wait_event", "AsyncDispatcher::wait_event"),
                             ("count_events", "AsyncDispatcher::count_events")):
            with pytest.raises(rdmalab.Error) as info:
                getattr(d, method)(obj, "QP_FATAL")
            assert_foreign(info, verb, kind, obj, a, b)
        with pytest.raises(rdmalab.Error) as info:
            d.events_for(obj)
        assert_foreign(info, "AsyncDispatcher::events_for", kind, obj, a, b)
        assert [r for r in lab.history() if r["kind"] == "destroy_begin"] == []
    with Dispatcher(lab, a.ctx) as d:  # its own dispatcher takes it
        d.watch(obj, lambda ev: None)


def test_traffic_and_drain_refuse_objects_of_another_host(lab):
    a, b = Side(lab, "a"), Side(lab, "b")
    tb = Traffic(lab, "b")
    for call, kind, obj in ((lambda: tb.post_send(a.qp), "qp", a.qp),
                            (lambda: tb.post_recv(a.qp), "qp", a.qp),
                            (lambda: tb.post_srq_recv(a.srq), "srq", a.srq),
                            (lambda: tb.poll(a.cq), "cq", a.cq),
                            (lambda: tb.wait_completions(a.cq, 1, us(1)), "cq", a.cq),
                            (lambda: tb.poll_until([a.cq], lambda: True, us(1)), "cq", a.cq)):
        with pytest.raises(rdmalab.Error) as info:
            call()
        assert_foreign(info, info.value.verb, kind, obj, a, "b")
        assert info.value.verb.startswith("Traffic::")
    assert tb.ledger.check().posted == 0  # nothing was entered in the ledger
    ta = Traffic(lab, "a")
    with pytest.raises(rdmalab.Error) as info:
        drain(lab, a.qp, ta, b.cq)
    assert_foreign(info, "drain", "send_cq", b.cq, b, a)
    with pytest.raises(rdmalab.Error) as info:
        drain(lab, a.qp, ta, a.cq, b.cq)
    assert_foreign(info, "drain", "recv_cq", b.cq, b, a)
    with pytest.raises(rdmalab.Error) as info:
        drain(lab, a.qp, ta, a.cq, srq=b.srq)
    assert_foreign(info, "drain", "srq", b.srq, b, a)
    with pytest.raises(rdmalab.Error) as info:
        drain(lab, a.qp, tb, a.cq)
    assert_foreign(info, "drain", "qp", a.qp, a, "b")
    with Dispatcher(lab, b.ctx) as d:
        with pytest.raises(rdmalab.Error) as info:
            drain(lab, a.qp, ta, a.cq, dispatcher=d)
        assert_foreign(info, "drain", "dispatcher's context", b.ctx, b, a)
    assert a.qp.state == "RESET"  # refused before it moved the QP to ERR


def test_cm_pump_refuses_ids_of_another_channel(lab):
    cha = lab.host("a").process("p").event_channel()
    chb = lab.host("b").process("p").event_channel()
    id_a = cha.create_id()
    a = types.SimpleNamespace(ctx=cha, host="a")
    b = types.SimpleNamespace(ctx=chb, host="b")
    with pytest.raises(rdmalab.Error) as info:
        chb.watch(id_a, lambda ev: None)
    assert_foreign(info, "CmEventPump::watch", "cm_id", id_a, a, b)
    with pytest.raises(rdmalab.Error) as info:
        chb.hold_acks(id_a)
    assert_foreign(info, "CmEventPump::hold_acks", "cm_id", id_a, a, b)
    for verb in ("release_acks", "held_acks"):  # these pass the engine an id number only
        with pytest.raises(rdmalab.Error) as info:
            getattr(chb, verb)(id_a)
        assert_foreign(info, f"CmEventPump::{verb}", "cm_id", id_a, a, b)
    with pytest.raises(rdmalab.Error) as info:
        chb._pump.destroy_id(id_a._o, lab.now_ns + ms(1))
    assert_foreign(info, "CmEventPump::destroy_id", "cm_id", id_a, a, b)
    assert not id_a.destroyed


def test_a_proxy_of_another_agents_object_gets_the_same_error(lab, monkeypatch):
    """On an agent lab another host's object reaches a host's agent as a proxy the engine
    cannot take (pybind11 said "incompatible function arguments"): the same error instead."""
    a, b = Side(lab, "a"), Side(lab, "b")

    class Proxy:  # what an RPyC proxy of a's object answers
        def __init__(self, obj):
            self._o = types.SimpleNamespace(label=obj.label, owner=obj._o.owner)

    monkeypatch.setattr(rdmalab.agent.remote, "is_remote",
                        lambda o: isinstance(o, types.SimpleNamespace))
    with pytest.raises(rdmalab.Error) as info:
        b.ctx.reg_mr(Proxy(a.pd), 64)
    assert_foreign(info, "ibv_reg_mr", "pd", a.pd, a, b)
    with pytest.raises(rdmalab.Error) as info:
        b.ctx.create_qp(b.pd, "RC", cq=Proxy(a.cq))
    assert_foreign(info, "ibv_create_qp", "send_cq", a.cq, a, b)
    with Dispatcher(lab, b.ctx) as d:
        with pytest.raises(rdmalab.Error) as info:
            d.watch(Proxy(a.qp), lambda ev: None)
        assert_foreign(info, "AsyncDispatcher::watch", "qp", a.qp, a, b)
        with pytest.raises(rdmalab.Error) as info:
            d.destroy(Proxy(a.qp))
        assert_foreign(info, "destroy", "qp", a.qp, a, b)
    with pytest.raises(rdmalab.Error) as info:
        Traffic(lab, "b").post_send(Proxy(a.qp))
    assert_foreign(info, "Traffic::post_send", "qp", a.qp, a, "b")
    with pytest.raises(rdmalab.Error) as info:
        drain(lab, b.qp, Traffic(lab, "b"), Proxy(a.cq))
    assert_foreign(info, "drain", "send_cq", a.cq, a, b)


# -- 2. a raising handler makes the run invalid


def _invalid(lab):
    return [(r.checker, str(p)) for r in checkers.check_all(lab.history(),
                                                            checkers.context_of(lab))
            if r.verdict == "invalid" for p in r.problems]


def test_raising_dispatcher_handler_makes_the_run_invalid(lab):
    pair = RCPair(lab)

    def handler(ev):
        raise ValueError("handler bug")

    with Dispatcher(lab, pair.a.ctx) as d:
        d.watch(pair.a.qp, handler)
        lab.faults.inject_async_event("a", "QP_FATAL", pair.a.qp.qp_num)
        with pytest.raises(ValueError, match="handler bug"):
            lab.run_for(ms(1))
        d.destroy(pair.a.qp)
    rec = [r for r in lab.history() if r["kind"] == "handler_error"]
    assert len(rec) == 1 and rec[0]["object"] == pair.a.qp.label
    assert rec[0]["data"]["handler"] == pair.a.qp.label
    assert "ValueError: handler bug" in rec[0]["data"]["error"]
    assert rec[0]["data"]["event"] == "QP_FATAL"
    problems = _invalid(lab)
    assert len(problems) == 1, problems
    checker, text = problems[0]
    assert checker == "bounded"
    assert f"handler of {pair.a.qp.label} raised on QP_FATAL" in text
    assert "ValueError: handler bug" in text


def test_raising_cm_handler_makes_the_run_invalid(lab):
    ch = lab.host("a").process("client").event_channel()
    cm_id = ch.create_id()

    def bad(ev):
        raise KeyError("cm handler bug")

    ch.watch(cm_id, bad)
    cm_id.resolve_addr("b", 7471)
    with pytest.raises(KeyError):
        lab.run_for(ms(1))
    rec = [r for r in lab.history() if r["kind"] == "cm_handler_error"]
    assert len(rec) == 1 and rec[0]["data"]["handler"] == cm_id.label
    problems = [p for c, p in _invalid(lab) if c == "bounded"]
    assert len(problems) == 1, problems
    assert f"CM handler of {cm_id.label} raised on ADDR_RESOLVED" in problems[0]
    assert "KeyError: 'cm handler bug'" in problems[0]


# -- 3. integers out of their C type's range


def assert_range(info, verb, arg):
    e = info.value
    assert isinstance(e, rdmalab.Error), repr(e)
    assert e.errno == errno.EINVAL and e.verb == verb, str(e)
    assert re.search(rf"\b{re.escape(arg)}\b", e.detail), e.detail


@pytest.mark.parametrize("value", [2**40, -2**40, 2**64])
def test_create_cq_with_an_int_out_of_range(lab, value):
    ctx = lab.host("a").process("p").open_device()
    with pytest.raises(rdmalab.Error) as info:
        ctx.create_cq(value)
    assert_range(info, "ibv_create_cq", "cqe")
    assert f"cqe = {value} is outside int32 (-2147483648..2147483647)" in info.value.detail
    # OutOfRange: an Error, and a TypeError as pybind11's refusal was
    assert type(info.value) is rdmalab.errors.OutOfRange and isinstance(info.value, TypeError)
    assert str(info.value) == f"ibv_create_cq: EINVAL (22): {info.value.detail}"


@pytest.mark.parametrize("value", [2**40, -1, 2**64])
def test_verbs_with_ints_out_of_range(lab, value):
    a = Side(lab, "a")
    cases = [
        ("ibv_open_qp", "qp_num", lambda: a.ctx.open_qp(a.xrcd, value)),
        ("ibv_poll_cq", "max", lambda: a.cq.poll(value)),
        ("ibv_create_srq", "max_wr", lambda: a.ctx.create_srq(a.pd, max_wr=value)),
        ("ibv_create_qp", "max_send_wr",
         lambda: a.ctx.create_qp(a.pd, "RC", cq=a.cq, max_send_wr=value)),
        ("ibv_modify_qp", "dest_qp_num", lambda: a.qp.modify(dest_qp_num=value)),
        ("ibv_modify_srq", "srq_limit", lambda: a.srq.arm_limit(value)),
        ("inject_async_event", "number",
         lambda: lab.faults.inject_async_event("a", "QP_FATAL", value)),
    ]
    if value != 2**40:  # in range of uint64: the verbs answer for themselves
        cases += [("ibv_reg_mr", "length", lambda: a.ctx.reg_mr(a.pd, value)),
                  ("ibv_post_send", "wr_id", lambda: a.qp.post_send(wr_id=value))]
    for verb, arg, call in cases:
        if value == -1 and verb in ("ibv_poll_cq",):
            continue  # -1 is an int: the verb itself answers (nothing polled)
        with pytest.raises(rdmalab.Error) as info:
            call()
        assert_range(info, verb, arg)


@pytest.mark.parametrize("value", [-1, 2**64])
def test_timeouts_out_of_range(lab, value):
    a = Side(lab, "a")
    for verb, call in (("ibv_destroy_qp", lambda: a.qp.destroy(timeout_ns=value)),
                       ("ibv_get_async_event", lambda: a.ctx.get_async_event(value)),
                       ("Traffic::wait_completions",
                        lambda: Traffic(lab, "a").wait_completions(a.cq, 1, value))):
        with pytest.raises(rdmalab.Error) as info:
            call()
        assert_range(info, verb, "timeout_ns")
    assert not a.qp.destroyed


def test_sge_and_struct_fields_out_of_range(lab):
    a = Side(lab, "a")
    mr = a.ctx.reg_mr(a.pd, 64)
    with pytest.raises(rdmalab.Error) as info:
        a.qp.post_recv(sge=(mr.addr, 2**40, mr.lkey))
    assert_range(info, "Sge", "length")
    with pytest.raises(rdmalab.Error) as info:
        mr.read(-1, 4)
    assert_range(info, "mr_read", "offset")


# -- 4. negative durations


@pytest.mark.parametrize("method", ["sleep", "run_for"])
def test_negative_duration_refused(lab, method):
    t0 = lab.now_ns
    with pytest.raises(rdmalab.Error) as info:
        getattr(lab, method)(-1)
    e = info.value
    assert e.errno == errno.EINVAL and e.verb == method
    assert "duration_ns = -1 is negative" in e.detail
    with pytest.raises(rdmalab.Error):
        getattr(lab, method)(2**64)
    assert lab.now_ns == t0
    getattr(lab, method)(0)  # zero is a duration


def test_negative_wait_until_timeout_refused(lab):
    with pytest.raises(rdmalab.Error) as info:
        lab.wait_until(lambda: True, -1)
    e = info.value
    assert e.errno == errno.EINVAL and e.verb == "wait_until"
    assert "timeout_ns = -1 is negative" in e.detail
    lab.wait_until(lambda: True, INT64_MAX)  # the longest wait there is, clamped


def test_core_lab_refuses_negative_durations(lab):
    with pytest.raises(rdmalab.Error) as info:
        lab._o.sleep_for(-5)
    assert info.value.errno == errno.EINVAL and info.value.verb == "sleep_for"
    with pytest.raises(rdmalab.Error) as info:
        lab._o.run_for(-5)
    assert info.value.errno == errno.EINVAL and info.value.verb == "run_for"


@pytest.mark.parametrize("method", ["sleep", "run_for"])
def test_agent_lab_refuses_negative_durations(method):
    from rdmalab.labs.agent import AgentLab
    lab = object.__new__(AgentLab)  # no pool needed: time passes on the wall clock
    lab.check_errors = lambda: None
    with pytest.raises(rdmalab.Error) as info:
        getattr(lab, method)(-1)
    e = info.value
    assert e.errno == errno.EINVAL and e.verb == method
    assert "duration_ns = -1 is negative" in e.detail
    getattr(lab, method)(1000)  # 1 us: taken


def test_agent_lab_refuses_a_negative_wait_until_timeout():
    from rdmalab.labs.agent import AgentLab
    lab = object.__new__(AgentLab)
    calls = []
    with pytest.raises(rdmalab.Error) as info:
        lab.wait_until(lambda: calls.append(1), -1, "never")
    e = info.value
    assert e.errno == errno.EINVAL and e.verb == "wait_until" and "timeout_ns = -1" in e.detail
    assert not calls  # refused before the predicate ran
