"""The stack helpers of core/stack over the Python objects: QP bring-up, exactly-once
traffic accounting, the async event dispatcher and the portable drain. Timeouts are relative
(ns from now); enums are strings."""

from __future__ import annotations

import errno
from typing import Callable, Iterable, Optional

from .. import _core
from ..agent import remote as _remote
from ..errors import deadline_ns, make_error, raise_parked
from ..names import access_flags, name, parse, sec
from .verbs import (DEFAULT_DESTROY_TIMEOUT_NS, WC, AsyncEvent, Context, Cq, Qp, Srq,
                    engine_object, make_recv_wr, make_send_wr, unwrap)

Endpoint = _core.Endpoint
LedgerReport = _core.LedgerReport
DrainReport = _core.DrainReport


def _run(fn: Callable, *args):
    result = fn(*args)
    raise_parked()
    return result


def rc_params(**kw) -> _core.RcParams:
    """RcParams from keywords (path_mtu, timeout, retry_cnt, rnr_retry, min_rnr_timer,
    max_rd_atomic, max_dest_rd_atomic, access, qkey, pkey_index)."""
    p = _core.RcParams()
    for key, value in kw.items():
        if not hasattr(p, key):
            raise TypeError(f"unknown RC parameter {key!r}")
        setattr(p, key, access_flags(value) if key == "access" else value)
    return p


def local_endpoint(qp: Qp, psn: int = 0) -> Endpoint:
    """What a peer needs to reach qp (QPN, PSN, GID, transport)."""
    return _run(_core.local_endpoint, unwrap(qp.ctx), unwrap(qp), psn)


def bring_up(qp: Qp, local: Endpoint, remote: Endpoint, params=None) -> None:
    """RESET -> INIT -> RTR -> RTS (XRC_RECV stops at RTR) with the attributes its type needs.
    A QP in an agent is brought up there; the endpoints travel as values."""
    agent = _remote.agent_of(qp)
    if agent is not None:
        agent.call("rdmalab.api.stack", "bring_up", qp, endpoint_values(local),
                   endpoint_values(remote), params_values(params))
        return
    if params is None:
        params = _core.RcParams()
    elif isinstance(params, dict):
        params = rc_params(**params)
    elif isinstance(params, tuple):
        params = rc_params(**dict(params))
    _run(_core.bring_up, unwrap(qp), as_endpoint(local), as_endpoint(remote), params)


_EP_FIELDS = ("qp_num", "psn", "lid", "port_num")
_RC_FIELDS = ("path_mtu", "timeout", "retry_cnt", "rnr_retry", "min_rnr_timer", "max_rd_atomic",
              "max_dest_rd_atomic", "access", "qkey", "pkey_index")


def endpoint_values(ep) -> tuple:
    """An Endpoint (here or in an agent) as a tuple of plain values, which RPyC copies. One
    in an agent is read there: one round trip, not one per field."""
    if isinstance(ep, tuple):
        return ep
    agent = _remote.agent_of(ep)
    if agent is not None:
        return agent.call("rdmalab.api.stack", "endpoint_values", ep)
    return tuple(int(getattr(ep, f)) for f in _EP_FIELDS) + (bytes(ep.gid.raw),
                                                                str(ep.transport.name))


def as_endpoint(ep) -> Endpoint:
    if not isinstance(ep, tuple):
        return ep
    out = _core.Endpoint()
    for f, v in zip(_EP_FIELDS, ep):
        setattr(out, f, v)
    gid = _core.Gid()
    gid.raw = ep[len(_EP_FIELDS)]
    out.gid = gid
    out.transport = parse(_core.Transport, ep[len(_EP_FIELDS) + 1], "transport")
    return out


def params_values(params) -> Optional[tuple]:
    if params is None or isinstance(params, tuple):
        return params
    if isinstance(params, dict):
        return tuple(params.items())
    return tuple((f, getattr(params, f)) for f in _RC_FIELDS)


def connect(qp_a: Qp, qp_b: Qp, psn_a: int = 0, psn_b: int = 0, params=None) -> None:
    """Brings two QPs up towards each other (endpoints exchanged out of band)."""
    ep_a, ep_b = local_endpoint(qp_a, psn_a), local_endpoint(qp_b, psn_b)
    bring_up(qp_a, ep_a, ep_b, params)
    bring_up(qp_b, ep_b, ep_a, params)


