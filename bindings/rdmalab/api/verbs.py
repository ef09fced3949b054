"""The verbs objects, pyverbs-flavoured: Context, Pd, Mr, Cq, Srq, Xrcd, Qp, and the values
they hand back (WC, AsyncEvent, DeviceCaps). Each wraps a _core object; enums are strings;
timeouts are relative (ns from now); every call re-raises errors parked by callbacks."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from .. import _core
from .. import kernel
from ..agent import remote as _remote
from . import requests as _requests
from ..errors import deadline_ns, out_of_range_kept, raise_parked
from ..names import access_flags, name, parse, sec

# The request builders, an integer out of its field's range raised as the engine's OutOfRange
# (an Error, EINVAL, naming the verb and the field).
make_modify = out_of_range_kept(_requests.make_modify)
make_qp_cap = out_of_range_kept(_requests.make_qp_cap)
make_recv_wr = out_of_range_kept(_requests.make_recv_wr)
make_send_wr = out_of_range_kept(_requests.make_send_wr)
srq_attr = out_of_range_kept(_requests.srq_attr)

DEFAULT_DESTROY_TIMEOUT_NS = sec(1)


def unwrap(obj):
    """The _core object behind a wrapper (or obj itself)."""
    return getattr(obj, "_o", obj)


def engine_object(obj, where, verb: str, kind: str):
    """The _core object behind obj (None for None) for a call through `where` (a context or
    other verbs object, its _core object, or an owner tuple (id, label, host)). The engine
    refuses an object of another context or host itself (check_owner: Error EINVAL, "pd pd:2
    is of ctx:1 on host a, not of ctx:9 on host b"); an object it cannot even see, a proxy of
    another agent's object (another host of an agent lab), gets the same error here."""
    o = unwrap(obj)
    if o is not None and _remote.is_remote(o):
        w = where if isinstance(where, tuple) else unwrap(where).owner
        _core.raise_foreign_object(verb, kind, str(o.label), tuple(o.owner), tuple(w))
    return o


def _run(fn: Callable, *args):
    result = fn(*args)
    raise_parked()
    return result


@dataclasses.dataclass(frozen=True)
class DeviceCaps:
    """What a device can do (types.h DeviceCaps) with enums as strings. raises empty means
    the backend does not know which async events the device raises (real devices)."""
    name: str
    personality: str
    transport: str
    xrc: bool
    srq: bool
    ud: bool
    node_guid: int
    max_qp: int
    max_qp_wr: int
    max_sge: int
    max_cq: int
    max_cqe: int
    max_srq: int
    max_srq_wr: int
    max_mr: int
    phys_port_cnt: int
    err_post: str
    xrc_tgt_lifetime: str
    retry_cnt_7_infinite: bool
    reports_qp_state: bool
    qpn_policy: str  # "increment", "lifo" (a freed QPN to the next create: mana), "unknown"
    local_ca_ack_delay: int
    kernel_hz: int  # the host kernel's CONFIG_HZ (0 = unknown): its timers tick in jiffies
    # Provider facts (types.h DeviceCaps; findings.toml provider-fact entries).
    disassociates: bool              # removal raises DEVICE_FATAL (else waits for the user)
    send_completes_on_handoff: bool  # SEND completes when handed to TCP (siw)
    connect_is_synchronous: bool     # rdma_connect does the TCP connect (siw)
    iw_close_timeout_s: int          # iWARP close: 0 = at once (siw); else cxgb4's ep timer
    rts_needs_cm: bool               # RTS only through the CM (a real iWARP device)
    refused_send_resend_races: bool  # a send its own stack refuses: racy resend (rxe < 6.12)
    tcp_syn_retries: int             # the host's net.ipv4.tcp_syn_retries
    raises: tuple[str, ...]
    # The kernel the device runs under (uname -r on a device; the personality's on the model):
    # a finding fixed in a later kernel does not apply to it (findings.toml kernels.fixed).
    kernel_release: str = ""

    @classmethod
    def from_core(cls, c: _core.DeviceCaps, host_kernel: "kernel.KernelIdentity") -> "DeviceCaps":
        """The engine's caps with the kernel the device runs under, as its lab says
        (EngineLab.kernel_identity: the model's personality, or this host's kernel)."""
        fields = {f.name: getattr(c, f.name) for f in dataclasses.fields(cls)
                  if f.name != "kernel_release"}
        for key in ("transport", "err_post", "xrc_tgt_lifetime", "qpn_policy"):
            fields[key] = name(fields[key])
        fields["raises"] = tuple(name(t) for t in c.raises)
        fields.update(kernel_hz=host_kernel.hz, kernel_release=host_kernel.release,
                      tcp_syn_retries=host_kernel.tcp_syn_retries)
        return cls(**fields)

    def raises_event(self, event) -> Optional[bool]:
        """True/False for a known list, None where the backend does not know."""
        ev = name(parse(_core.AsyncEventType, event, "async event type"))
        return (ev in self.raises) if self.raises else None


@dataclasses.dataclass(frozen=True)
class WC:
    """A work completion (ibv_wc); status and opcode as names ("WR_FLUSH_ERR", "RECV")."""
    wr_id: int
    status: str
    opcode: str
    vendor_err: int
    byte_len: int
    imm_data: int
    qp_num: int
    src_qp: int
    with_imm: bool

    @classmethod
    def from_core(cls, w: _core.WorkCompletion) -> "WC":
        return cls(w.wr_id, name(w.status), name(w.opcode), w.vendor_err, w.byte_len, w.imm_data,
                   w.qp_num, w.src_qp, w.with_imm)

    @property
    def ok(self) -> bool:
        return self.status == "SUCCESS"

    def __repr__(self) -> str:
        return f"WC(wr_id={self.wr_id}, {self.status}, {self.opcode}, qp_num={self.qp_num})"


@dataclasses.dataclass(frozen=True)
class AsyncEvent:
    """An async event (ibv_async_event): .type ("QP_FATAL"), .kind ("QP"), the affiliated
    object's engine id and wire numbers. Keep it to ack it."""
    type: str
    kind: str
    object_id: int
    qp_num: int
    srq_num: int
    port_num: int
    seq: int
    raw: Any = dataclasses.field(repr=False, compare=False)

    @classmethod
    def from_core(cls, e: _core.AsyncEvent) -> "AsyncEvent":
        return cls(name(e.type), name(e.kind), e.object_id, e.qp_num, e.srq_num, e.port_num, e.seq,
                   e)


class _Obj:
    """Common face of verbs objects: id, label ("qp:3"), destroyed; equality by engine object."""
    _o: Any

    @property
    def id(self) -> int:
        return self._o.id

    @property
    def label(self) -> str:
        return self._o.label

    @property
    def destroyed(self) -> bool:
        return self._o.destroyed

    def __eq__(self, other) -> bool:
        return isinstance(other, _Obj) and self._o is other._o

    def __hash__(self) -> int:
        return hash(id(self._o))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.label}>"


