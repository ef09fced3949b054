"""Resource sets in the manner of pyverbs' RCResources/XRCResources: one class builds what a
side needs and brings its QP up, so a scenario reads as a few lines.

    pair = RCPair(lab)                      # hosts "a" and "b", connected RC QPs
    pair.b.post_recv(length=64)
    pair.a.post_send(length=64)
    assert pair.b.wait_completions(1)

Every post and poll goes through a stack.Traffic, so `player.traffic.check()` proves each WR
ended exactly once.
"""

from __future__ import annotations

from typing import Optional

from .. import _core
from . import cm as _cm
from .cm_values import FAILURE_TYPES, CmEvent, check_port, endpoint_spec
from ..agent import remote as _remote
from ..errors import DeadlineExceeded, FaultNotSupported, raise_parked
from . import stack
from . import verbs as _verbs
from ..names import access_flags, parse, sec
from ..protocol import VIRTUAL_TIME
from .verbs import WC

RDMA_ACCESS = "LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ"


def _wait_types(event: str) -> list:
    """CmId.wait's event types for `event` with the default fail_on (FAILURE_EVENTS)."""
    want = parse(_core.CmEventType, event, "CM event")
    return [want] + [t for t in FAILURE_TYPES if t != want]


_ESTABLISHED = _wait_types("ESTABLISHED")
_DISCONNECTED = _wait_types("DISCONNECTED")
_ACCESS_BITS: dict[str, int] = {}  # access names -> bits, parsed once per spelling


def _reg_mr(ctx, pd, length: int, access):
    """ctx.reg_mr(pd, length, access), with the access names parsed once (a local context)."""
    if type(ctx) is not _verbs.Context or not isinstance(access, str):
        return ctx.reg_mr(pd, length, access)
    bits = _ACCESS_BITS.get(access)
    if bits is None:
        bits = _ACCESS_BITS[access] = access_flags(access)
    return _verbs.Mr(ctx, _verbs._run(ctx._o.reg_mr, _verbs.unwrap(pd), length, bits))


class Player:
    """One side: a process on a host with its context, PD, CQ, MR, optional SRQ and a QP.
    On a host in an agent (the VM lab) the Player is built there, beside its verbs objects."""

    def __new__(cls, lab, host, **kw):
        return _remote.new(cls, lab, host, host, **kw)

    def __init__(self, lab, host, *, process: str = "player", device: str = "", qp_type="RC",
                 mr_size: int = 4096, cqe: int = 64, access=RDMA_ACCESS, srq: bool = False,
                 max_send_wr: int = 16, max_recv_wr: int = 16, psn: int = 0):
        self.lab = lab
        self.host = lab.host(host) if isinstance(host, str) else host
        self.proc = self.host.process(process)
        self.ctx = self.proc.open_device(device)
        self.pd = self.ctx.alloc_pd()
        self.cq = self.ctx.create_cq(cqe)
        self.mr = self.ctx.reg_mr(self.pd, mr_size, access)
        self.srq = self.ctx.create_srq(self.pd, max_wr=max_recv_wr) if srq else None
        self.qp = self.ctx.create_qp(self.pd, qp_type, cq=self.cq, srq=self.srq,
                                     max_send_wr=max_send_wr, max_recv_wr=max_recv_wr)
        self.psn = psn
        self.traffic = stack.Traffic(lab, self.host.name)

    @property
    def endpoint(self) -> stack.Endpoint:
        return stack.local_endpoint(self.qp, self.psn)

    # count= posts that many WRs (Traffic's count=) where the Player lives: one round trip
    # to its agent instead of one per WR. Returns the last WR's wr_id.
    def post_send(self, length: int = 64, offset: int = 0, opcode="SEND", wr_id: int = 0,
                  peer: Optional["Player"] = None, count: int = 1, **kw) -> int:
        """Posts from this side's MR; peer= targets the peer's MR for RDMA opcodes."""
        if peer is not None:
            kw.setdefault("remote_addr", peer.mr.addr)
            kw.setdefault("rkey", peer.mr.rkey)
        sge = self.mr.sge(offset, length) if length else None
        return self.traffic.post_send(self.qp, wr_id, opcode, sge, count=count, **kw)

    def post_recv(self, length: int = 64, offset: int = 0, wr_id: int = 0,
                  count: int = 1) -> int:
        sge = self.mr.sge(offset, length) if length else None
        if self.srq is not None:
            return self.traffic.post_srq_recv(self.srq, wr_id, sge, count)
        return self.traffic.post_recv(self.qp, wr_id, sge, count)

    def poll(self, n: int = 32) -> list[WC]:
        return self.traffic.poll(self.cq, n)

    def wait_completions(self, n: int, timeout_ns: int = sec(1)) -> bool:
        return self.traffic.wait_completions(self.cq, n, timeout_ns)

    def drain(self, timeout_ns: int = sec(1), dispatcher=None) -> stack.DrainReport:
        return stack.drain(self.lab, self.qp, self.traffic, self.cq, self.cq, timeout_ns,
                           dispatcher, self.srq)

    def __repr__(self) -> str:
        return f"<Player {self.host.name}/{self.proc.name} {self.qp!r}>"