class Traffic:
    """Posting and polling through a completion ledger: every WR gets a unique wr_id (when
    given 0) and exactly one outcome. check() reports violations and unknown outcomes."""

    def __new__(cls, lab, host: str = ""):
        return _remote.new(cls, lab, host, host)

    def __init__(self, lab, host: str = ""):
        self.lab = lab
        self.ledger = _core.CompletionLedger(lab._o, host)
        self._o = _core.Traffic(lab._o, self.ledger, host)

    # A Traffic of a host takes that host's objects only (the engine's check_owner: Error
    # EINVAL naming the object and both hosts).
    def _obj(self, obj, verb: str, kind: str):
        o = unwrap(obj)
        if _remote.is_remote(o):  # another agent's object: the same error, here
            engine_object(o, self._o.scope, f"Traffic::{verb}", kind)
        return o

    # count= posts that many WRs, one ibv_post_* call each, exactly as a loop of posts (as
    # pyverbs' tests/utils.py post_recv(num_wqes=)): in an agent, one round trip for all.
    # Each WR needs its own wr_id, so a count above 1 takes wr_id 0 (the ledger gives each a
    # unique one). Returns the last WR's wr_id.
    def post_send(self, qp: Qp, wr_id: int = 0, opcode="SEND", sge=None, count: int = 1,
                  **kw) -> int:
        return self._post("post_send", qp, "qp", make_send_wr(wr_id, opcode, sge, **kw), count)

    def post_recv(self, qp: Qp, wr_id: int = 0, sge=None, count: int = 1) -> int:
        return self._post("post_recv", qp, "qp", make_recv_wr(wr_id, sge), count)

    def post_srq_recv(self, srq: Srq, wr_id: int = 0, sge=None, count: int = 1) -> int:
        return self._post("post_srq_recv", srq, "srq", make_recv_wr(wr_id, sge), count)

    def _post(self, verb: str, obj, kind: str, wr, count) -> int:
        if type(count) is not int:
            raise TypeError(f"Traffic::{verb}: count must be an int, not {type(count).__name__}")
        if count < 1 or (count > 1 and wr.wr_id):
            why = (f"count = {count}: at least one WR" if count < 1 else
                   f"count = {count} with wr_id = {wr.wr_id}: each WR needs its own wr_id")
            raise make_error(f"Traffic::{verb}", errno.EINVAL, why)
        post, target = getattr(self._o, verb), self._obj(obj, verb, kind)
        for _ in range(count):
            posted = _run(post, target, wr)
        return posted

    def poll(self, cq: Cq, max: int = 32) -> list[WC]:
        return [WC.from_core(w) for w in _run(self._o.poll, self._obj(cq, "poll", "cq"), max)]

    def wait_completions(self, cq: Cq, n: int, timeout_ns: int = sec(1)) -> bool:
        """Polls until n more completions came from cq; False at the timeout."""
        o, raw = self._o, self._obj(cq, "wait_completions", "cq")
        deadline = deadline_ns("Traffic::wait_completions", self.lab.now_ns, timeout_ns)
        return _run(lambda: o.wait_completions(raw, n, deadline))

    def poll_until(self, cqs: Iterable[Cq], pred: Callable[[], bool],
                   timeout_ns: int = sec(1)) -> bool:
        o, raw = self._o, [self._obj(c, "poll_until", "cq") for c in cqs]
        deadline = deadline_ns("Traffic::poll_until", self.lab.now_ns, timeout_ns)
        return _run(lambda: o.poll_until(raw, pred, deadline))

    def completions(self, since: int = 0) -> list[WC]:
        raw = self._o.completions_since(since) if since else self._o.completions()
        return [WC.from_core(w) for w in raw]

    def outstanding(self, qp_or_label, queue="SQ") -> int:
        q = parse(_core.WorkQueue, queue, "work queue")
        key = qp_or_label if isinstance(qp_or_label, str) else unwrap(qp_or_label).qp_num
        return self.ledger.outstanding(key, q)

    def check(self) -> LedgerReport:
        return self.ledger.check()