class Pd(_Obj):
    def __init__(self, ctx: "Context", o):
        self.ctx, self._o = ctx, o

    def dealloc(self) -> None:
        _run(self._o.dealloc)


class Mr(_Obj):
    def __init__(self, ctx: "Context", o):
        self.ctx, self._o = ctx, o

    lkey = property(lambda self: self._o.lkey)
    rkey = property(lambda self: self._o.rkey)
    addr = property(lambda self: self._o.addr)
    length = property(lambda self: self._o.length)

    def sge(self, offset: int = 0, length: Optional[int] = None) -> tuple[int, int, int]:
        """(addr, length, lkey) for a slice of this MR, for post_send/post_recv."""
        if length is None:
            length = self.length - offset
        return (self.addr + offset, length, self.lkey)

    def read(self, offset: int = 0, length: Optional[int] = None) -> bytes:
        return _run(self._o.read, offset, self.length - offset if length is None else length)

    def write(self, offset: int, data: bytes) -> None:
        _run(self._o.write, offset, bytes(data))

    def dereg(self) -> None:
        _run(self._o.dereg)


class Cq(_Obj):
    def __init__(self, ctx: "Context", o):
        self.ctx, self._o = ctx, o

    # ibv_cq->cqe: the size the provider gave, rounded up from what create_cq asked for.
    cqe = property(lambda self: self._o.cqe)

    def poll(self, n: int = 16) -> list[WC]:
        """ibv_poll_cq: up to n completions, oldest first; never blocks."""
        return [WC.from_core(w) for w in _run(self._o.poll, n)]

    def destroy(self, timeout_ns: int = DEFAULT_DESTROY_TIMEOUT_NS) -> None:
        """ibv_destroy_cq; waits up to timeout_ns for acks of events read (EBUSY after)."""
        o = self._o
        deadline = deadline_ns("ibv_destroy_cq", self.ctx.lab.now_ns, timeout_ns)
        _run(lambda: o.destroy(deadline))