class RCPair:
    """Two RC players on two hosts with their QPs in RTS towards each other."""

    def __init__(self, lab, a="a", b="b", *, connect: bool = True, params=None, **player_kw):
        psn_a = player_kw.pop("psn_a", 0x100)
        psn_b = player_kw.pop("psn_b", 0x200)
        self.lab = lab
        self.cm = None
        if _needs_rdma_cm(lab, a):
            self._connect_with_cm(lab, a, b, connect, params, player_kw)
            return
        self.a = Player(lab, a, process=player_kw.pop("process_a", "player-a"), psn=psn_a,
                        **player_kw)
        self.b = Player(lab, b, process=player_kw.pop("process_b", "player-b"), psn=psn_b,
                        **player_kw)
        self.params = params
        if connect:
            self.connect()

    @property
    def players(self) -> tuple[Player, Player]:
        return self.a, self.b

    def _connect_with_cm(self, lab, a, b, connect, params, kw) -> None:
        """A real iWARP device binds a QP to its peer only through the connection (iw_cm):
        the pair is a CmPair (a connects to b) whose sides act as the players."""
        if not connect or params is not None or kw.pop("srq", False):
            raise FaultNotSupported("RCPair", "on a real iWARP device RCPair connects through "
                                    "rdma_cm: no connect=False, params= or srq= there yet")
        cm_kw = {k: kw.pop(k) for k in ("cqe", "max_send_wr", "max_recv_wr", "port") if k in kw}
        mr_size = kw.pop("mr_size", 4096)
        kw.pop("process_a", None), kw.pop("process_b", None)
        if kw:
            raise TypeError(f"RCPair over rdma_cm: unsupported argument(s) {sorted(kw)}")
        self.cm = CmPair(lab, server=b, client=a, mr_size=mr_size, **cm_kw)
        self.a, self.b = self.cm.client, self.cm.server
        self.params = None

    def connect(self) -> None:
        ep_a = stack.endpoint_values(self.a.endpoint)  # read once: each is a round trip
        ep_b = stack.endpoint_values(self.b.endpoint)  # to its agent, when it lives in one
        stack.bring_up(self.a.qp, ep_a, ep_b, self.params)
        stack.bring_up(self.b.qp, ep_b, ep_a, self.params)


class CmSide(Player):
    """One side of a CM connection as a Player (post_send, post_recv, wait_completions,
    drain): .conn is the CmId, whose QP, PD and CQ the player uses, with an MR of its own."""

    def __new__(cls, lab, conn, **kw):
        return _remote.new(cls, lab, conn, conn, **kw)

    def __init__(self, lab, conn, *, mr_size: int = 4096, access=RDMA_ACCESS):
        # Player's attributes, taken from the connection instead of made here.
        self.lab, self.conn = lab, conn
        self.proc = conn.channel.process
        self.host = self.proc.host
        self.ctx, self.pd, self.cq, self.qp = conn.ctx, conn.pd, conn.cq, conn.qp
        self.mr = _reg_mr(self.ctx, self.pd, mr_size, access)
        self.srq = None
        self.psn = 0
        self._traffic = None

    @property
    def traffic(self) -> stack.Traffic:
        """Made at first use: most CM scenarios never post (a ledger costs engine objects)."""
        if self._traffic is None:
            self._traffic = stack.Traffic(self.lab, self.host.name)
        return self._traffic

    @traffic.setter
    def traffic(self, value: stack.Traffic) -> None:
        self._traffic = value

    def close(self, timeout_ns: int = sec(1)) -> None:
        """Deregisters this side's MR, then destroys the id with its QP, CQ and PD
        (rdma_destroy_id through the pump: queued events dropped, a running handler awaited)."""
        if not self.mr.destroyed:
            self.mr.dereg()
        self.conn.destroy(timeout_ns)

    def __repr__(self) -> str:
        return f"<CmSide {self.host.name}/{self.proc.name} {self.conn.label} {self.qp!r}>"


