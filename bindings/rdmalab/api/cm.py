"""rdma_cm, rdmacm-flavoured: an event channel per process with its event pump, ids that
listen, connect and accept, and waits that say where a connection is stuck.

    ch = proc.event_channel()                    # pump started; closed at lab shutdown
    listener = ch.listen(port=7471)
    conn = client_ch.connect("b", 7471)          # resolve, route, QP, rdma_connect
    req = listener.wait_request(ms(10))          # the new id of a CONNECT_REQUEST
    req.accept()                                 # or req.reject(b"busy")
    conn.wait("ESTABLISHED", ms(10))             # a CmEvent, or Hung naming the stuck id
    conn.events                                  # [("ADDR_RESOLVED", 0, t_ns), ...]

The pump (core/stack/connection.h) reads the channel, records every event per id, runs
handlers one at a time per id and acks every event, so destroy never waits on it, unless a
scenario leaves events unread (ch.pause_reading()) or unacked (ch.hold_acks(id)). Event and
state names are the spec's ("DISCONNECTED", "TIMEWAIT"); timeouts are relative ns. The events'
values and the calls' arguments are rdmalab.api.cm_values'.
"""

from __future__ import annotations

import contextlib
import errno as _errno
from typing import Callable, Iterable, Optional

from .. import _core
from .. import progress
from ..errors import DeadlineExceeded, Error, Hung, make_error, raise_parked
from ..names import name, parse, sec
from ..protocol import VIRTUAL_TIME
from .cm_values import (DEFAULT_PORT, FAILURE_TYPES, CmEvent, CmEventError, CmEventRecord,
                        check_port, endpoint_spec, make_conn_param, make_timing)
from .requests import make_qp_cap
from .verbs import Context, Cq, Pd, Qp, unwrap

# wait()'s event types by wanted event, when fail_on is the default (built once: comparing
# the engine's enums costs more than the wait itself when the event is there already).
_DEFAULT_WAIT_TYPES: dict[str, list] = {}
_QUIET = contextlib.nullcontext()


def _waiting(lab, what: Callable[[], str], timeout_ns: int):
    """A progress line every 10 s while a device lab's wait runs long (rdmalab.progress); a
    model lab's waits are on its virtual clock and say nothing (what() is not even built)."""
    if lab.has(VIRTUAL_TIME):
        return _QUIET
    return progress.Waiting(what(), timeout_ns / 1e9)