class Dispatcher:
    """Async events with seed 002's lifetime rules: per-object ordered handlers, none after
    destroy, destroy waits for handlers in flight. Handlers get an rdmalab AsyncEvent.
    Use as a context manager (start/stop)."""

    def __new__(cls, lab, ctx: Context, host: str = "", workers: int = 2):
        return _remote.new(cls, lab, ctx, ctx, host, workers)

    def __init__(self, lab, ctx: Context, host: str = "", workers: int = 2):
        self.lab, self.ctx = lab, ctx
        self._o = _core.AsyncDispatcher(lab._o, unwrap(ctx), host or ctx.process.host.name,
                                        workers)

    def start(self) -> "Dispatcher":
        _run(self._o.start)
        return self

    def stop(self, timeout_ns: int = sec(1)) -> None:
        o = self._o
        deadline = deadline_ns("AsyncDispatcher::stop", self.lab.now_ns, timeout_ns)
        _run(lambda: o.stop(deadline))

    @property
    def running(self) -> bool:
        return self._o.running

    # Only objects of the dispatcher's context: another context's events never come here (the
    # engine's check_owner: Error EINVAL naming the object and both contexts).
    def _obj(self, obj, verb: str, check: bool = False):
        o = engine_object(obj, self.ctx, verb, _kind(obj))
        if check:  # the engine takes only the id: checked here, by the engine's rule
            _core.check_owner(unwrap(self.ctx), o, verb, _kind(obj))
        return o

    def watch(self, obj, handler: Callable[[AsyncEvent], None]) -> None:
        self._o.watch(self._obj(obj, "AsyncDispatcher::watch"),
                      lambda ev: handler(AsyncEvent.from_core(ev)))

    def set_default_handler(self, handler: Callable[[AsyncEvent], None]) -> None:
        self._o.set_default_handler(lambda ev: handler(AsyncEvent.from_core(ev)))

    def destroy(self, obj, timeout_ns: int = DEFAULT_DESTROY_TIMEOUT_NS) -> None:
        """Destroys a watched QP, SRQ or CQ after its handlers are done (seed 002 order); the
        handlers and then the backend's wait for acks (EBUSY) end at timeout_ns."""
        raw = self._obj(obj, "destroy")  # first: another agent's object is no Qp type here
        verb = {Qp: self._o.destroy_qp, Srq: self._o.destroy_srq, Cq: self._o.destroy_cq}.get(
            type(obj))
        if verb is None:
            raise TypeError(f"destroy takes a Qp, Srq or Cq, got {type(obj).__name__}")
        deadline = deadline_ns("destroy", self.lab.now_ns, timeout_ns)
        _run(lambda: verb(raw, deadline))

    def wait_event(self, obj, event_type, timeout_ns: int = sec(1), min_count: int = 1) -> bool:
        raw = self._obj(obj, "AsyncDispatcher::wait_event", check=True)
        t = parse(_core.AsyncEventType, event_type, "async event type")
        o = self._o
        deadline = deadline_ns("AsyncDispatcher::wait_event", self.lab.now_ns, timeout_ns)
        return _run(lambda: o.wait_event(raw.id, t, deadline, min_count))

    def count_events(self, obj, event_type) -> int:
        raw = self._obj(obj, "AsyncDispatcher::count_events", check=True)
        t = parse(_core.AsyncEventType, event_type, "async event type")
        return self._o.count_events(raw.id, t)

    def events_for(self, obj) -> list[AsyncEvent]:
        raw = self._obj(obj, "AsyncDispatcher::events_for", check=True)
        return [AsyncEvent.from_core(e) for e in self._o.events_for(raw.id)]

    def stats(self) -> _core.DispatcherStats:
        return self._o.stats()

    def __enter__(self) -> "Dispatcher":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def drain(lab, qp: Qp, traffic: Traffic, send_cq: Cq, recv_cq: Optional[Cq] = None,
          timeout_ns: int = sec(1), dispatcher: Optional[Dispatcher] = None,
          srq: Optional[Srq] = None) -> DrainReport:
    """The portable drain (seed 000): ERR, markers or counting, poll until all flushed."""
    agent = _remote.agent_of(qp)
    if agent is not None:
        return agent.call("rdmalab.api.stack", "drain", agent.lab, qp, traffic, send_cq, recv_cq,
                          timeout_ns, dispatcher, srq)
    recv_cq = send_cq if recv_cq is None else recv_cq
    d = None if dispatcher is None else dispatcher._o
    deadline = deadline_ns("drain", lab.now_ns, timeout_ns)
    # Everything of qp's context: the engine refuses others (check_owner), and a proxy of
    # another agent's object here.
    where = unwrap(qp)
    parts = [engine_object(x, where, "drain", kind) for x, kind in
             ((send_cq, "send_cq"), (recv_cq, "recv_cq"), (srq, "srq"))]
    return _run(_core.drain_qp, lab._o, unwrap(qp), traffic._o, parts[0], parts[1],
                deadline, d, parts[2])  # the QP knows its device's err_post


def outcome_name(value) -> str:
    return name(value)


def _kind(obj) -> str:
    """The kind a verbs object's label names: "qp" for "qp:7" ("object" for anything else)."""
    label = getattr(unwrap(obj), "label", None)
    return str(label).split(":", 1)[0] if label is not None else "object"