class CmPair:
    """A connection made through rdma_cm: the server listens on `port`, the client connects,
    the server accepts, and both sides wait for ESTABLISHED. .client and .server are CmSides
    (.conn is the CmId); .listener, .client_channel and .server_channel stay usable.

        pair = CmPair(lab)                          # server "b", client "a"
        pair.client.conn.disconnect()
        pair.server.conn.wait("DISCONNECTED", ms(10))
    """

    def __init__(self, lab, server="b", client="a", *, port: int = 7471,
                 timeout_ns: int = sec(1), timing=None, private_data: bytes = b"",
                 accept_data: bytes = b"", process_server: str = "cm-server",
                 process_client: str = "cm-client", mr_size: int = 4096, **kw):
        self.lab = lab
        timeout_ns += lab.tolerance_ns  # a device's timers: see AgentLab.tolerance_ns
        self.server_channel = _process(lab, server, process_server).event_channel()
        self.client_channel = _process(lab, client, process_client).event_channel()
        if self._up_at_once(server, port, timeout_ns, timing, private_data, accept_data, kw):
            self.client = CmSide(lab, self._conn, mr_size=mr_size)
            self.server = CmSide(lab, self._req, mr_size=mr_size)
            del self._conn, self._req
            return
        self.listener = self.server_channel.listen(port)
        conn = self.client_channel.connect(_name(server), port, timeout_ns=timeout_ns,
                                           timing=timing, private_data=private_data, **kw)
        req = self.listener.wait_request(timeout_ns)
        req.accept(accept_data, timing=timing, **kw)
        conn.wait("ESTABLISHED", timeout_ns)
        req.wait("ESTABLISHED", timeout_ns)
        self.client = CmSide(lab, conn, mr_size=mr_size)
        self.server = CmSide(lab, req, mr_size=mr_size)

    @property
    def players(self) -> tuple[CmSide, CmSide]:
        return self.client, self.server

    def disconnect(self, timeout_ns: int = sec(1)) -> None:
        """The client disconnects, the server answers the close; both see DISCONNECTED."""
        if self._down_at_once(timeout_ns):
            return
        self.client.conn.disconnect()
        self.server.conn.wait("DISCONNECTED", timeout_ns)
        self.server.conn.disconnect()
        self.client.conn.wait("DISCONNECTED", timeout_ns)

    # -- the model's fast path: one engine call for the steps above (bindings/src/cm.cc); the
    # same calls, order and deadlines, so the same history; a step that fails raises here
    # what it raises in the step-by-step path.
    def _up_at_once(self, server, port, timeout_ns, timing, private_data, accept_data,
                    kw) -> bool:
        lab, sch, cch = self.lab, self.server_channel, self.client_channel
        if not (lab.has(VIRTUAL_TIME) and type(sch) is _cm.CmChannel
                and type(cch) is _cm.CmChannel):
            return False
        try:  # bad arguments: the step-by-step path raises them at the step it always did
            check_port("rdma_listen", port)
            dst = lab.address_of(_name(server))
            connect_spec = accept_spec = None  # None: the engine makes endpoint_spec's defaults
            if timing is not None or private_data or accept_data or kw:
                connect_spec = endpoint_spec(dst, port, timing=timing,
                                             private_data=private_data, **kw)
                accept_spec = endpoint_spec(timing=timing, private_data=accept_data, **kw)
        except Exception:  # noqa: BLE001 (re-raised by the other path)
            return False
        st = _core.CmPairUp()
        try:
            _core.cm_pair_up(st, lab._o, sch._pump, cch._pump, port, dst, connect_spec,
                             accept_spec, timeout_ns, _ESTABLISHED)
        except DeadlineExceeded as e:
            self._adopt_up(st)
            if st.client is None:  # CmChannel.connect's Hung
                raise cch._hung(e.detail, timeout_ns, e.verb) from e
            raise
        except BaseException:
            self._adopt_up(st)
            raise
        self._adopt_up(st)
        raise_parked()
        if st.ok:
            return True
        if st.request is None:
            raise self.listener._hung("waiting for CONNECT_REQUEST", timeout_ns)
        for waited, rec, side in ((st.client_waited, st.client_established, self._conn),
                                  (st.server_waited, st.server_established, self._req)):
            _check_wait(waited, rec, side, "ESTABLISHED", timeout_ns)
        return True

    def _adopt_up(self, st) -> None:
        """Wraps what cm_pair_up made, as listen, connect, wait_request and accept do."""
        if st.listener is not None:
            self.listener = self.server_channel._wrap(st.listener, "listener")
        parts = st.client_parts
        if parts is not None:
            self._conn = self.client_channel._wrap(parts[0], "active side")
            _adopt_parts(self._conn, parts)
        if st.request is not None:
            ch, ev, parts = self.server_channel, st.request, st.server_parts
            self._req = ch._wrap(parts[0] if parts else ch._o.cm_id(ev.id), "passive side")
            self._req.request = CmEvent.from_core(ev, st.request_ns)
            if parts is not None and self._req.qp is None:
                _adopt_parts(self._req, parts)

    def _down_at_once(self, timeout_ns: int) -> bool:
        c, s = self.client.conn, self.server.conn
        if not (self.lab.has(VIRTUAL_TIME) and type(c) is _cm.CmId and type(s) is _cm.CmId):
            return False
        st = _core.CmPairDown()
        _core.cm_pair_disconnect(st, self.lab._o, c.channel._pump, c._o, s.channel._pump, s._o,
                                 timeout_ns, _DISCONNECTED)
        raise_parked()
        if st.ok:
            return True
        for waited, rec, side in ((st.server_waited, st.server_disconnected, s),
                                  (st.client_waited, st.client_disconnected, c)):
            _check_wait(waited, rec, side, "DISCONNECTED", timeout_ns)
        return True

    def close(self, timeout_ns: int = sec(1)) -> None:
        """Deregisters the MRs and closes both channels (every id, QP, CQ and PD)."""
        for side in self.players:
            if not side.mr.destroyed:
                side.mr.dereg()
        _close_channel(self.client_channel, timeout_ns)
        _close_channel(self.server_channel, timeout_ns)