class CmChannel:
    """rdma_create_event_channel with its event pump (started). Closed at lab shutdown."""

    def __init__(self, process, o, workers: int = 2):
        self.process, self._o = process, o
        self.lab = process.host.lab
        self._pump = _core.CmEventPump(self.lab._o, o, process.host.name, workers)
        self._pump.start()
        self._ids: dict[int, CmId] = {}
        self._closed = False
        self.lab.add_closer(self._at_lab_shutdown)

    label = property(lambda self: self._o.label)
    running = property(lambda self: self._pump.running)

    @property
    def ids(self) -> list["CmId"]:
        """The ids made through this channel (and CONNECT_REQUEST ids taken), live or not."""
        return list(self._ids.values())

    def create_id(self) -> "CmId":
        """rdma_create_id (RDMA_PS_TCP, RC): an id in IDLE."""
        return self._wrap(self._run(self._o.create_id), "id")

    def listen(self, port: int = DEFAULT_PORT, backlog: int = 16) -> "CmId":
        """rdma_create_id + rdma_listen: an id in LISTEN; wait_request() takes its requests."""
        check_port("rdma_listen", port)
        return self._wrap(self._run(_core.cm_listen, self._pump, port, backlog), "listener")

    def connect(self, dst, port: int = DEFAULT_PORT, *, timeout_ns: int = sec(1),
                timing=None, private_data: bytes = b"", cqe: int = 64,
                resolve_timeout_ns: Optional[int] = None, **kw) -> "CmId":
        """The active side up to rdma_connect: resolve the address and route, make a PD, CQ
        and RC QP on the id's device, connect. Returns at once after rdma_connect; wait for
        "ESTABLISHED" with .wait(). kw: QP capabilities (max_send_wr, ...) and connection
        parameters (responder_resources, initiator_depth, retry_count, rnr_retry_count).
        A step that does not finish by timeout_ns raises Hung naming it."""
        dst = self.lab.address_of(dst if isinstance(dst, str) else dst.name)
        check_port("rdma_resolve_addr", port)
        spec = endpoint_spec(dst, port, timing=timing, private_data=private_data, cqe=cqe,
                             resolve_timeout_ns=resolve_timeout_ns, **kw)
        try:
            with _waiting(self.lab, lambda: f"connecting {self.process.host.name} to {dst} "
                          f"(resolve, route, rdma_connect)", timeout_ns):
                conn = self._run(_core.cm_connect, self._pump, spec,
                                 self.lab.now_ns + timeout_ns)
        except DeadlineExceeded as e:
            raise self._hung(e.detail, timeout_ns, e.verb) from e
        cm_id = self._wrap(conn.id, "active side")
        cm_id._adopt(conn)
        return cm_id

    def watch(self, cm_id: "CmId", handler: Callable[[CmEvent], None]) -> None:
        """handler(CmEvent) for the id's events, one at a time, in order; acked after it
        returns. A listener's handler also gets the CONNECT_REQUEST ids' events."""
        lab = self.lab
        self._pump.watch(unwrap(cm_id), lambda ev: handler(CmEvent.from_core(ev, lab.now_ns)))

    def set_default_handler(self, handler: Optional[Callable[[CmEvent], None]]) -> None:
        fn = None if handler is None else (
            lambda ev: handler(CmEvent.from_core(ev, self.lab.now_ns)))
        self._pump.set_default_handler(fn)

    def stats(self) -> _core.CmPumpStats:
        return self._pump.stats()

    # -- leaving events unread or unacked (what does rdma_destroy_id do with them?)
    def pause_reading(self, timeout_ns: int = sec(1)) -> None:
        """The pump stops reading the channel (rdma_get_cm_event): events stay unread in it
        until resume_reading(). A channel is one queue, so this holds every id's events.
        Returns once the pump is out of rdma_get_cm_event (an event it read meanwhile is
        handled as usual)."""
        pump = self._pump
        self._run(lambda: pump.pause_reading(self.lab.now_ns + timeout_ns))

    def resume_reading(self) -> None:
        self._run(self._pump.resume_reading)

    def hold_acks(self, cm_id: "CmId") -> None:
        """Events of cm_id read from now on are recorded and handled but not acked
        (rdma_ack_cm_event), dropped ones too, until release_acks(cm_id)."""
        self._run(self._pump.hold_acks, unwrap(cm_id))

    def release_acks(self, cm_id: "CmId") -> int:
        """Acks cm_id's held events and stops holding; returns how many it acked."""
        self._mine(cm_id, "CmEventPump::release_acks")
        return self._run(self._pump.release_acks, cm_id.id)

    def held_acks(self, cm_id: "CmId") -> int:
        self._mine(cm_id, "CmEventPump::held_acks")
        return self._pump.held_acks(cm_id.id)

    def _mine(self, cm_id: "CmId", verb: str) -> None:
        """The pump takes these by id number: the engine's check_owner first, the one error
        for an id of another channel (README "Misuse")."""
        _core.check_owner(self._o, unwrap(cm_id), verb, "cm_id")

    def close(self, timeout_ns: int = sec(1)) -> None:
        """Destroys every live id (with its QP, CQ and PD), stops the pump and destroys the
        channel. Idempotent."""
        if self._closed:
            return
        for listener in [i for i in self._ids.values() if i.role == "listener"]:
            for ev in listener.event_list():  # requests nobody took with wait_request
                if ev.event == "CONNECT_REQUEST" and ev.id not in self._ids:
                    o = self._known(ev.id)
                    if o is not None:
                        self._wrap(o, "passive side")
        for cm_id in list(self._ids.values()):
            if not cm_id.destroyed:
                cm_id.destroy(timeout_ns)
        self._stop_pump(timeout_ns)
        self._closed = True
        self._run(self._o.destroy)

    def __enter__(self) -> "CmChannel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<CmChannel {self.label} of {self.process.name} on {self.process.host.name}>"

    # -- internals
    def _at_lab_shutdown(self) -> None:
        # No raise_parked here: the lab must shut down; the plugin re-raises parked errors.
        if self._pump.running:
            self._pump.stop(self.lab.now_ns + sec(1))

    def _stop_pump(self, timeout_ns: int = sec(1)) -> None:
        if self._pump.running:
            pump = self._pump
            self._run(lambda: pump.stop(self.lab.now_ns + timeout_ns))

    def _run(self, fn: Callable, *args):
        result = fn(*args)
        raise_parked()
        return result

    def _known(self, id_object: int):
        """The engine's id, or None when it is gone (destroyed below this channel)."""
        try:
            return self._o.cm_id(id_object)
        except Error as e:
            if e.errno == _errno.ENOENT:
                return None
            raise

    def _wrap(self, o, role: str) -> "CmId":
        known = self._ids.get(o.id)
        if known is None:
            known = self._ids[o.id] = CmId(self, o, role)
        return known

    def _hung(self, what: str, timeout_ns: int, verb: str) -> Hung:
        start = self.lab.now_ns - timeout_ns
        return Hung(what, self.lab.diagnostic(f"{what} (waited {timeout_ns} ns from t={start} ns)"),
                    verb)