class Srq(_Obj):
    def __init__(self, ctx: "Context", o):
        self.ctx, self._o = ctx, o

    srq_num = property(lambda self: self._o.srq_num)
    is_xrc = property(lambda self: self._o.is_xrc)
    limit = property(lambda self: self._o.limit)
    outstanding = property(lambda self: self._o.outstanding)

    def post_recv(self, wr_id: int = 0, sge=None) -> int:
        _run(self._o.post_recv, make_recv_wr(wr_id, sge))
        return wr_id

    def arm_limit(self, srq_limit: int) -> None:
        _run(self._o.arm_limit, srq_limit)

    def destroy(self, timeout_ns: int = DEFAULT_DESTROY_TIMEOUT_NS) -> None:
        """ibv_destroy_srq; waits up to timeout_ns for acks of events read (EBUSY after)."""
        o = self._o
        deadline = deadline_ns("ibv_destroy_srq", self.ctx.lab.now_ns, timeout_ns)
        _run(lambda: o.destroy(deadline))


class Xrcd(_Obj):
    def __init__(self, ctx: "Context", o, path: str):
        self.ctx, self._o, self.path = ctx, o, path

    def close(self) -> None:
        _run(self._o.close)


class QpAttrView:
    """ibv_query_qp's answer with enum fields as strings (other fields as in QpAttr)."""

    def __init__(self, attr: _core.QpAttr):
        self.raw = attr

    def __getattr__(self, key: str):
        value = getattr(self.raw, key)
        return name(value) if key in ("qp_state", "cur_qp_state") else value

    def __repr__(self) -> str:
        return f"<QpAttr {self.qp_state}>"


class Qp(_Obj):
    def __init__(self, ctx: "Context", o):
        self.ctx, self._o = ctx, o

    qp_num = property(lambda self: self._o.qp_num)
    qp_type = property(lambda self: name(self._o.qp_type))
    state = property(lambda self: name(self._o.state))
    is_open_handle = property(lambda self: self._o.is_open_handle)

    def modify(self, *, attr_mask=None, **kw) -> None:
        """ibv_modify_qp: qp.modify(qp_state="INIT", pkey_index=0, port_num=1,
        qp_access_flags="LOCAL_WRITE|REMOTE_WRITE"); the mask is made from the keywords."""
        attr, mask = make_modify(kw, attr_mask)
        _run(self._o.modify, attr, mask)

    def query(self) -> QpAttrView:
        return QpAttrView(_run(self._o.query))

    def post_send(self, wr_id: int = 0, opcode="SEND", sge=None, **kw) -> int:
        """ibv_post_send of one WR; kw: signaled, imm_data, remote_addr, rkey, remote_qpn,
        remote_qkey, ah, remote_srqn. Returns wr_id."""
        _run(self._o.post_send, make_send_wr(wr_id, opcode, sge, **kw))
        return wr_id

    def post_recv(self, wr_id: int = 0, sge=None) -> int:
        _run(self._o.post_recv, make_recv_wr(wr_id, sge))
        return wr_id

    def destroy(self, timeout_ns: int = DEFAULT_DESTROY_TIMEOUT_NS) -> None:
        """ibv_destroy_qp; waits up to timeout_ns for acks of events read (EBUSY after)."""
        o = self._o
        deadline = deadline_ns("ibv_destroy_qp", self.ctx.lab.now_ns, timeout_ns)
        _run(lambda: o.destroy(deadline))