def _adopt_parts(cm_id, parts) -> None:
    """CmId._adopt from cm_pair_up's (id, context, pd, cq, qp)."""
    ctx = cm_id.ctx = _verbs.Context(cm_id.channel.process, parts[1])
    cm_id.pd, cm_id.cq, cm_id.qp = _verbs.Pd(ctx, parts[2]), _verbs.Cq(ctx, parts[3]), \
        _verbs.Qp(ctx, parts[4])


def _close_channel(ch, timeout_ns: int) -> None:
    """ch.close(timeout_ns); on a model lab in one engine call when it can (see
    cm_channel_close in bindings/src/cm.cc): the same ids, order and deadlines."""
    if ch._closed:
        return
    if type(ch) is not _cm.CmChannel or not ch.lab.has(VIRTUAL_TIME):
        ch.close(timeout_ns)
        return
    ids = list(ch._ids.values())
    if any(type(i) is not _cm.CmId for i in ids):
        ch.close(timeout_ns)
        return
    unwrap = _verbs.unwrap
    conns = [(i._o, unwrap(i.pd), unwrap(i.cq), unwrap(i.qp)) for i in ids]
    listeners = [i.id for i in ids if i.role == "listener"]
    st = _core.CmChannelClose()
    try:
        done = _core.cm_channel_close(st, ch.lab._o, ch._pump, conns, listeners, timeout_ns)
    finally:
        if st.stopped:
            ch._closed = True
    if not done:  # a request nobody took: CmChannel.close wraps its id first
        ch.close(timeout_ns)
        return
    _forget_closer(ch)
    raise_parked()


def _forget_closer(ch) -> None:
    """Drops a closed channel's shutdown hook (it only stops a running pump) from the lab's
    list, so that a loop of pairs does not keep every channel, id and wrapper alive until lab
    shutdown (3,000 cycles: 5,050-5,280/s kept, 5,340/s dropped). Only the newest hooks are
    looked at: a channel closed soon after it was made is among them."""
    closers, fn = ch.lab._closers, ch._at_lab_shutdown
    for k in range(len(closers) - 1, max(-1, len(closers) - 9), -1):
        if closers[k] == fn:
            del closers[k]
            return


def _check_wait(waited: bool, rec, cm_id, want: str, timeout_ns: int) -> None:
    """What CmId.wait raises for the record a fused wait got (None: its timeout)."""
    if not waited:
        return
    if rec is None:
        raise cm_id._hung(f"waiting for {want}", timeout_ns)
    got = CmEvent.from_core(rec.event, rec.read_ns)
    if got.event != want:
        raise cm_id._failed(got, want)


def _needs_rdma_cm(lab, host) -> bool:
    """A QP of host reaches RTS only through the CM (caps.rts_needs_cm: a real iWARP device;
    the model's iWARP personalities take the peer in modify's attributes)."""
    return lab.host(_name(host)).caps().rts_needs_cm


def _process(lab, host, process):
    """process: a name (a new process on host) or a process made already (e.g. by
    lab.killable_process)."""
    if isinstance(process, str):
        return lab.host(_name(host)).process(process)
    return process


def _name(host) -> str:
    return host if isinstance(host, str) else host.name