class CmId:
    """An rdma_cm id (rdma_cm_id). Connected ids carry .qp, .pd, .cq on .ctx (the id's
    device); .request is the CONNECT_REQUEST that made a passive id."""

    def __init__(self, channel: CmChannel, o, role: str):
        self.channel, self._o, self.role = channel, o, role
        self.ctx: Optional[Context] = None
        self.pd: Optional[Pd] = None
        self.cq: Optional[Cq] = None
        self.qp: Optional[Qp] = None
        self.request: Optional[CmEvent] = None

    id = property(lambda self: self._o.id)
    label = property(lambda self: self._o.label)
    destroyed = property(lambda self: self._o.destroyed)
    cm_state = property(lambda self: self._o.cm_state)
    protocol_state = property(lambda self: self._o.protocol_state)

    @property
    def lab(self):
        return self.channel.lab

    @property
    def events(self) -> list[CmEventRecord]:
        """Every event read for this id, in order: (name, status, t_ns)."""
        return [CmEventRecord(name(r.event.event), r.event.status, r.read_ns)
                for r in self.channel._pump.events(self.id)]

    def event_list(self) -> list[CmEvent]:
        """The same history as full CmEvents (private data, seq)."""
        return [CmEvent.from_core(r.event, r.read_ns) for r in self.channel._pump.events(self.id)]

    def count(self, event) -> int:
        ev = name(parse(_core.CmEventType, event, "CM event"))
        return sum(1 for r in self.events if r.name == ev)

    # -- waits
    def wait(self, event, timeout_ns: int = sec(1), *, min_count: int = 1,
             fail_on: Optional[Iterable[str]] = None) -> CmEvent:
        """The id's event (its min_count-th of that type), once the pump has read it. Raises
        Hung naming the id, its states and its events at the timeout, and CmEventError at an
        event of fail_on (default: FAILURE_EVENTS) that comes first."""
        if min_count < 1:
            raise ValueError("min_count must be >= 1")
        want = parse(_core.CmEventType, event, "CM event")
        want_name = name(want)
        if fail_on is None:
            types = _DEFAULT_WAIT_TYPES.get(want_name)
            if types is None:
                types = _DEFAULT_WAIT_TYPES[want_name] = [want] + [
                    t for t in FAILURE_TYPES if t != want]
        else:
            types = [want] + [parse(_core.CmEventType, f, "CM event") for f in fail_on
                              if f != want_name]
        lab, pump, cm_id = self.lab, self.channel._pump, self.id
        deadline = lab.now_ns + timeout_ns
        index = 0
        for n in range(min_count):
            with _waiting(lab, lambda: f"waiting for {want_name}" + (
                    f" #{n + 1}" if min_count > 1 else "") + f" on {self._where()}",
                          deadline - lab.now_ns):
                rec = self._run(pump.wait_first, cm_id, types, deadline, index)
            if rec is None:
                raise self._hung(f"waiting for {want_name}", timeout_ns)
            got = CmEvent.from_core(rec.event, rec.read_ns)
            if got.event != want_name:
                raise self._failed(got, want_name)
            if n + 1 < min_count:
                index = self._index_of(rec.event.seq) + 1
        return got

    def wait_request(self, timeout_ns: int = sec(1)) -> "CmId":
        """A listener's next CONNECT_REQUEST, as the new passive id (.request is the event)."""
        pump = self.channel._pump
        with _waiting(self.lab, lambda: f"waiting for CONNECT_REQUEST on {self._where()}",
                      timeout_ns):
            ev = self._run(lambda: pump.next_connect_request(self.id,
                                                             self.lab.now_ns + timeout_ns))
        if ev is None:
            raise self._hung("waiting for CONNECT_REQUEST", timeout_ns)
        cm_id = self.channel._wrap(self.channel._o.cm_id(ev.id), "passive side")
        cm_id.request = CmEvent.from_core(ev, self.lab.now_ns)
        return cm_id

    # -- verbs
    def resolve_addr(self, dst, port: int = DEFAULT_PORT, timeout_ns: int = sec(2)) -> None:
        check_port("rdma_resolve_addr", port)
        self._run(self._o.resolve_addr, dst if isinstance(dst, str) else dst.name, port,
                  timeout_ns)

    def resolve_route(self, timeout_ns: int = sec(2)) -> None:
        self._run(self._o.resolve_route, timeout_ns)

    def listen(self, port: int = DEFAULT_PORT, backlog: int = 16) -> None:
        self._run(self._o.listen, check_port("rdma_listen", port), backlog)

    def set_timing(self, timing=None, **kw) -> None:
        """rdma_set_option: cm_response_timeout, max_cm_retries, packet_life_time."""
        self._run(self._o.set_timing, make_timing(timing, **kw) or _core.CmTiming())

    def create_qp(self, cqe: int = 64, **caps) -> Qp:
        """rdma_create_qp: an RC QP bound to this id, with a new PD and CQ on its device."""
        core_ctx = self._run(self._o.context)
        if core_ctx is None:
            raise make_error("rdma_create_qp", _errno.EINVAL,
                             f"{self.label} has no device (address not resolved)")
        ctx = Context(self.channel.process, core_ctx)
        pd, cq = ctx.alloc_pd(), ctx.create_cq(cqe)
        init = _core.QpInitAttr()
        init.qp_type = _core.QpType.RC
        init.pd, init.send_cq, init.recv_cq = unwrap(pd), unwrap(cq), unwrap(cq)
        init.cap = make_qp_cap(**caps)
        try:
            qp = Qp(ctx, self._run(self._o.create_qp, unwrap(pd), init))
        except Error:
            cq.destroy()
            pd.dealloc()
            raise
        self.ctx, self.pd, self.cq, self.qp = ctx, pd, cq, qp
        return qp

    def connect(self, private_data: bytes = b"", **param) -> None:
        """rdma_connect on this id as it is (ch.connect() does the whole active side)."""
        self._run(self._o.connect, make_conn_param(private_data, **param))

    def accept(self, private_data: bytes = b"", *, timing=None, cqe: int = 64, **kw) -> None:
        """rdma_accept, with an RC QP (and PD, CQ) made on the id's device first."""
        spec = endpoint_spec(timing=timing, private_data=private_data, cqe=cqe, **kw)
        conn = self._run(_core.cm_accept, self.channel._pump, self._o, spec)
        if self.qp is None:
            self._adopt(conn)

    def reject(self, private_data: bytes = b"") -> None:
        self._run(self._o.reject, bytes(private_data))

    def disconnect(self) -> None:
        self._run(self._o.disconnect)

    def destroy(self, timeout_ns: int = sec(1)) -> None:
        """The librdmacm teardown: QP, CQ, then rdma_destroy_id through the pump (its queued
        events dropped, a running handler waited for), then the PD."""
        conn = _core.CmConnection(self._o, unwrap(self.pd), unwrap(self.cq), unwrap(self.qp))
        pump = self.channel._pump
        self._run(lambda: _core.cm_close(pump, conn, self.lab.now_ns + timeout_ns))

    def __repr__(self) -> str:
        return f"<CmId {self.label} {self.role}>"

    # -- internals
    def _run(self, fn: Callable, *args):
        return self.channel._run(fn, *args)

    def _adopt(self, conn) -> None:
        """Takes the PD, CQ and QP a helper made on the id's device."""
        self.ctx = Context(self.channel.process, self._o.context())
        self.pd, self.cq, self.qp = Pd(self.ctx, conn.pd), Cq(self.ctx, conn.cq), Qp(self.ctx,
                                                                                    conn.qp)

    def _index_of(self, seq: int) -> int:
        for i, r in enumerate(self.channel._pump.events(self.id)):
            if r.event.seq == seq:
                return i
        return 0

    def _where(self) -> str:
        return f"{self.channel.process.host.name} ({self.role} {self.label})"

    def _states(self) -> str:
        try:
            return f"{self.cm_state}/{self.protocol_state}"
        except Error as e:
            return f"?({e.errno_name})"

    def _hung(self, what: str, timeout_ns: int) -> Hung:
        seen = ", ".join(f"{r.name}({r.status})" if r.status else r.name
                         for r in self.events) or "none"
        detail = (f"{self.role} {self.label} on {self.channel.process.host.name} stuck in "
                  f"{self._states()} {what} (events: {seen})")
        return self.channel._hung(detail, timeout_ns, "rdma_get_cm_event")

    def _failed(self, got: CmEvent, want: str) -> CmEventError:
        err = -got.status if got.status < 0 else (
            _errno.ECONNREFUSED if got.event == "REJECTED" else _errno.EPROTO)
        detail = (f"{self.role} {self.label}: {got.event} (status {got.status_name}) instead "
                  f"of {want}")
        exc = make_error("rdma_get_cm_event", err, detail, cls=CmEventError)
        exc.event = got
        return exc


CmConn = CmId  # the name the task brief used; one class serves listeners and connections

__all__ = ["CmChannel", "CmConn", "CmId"]