class Context(_Obj):
    """An open device (ibv_context) of a process."""

    def __init__(self, process, o):
        self.process, self._o = process, o

    @property
    def lab(self):
        return self.process.host.lab

    @property
    def caps(self) -> DeviceCaps:
        return DeviceCaps.from_core(self._o.caps, self.lab.kernel_identity(self._o.caps))

    def query_gid(self, port_num: int = 1, index: int = 0) -> _core.Gid:
        return _run(self._o.query_gid, port_num, index)

    def query_port(self, port_num: int = 1) -> str:
        return name(_run(self._o.query_port, port_num))

    def alloc_pd(self) -> Pd:
        return Pd(self, _run(self._o.alloc_pd))

    def reg_mr(self, pd: Pd, length: int, access="LOCAL_WRITE") -> Mr:
        pd = engine_object(pd, self, "ibv_reg_mr", "pd")
        return Mr(self, _run(self._o.reg_mr, pd, length, access_flags(access)))

    def create_cq(self, cqe: int = 64) -> Cq:
        return Cq(self, _run(self._o.create_cq, cqe))

    def create_srq(self, pd: Pd, max_wr: int = 64, max_sge: int = 1, srq_limit: int = 0) -> Srq:
        pd = engine_object(pd, self, "ibv_create_srq", "pd")
        attr = srq_attr(max_wr, max_sge, srq_limit)
        return Srq(self, _run(self._o.create_srq, pd, attr))

    def create_srq_xrc(self, pd: Pd, xrcd: Xrcd, cq: Cq, max_wr: int = 64, max_sge: int = 1,
                       srq_limit: int = 0) -> Srq:
        verb = "ibv_create_srq_ex"
        pd = engine_object(pd, self, verb, "pd")
        xrcd = engine_object(xrcd, self, verb, "xrcd")
        cq = engine_object(cq, self, verb, "cq")
        attr = srq_attr(max_wr, max_sge, srq_limit)
        return Srq(self, _run(self._o.create_srq_xrc, pd, xrcd, cq, attr))

    def open_xrcd(self, path: str = "", create: bool = True, excl: bool = False) -> Xrcd:
        """ibv_open_xrcd: path names the shared inode ("" = fd -1); create/excl = O_CREAT/O_EXCL."""
        return Xrcd(self, _run(self._o.open_xrcd, path, create, excl), path)

    def create_qp(self, pd: Optional[Pd] = None, qp_type="RC", *, send_cq: Optional[Cq] = None,
                  recv_cq: Optional[Cq] = None, cq: Optional[Cq] = None, srq: Optional[Srq] = None,
                  xrcd: Optional[Xrcd] = None, max_send_wr: int = 16, max_recv_wr: int = 16,
                  max_send_sge: int = 1, max_recv_sge: int = 1, max_inline_data: int = 0,
                  sq_sig_all: bool = False) -> Qp:
        """ibv_create_qp(_ex). cq= sets both send_cq and recv_cq. XRC_RECV takes xrcd only."""
        verb = "ibv_create_qp"
        init = _core.QpInitAttr()
        init.qp_type = parse(_core.QpType, qp_type, "QP type")
        init.pd = engine_object(pd, self, verb, "pd")
        init.send_cq = engine_object(send_cq if send_cq is not None else cq, self, verb, "send_cq")
        init.recv_cq = engine_object(recv_cq if recv_cq is not None else cq, self, verb, "recv_cq")
        init.srq = engine_object(srq, self, verb, "srq")
        init.xrcd = engine_object(xrcd, self, verb, "xrcd")
        init.cap = make_qp_cap(max_send_wr=max_send_wr, max_recv_wr=max_recv_wr,
                               max_send_sge=max_send_sge, max_recv_sge=max_recv_sge,
                               max_inline_data=max_inline_data)
        init.sq_sig_all = bool(sq_sig_all)
        return Qp(self, _run(self._o.create_qp, init))

    def open_qp(self, xrcd: Xrcd, qp_num: int) -> Qp:
        """ibv_open_qp: a handle on an existing XRC TGT QP of the domain."""
        xrcd = engine_object(xrcd, self, "ibv_open_qp", "xrcd")
        return Qp(self, _run(self._o.open_qp, xrcd, qp_num))

    def get_async_event(self, timeout_ns: int = 0) -> Optional[AsyncEvent]:
        """The next unread async event, waiting up to timeout_ns; None if none came."""
        o = self._o
        deadline = deadline_ns("ibv_get_async_event", self.lab.now_ns, timeout_ns)
        ev = _run(lambda: o.get_async_event(deadline))
        return None if ev is None else AsyncEvent.from_core(ev)

    def ack_async_event(self, event: AsyncEvent) -> None:
        _run(self._o.ack_async_event, event.raw if isinstance(event, AsyncEvent) else event)

    def close(self) -> None:
        _run(self._o.close)