class XrcReceiver:
    """The receiving host of XRC (seed 003): an XRC domain shared through `path`, XRC SRQs
    and the TGT QP (XRC_RECV). Other processes join with open_in()."""

    def __new__(cls, lab, host, **kw):
        return _remote.new(cls, lab, host, host, **kw)

    def __init__(self, lab, host, *, path: str = "/tmp/rdmalab-xrcd", process: str = "xrc-tgt",
                 n_srq: int = 2, max_wr: int = 32, mr_size: int = 4096, cqe: int = 64,
                 psn: int = 0x300):
        self.lab = lab
        self.host = lab.host(host) if isinstance(host, str) else host
        self.path, self.psn = path, psn
        self.proc = self.host.process(process)
        self.ctx = self.proc.open_device()
        self.pd = self.ctx.alloc_pd()
        self.cq = self.ctx.create_cq(cqe)
        self.mr = self.ctx.reg_mr(self.pd, mr_size, RDMA_ACCESS)
        self.xrcd = self.ctx.open_xrcd(path, create=True)
        self.srqs = [self.ctx.create_srq_xrc(self.pd, self.xrcd, self.cq, max_wr=max_wr)
                     for _ in range(n_srq)]
        self.qp = self.ctx.create_qp(None, "XRC_RECV", xrcd=self.xrcd)
        self.traffic = stack.Traffic(lab, self.host.name)

    @property
    def endpoint(self) -> stack.Endpoint:
        return stack.local_endpoint(self.qp, self.psn)

    def post_recv(self, srq_index: int = 0, length: int = 64, wr_id: int = 0,
                  count: int = 1) -> int:
        """Posts to SRQ srq_index; count= as Player.post_recv's."""
        sge = self.mr.sge(0, length) if length else None
        return self.traffic.post_srq_recv(self.srqs[srq_index], wr_id, sge, count)

    def open_in(self, process: str):
        """Another process on the host opens the domain and a handle on the TGT QP."""
        proc = self.host.process(process)
        ctx = proc.open_device()
        xrcd = ctx.open_xrcd(self.path, create=False)
        return proc, ctx, xrcd, ctx.open_qp(xrcd, self.qp.qp_num)


class XrcSender:
    """The sending side: an XRC_SEND (INI) QP; each post names the target SRQ."""

    def __new__(cls, lab, host, **kw):
        return _remote.new(cls, lab, host, host, **kw)

    def __init__(self, lab, host, *, process: str = "xrc-ini", mr_size: int = 4096,
                 cqe: int = 64, max_send_wr: int = 16, psn: int = 0x400):
        self.lab = lab
        self.host = lab.host(host) if isinstance(host, str) else host
        self.psn = psn
        self.proc = self.host.process(process)
        self.ctx = self.proc.open_device()
        self.pd = self.ctx.alloc_pd()
        self.cq = self.ctx.create_cq(cqe)
        self.mr = self.ctx.reg_mr(self.pd, mr_size, RDMA_ACCESS)
        self.qp = self.ctx.create_qp(self.pd, "XRC_SEND", cq=self.cq, max_send_wr=max_send_wr,
                                     max_recv_wr=0)
        self.traffic = stack.Traffic(lab, self.host.name)

    @property
    def endpoint(self) -> stack.Endpoint:
        return stack.local_endpoint(self.qp, self.psn)

    def post_send(self, srq, length: int = 64, wr_id: int = 0, count: int = 1, **kw) -> int:
        """Sends to an XRC SRQ (an Srq or its srq_num) on the receiving host; count= as
        Player.post_send's."""
        srqn = srq if isinstance(srq, int) else srq.srq_num
        sge = self.mr.sge(0, length) if length else None
        return self.traffic.post_send(self.qp, wr_id, "SEND", sge, remote_srqn=srqn,
                                      count=count, **kw)

    def wait_completions(self, n: int, timeout_ns: int = sec(1)) -> bool:
        return self.traffic.wait_completions(self.cq, n, timeout_ns)


class XrcPair:
    """An XrcSender on host a connected to an XrcReceiver's TGT QP on host b."""

    def __init__(self, lab, a="a", b="b", *, path: str = "/tmp/rdmalab-xrcd", n_srq: int = 2,
                 params=None):
        self.lab = lab
        self.receiver = XrcReceiver(lab, b, path=path, n_srq=n_srq)
        self.sender = XrcSender(lab, a)
        ep_s = stack.endpoint_values(self.sender.endpoint)
        ep_r = stack.endpoint_values(self.receiver.endpoint)
        stack.bring_up(self.sender.qp, ep_s, ep_r, params)
        stack.bring_up(self.receiver.qp, ep_r, ep_s, params)
