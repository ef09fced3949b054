"""The XRC steps of a schedule (seed 003): the Runner (rdmalab.schedules.runner) takes them
from XrcOps. An XRC domain lives on one host: its creator process opens the XRCD by a path unique
to the run and creates the receive (TGT) QP; each holder process opens the same XRCD and a
handle on the TGT QP (ibv_open_qp) and owns `n_srq` XRC SRQs (the creator owns them when
there are no holders, so a killed creator takes no SRQ with it otherwise). A sender on another
host is an XRC_SEND QP brought up to the TGT QP; each send names an SRQ by its index.

A kill or reboot marks a process's part dead (the kernel released it); a step on a dead or
closed part is an `error` result, never an exception. A lab whose device has no XRC answers
`unsupported` (semantics.md D: rxe, siw, cxgb4; the model's roce, iwarp-*, mana). Teardown
releases every XRC object of every live process, so the leftovers checker sees nothing held.

History: a `schedule_bind` per part and sender (host, `xrc`, `role` creator/holder/sender,
`process`, `qp_num`: the TGT QP's, or the sender's QP; `holds`, `tgt_lifetime` the device's
rule; a sender adds `sender`, `tgt_host`, `tgt_qp_num`), and a `schedule_release` (host,
`xrc`, `process`, `released`: ["qp"] or ["qp", "xrcd"]) recorded as a holder lets go, just
before the verbs: the xrc checker reads them.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
from typing import Any, Optional

from ..api.resources import RDMA_ACCESS
from ..api.stack import Traffic, bring_up, local_endpoint
from ..errors import Error, FaultNotSupported
from .schedule import xrc_srqs

# The sender's transport timers: a send to a vanished TGT QP ends in RETRY_EXC_ERR after 4
# tries of 4.096 us * 2^14 (268 ms: longer than a reorder rule's hold, so reordering alone
# does not exhaust them); an SRQ with no receive posted ends in RNR_RETRY_EXC_ERR.
XRC_PARAMS = {"timeout": 14, "retry_cnt": 3, "rnr_retry": 3}
XRC_LEN = 64
_paths = itertools.count(1)


@dataclasses.dataclass
class XrcPart:
    """One process's part in a domain: its context, XRCD handle, QP (the creator's TGT QP or
    a holder's ibv_open_qp handle) and, if it owns SRQs, a PD, CQ and MR for them."""
    process: str
    role: str                      # creator | holder
    ctx: Any = None
    xrcd: Any = None
    qp: Any = None
    pd: Any = None
    cq: Any = None
    mr: Any = None
    srqs: list = dataclasses.field(default_factory=list)
    traffic: Any = None
    dead: bool = False             # killed or rebooted: the kernel released it
    closed: str = ""               # "", "qp" (the handle only) or "all"


@dataclasses.dataclass
class Xrc:
    name: str
    host: str
    path: str = ""
    tgt_qpn: int = 0
    parts: dict = dataclasses.field(default_factory=dict)     # process -> XrcPart
    srqs: list = dataclasses.field(default_factory=list)      # [(XrcPart, Srq, srq_num)]
    unsupported: str = ""


@dataclasses.dataclass
class XrcSend:
    name: str
    xrc: str
    host: str
    process: str
    ctx: Any = None
    pd: Any = None
    cq: Any = None
    mr: Any = None
    qp: Any = None
    traffic: Any = None
    dead: bool = False
    unsupported: str = ""


class XrcOps:
    """The xrc_* ops of the Runner; it gives lab, destroy_ns, _process, _wr, _hang, qpns."""

    def _xrc_init(self) -> None:
        self.xrcs: dict[str, Xrc] = {}
        self.xrc_senders: dict[str, XrcSend] = {}

    # -- the ops
    def _op_xrc_open(self, st: dict) -> str:
        host, name = st["host"], st["xrc"]
        x = self.xrcs[name] = Xrc(name, host)
        caps = self._xrc_caps(host, x)
        x.path = f"/tmp/rdmalab-schedule-{os.getpid()}-{next(_paths)}-{name}"
        creator = x.parts[st["creator"]] = XrcPart(st["creator"], "creator")
        creator.ctx = self._process(host, creator.process).open_device()
        creator.xrcd = creator.ctx.open_xrcd(x.path, create=True)
        creator.qp = creator.ctx.create_qp(None, "XRC_RECV", xrcd=creator.xrcd)
        x.tgt_qpn = creator.qp.qp_num
        self._xrc_bind(host, name, creator, caps)
        for h in st.get("holders", []):
            part = x.parts[h] = XrcPart(h, "holder")
            part.ctx = self._process(host, h).open_device()
            part.xrcd = part.ctx.open_xrcd(x.path, create=False)
            part.qp = part.ctx.open_qp(part.xrcd, x.tgt_qpn)
            self._xrc_bind(host, name, part, caps)
        for part in [p for p in x.parts.values() if p.role == "holder"] or [creator]:
            part.pd, part.cq = part.ctx.alloc_pd(), part.ctx.create_cq(256)
            part.mr = part.ctx.reg_mr(part.pd, 4096, RDMA_ACCESS)
            part.traffic = Traffic(self.lab, host)
            for _ in range(st.get("n_srq", 1)):
                srq = part.ctx.create_srq_xrc(part.pd, part.xrcd, part.cq, max_wr=128)
                part.srqs.append(srq)
                x.srqs.append((part, srq, srq.srq_num))
        assert len(x.srqs) == xrc_srqs(st)
        return f"tgt qpn {x.tgt_qpn}, {len(x.srqs)} srqs"

    def _op_xrc_connect(self, st: dict) -> str:
        x = self._xrc(st["xrc"])
        host, name = st["host"], st["sender"]
        s = self.xrc_senders[name] = XrcSend(name, x.name, host, st.get("process", "p0"))
        self._xrc_caps(host, s)
        tgt = next((p.qp for p in x.parts.values() if self._part_live(p) and p.closed == ""),
                   None)
        if tgt is None:
            raise Error(f"xrc_connect {name}: no live handle on xrc {x.name}'s TGT QP")
        s.ctx = self._process(host, s.process).open_device()
        s.pd, s.cq = s.ctx.alloc_pd(), s.ctx.create_cq(256)
        s.mr = s.ctx.reg_mr(s.pd, 4096, RDMA_ACCESS)
        s.qp = s.ctx.create_qp(s.pd, "XRC_SEND", cq=s.cq, max_send_wr=64, max_recv_wr=0)
        s.traffic = Traffic(self.lab, host)
        self._xrc_seen(host, s.qp.qp_num)
        self.lab.record("schedule_bind", object="schedule", host=host, xrc=x.name,
                        sender=name, role="sender", process=s.process, qp_num=s.qp.qp_num,
                        qp=s.qp.label,
                        tgt_host=x.host, tgt_qp_num=x.tgt_qpn)
        ep_s, ep_t = local_endpoint(s.qp, 0x400), local_endpoint(tgt, 0x300)
        bring_up(s.qp, ep_s, ep_t, XRC_PARAMS)
        bring_up(tgt, ep_t, ep_s, XRC_PARAMS)
        return ""

    def _op_xrc_recv(self, st: dict) -> str:
        x = self._xrc(st["xrc"])
        part, srq, _ = self._xrc_srq(x, st["srq"])
        if not self._part_live(part) or part.closed == "all":
            raise Error(f"xrc {x.name} srq {st['srq']}: its process {part.process} is "
                        f"{'dead' if part.dead else 'closed'}")
        for _ in self._each_wr(st):
            part.traffic.post_srq_recv(srq, self._wr(st), part.mr.sge(0, XRC_LEN))
        return ""

    def _op_xrc_send(self, st: dict) -> str:
        s = self.xrc_senders.get(st["sender"])
        if s is None or s.qp is None:
            if s is not None and s.unsupported:
                raise FaultNotSupported("xrc", s.unsupported)
            self._xrc(self._xrc_of_sender(st["sender"]))  # unsupported if its domain was
            raise Error(f"sender {st['sender']}: not connected")
        if s.dead:
            raise Error(f"sender {s.name}: its process {s.process} is dead")
        srqn = self._xrc_srq(self.xrcs[s.xrc], st["srq"])[2]  # a dead SRQ's number: a case too
        for _ in self._each_wr(st):
            s.traffic.post_send(s.qp, self._wr(st), "SEND", s.mr.sge(0, XRC_LEN),
                                remote_srqn=srqn)
        return ""

    def _op_xrc_close(self, st: dict) -> str:
        x = self._xrc(st["xrc"])
        part = x.parts.get(st["process"])
        if part is None or not self._part_live(part):
            raise Error(f"xrc {x.name}: {st['process']} holds nothing (dead or never opened)")
        what = st.get("what", "all")
        if part.closed == "all" or part.closed == what:
            raise Error(f"xrc {x.name}: {part.process} closed its {part.closed} already")
        # The application lets go first: the TGT QP may end inside the verb below.
        self.lab.record("schedule_release", object="schedule", host=x.host, xrc=x.name,
                        process=part.process,
                        released=["qp"] if what == "qp" else ["qp", "xrcd"])
        part.closed = what
        if part.qp is not None and not part.qp.destroyed:
            part.qp.destroy(self.destroy_ns)
        if what == "all":
            self._release_part(part)
        return ""

    # -- state
    def _xrc_of_sender(self, sender: str) -> str:
        st = next(st for st in self.s.steps if st["op"] == "xrc_connect" and
                  st["sender"] == sender)
        return st["xrc"]

    def _xrc(self, name: str) -> Xrc:
        x = self.xrcs.get(name)
        if x is None:
            raise Error(f"xrc {name}: not opened")
        if x.unsupported:
            raise FaultNotSupported("xrc", x.unsupported)
        return x

    @staticmethod
    def _xrc_srq(x: Xrc, i: int) -> tuple:
        if i >= len(x.srqs):
            raise Error(f"xrc {x.name} srq {i}: not made (its xrc_open did not finish)")
        return x.srqs[i]

    def _xrc_caps(self, host: str, owner):
        """The host's device caps; FaultNotSupported (remembered by owner) without XRC."""
        caps = self.lab.host(host).caps()
        if not caps.xrc:
            why = f"{host}: {caps.personality or 'its device'} has no XRC (semantics.md D)"
            owner.unsupported = why
            raise FaultNotSupported("xrc", why)
        return caps

    def _xrc_bind(self, host: str, name: str, part: XrcPart, caps) -> None:
        self._xrc_seen(host, part.qp.qp_num if part.role == "creator" else 0)
        self.lab.record("schedule_bind", object="schedule", host=host, xrc=name,
                        role=part.role, process=part.process, qp_num=part.qp.qp_num,
                        qp=part.qp.label,
                        holds=["qp", "xrcd"], tgt_lifetime=caps.xrc_tgt_lifetime)

    def _xrc_seen(self, host: str, qpn: int) -> None:
        if qpn:  # a later connect handed this QPN is a reuse (moment qpn_reused)
            self.qpns.setdefault(host, set()).add(qpn)

    @staticmethod
    def _part_live(p: XrcPart) -> bool:
        return not p.dead and p.closed != "all"

    def _xrc_dead(self, host: str, process: Optional[str] = None) -> None:
        """A kill (process) or reboot (every process of the host): the kernel released it."""
        for x in self.xrcs.values():
            for p in x.parts.values():
                if x.host == host and process in (None, p.process):
                    p.dead = True
        for s in self.xrc_senders.values():
            if s.host == host and process in (None, s.process):
                s.dead = True

    def _xrc_poll_all(self) -> None:
        for x in self.xrcs.values():
            for p in x.parts.values():
                if p.cq is not None and not p.dead and not p.cq.destroyed:
                    self._xrc_poll(p.traffic, p.cq)
        for s in self.xrc_senders.values():
            if s.cq is not None and not s.dead and not s.cq.destroyed:
                self._xrc_poll(s.traffic, s.cq)

    @staticmethod
    def _xrc_poll(traffic, cq) -> None:
        try:
            while traffic.poll(cq, 32):
                pass
        except Error:
            pass

    # -- the end
    def _release_part(self, p) -> None:
        """Every object of a part or sender, each once, children first."""
        for qp in [getattr(p, "qp", None)]:
            if qp is not None and not qp.destroyed:
                qp.destroy(self.destroy_ns)
        for srq in getattr(p, "srqs", []):
            if not srq.destroyed:
                srq.destroy(self.destroy_ns)
        if p.mr is not None and not p.mr.destroyed:
            p.mr.dereg()
        if p.cq is not None and not p.cq.destroyed:
            p.cq.destroy(self.destroy_ns)
        if p.pd is not None and not p.pd.destroyed:
            p.pd.dealloc()
        xrcd = getattr(p, "xrcd", None)
        if xrcd is not None and not xrcd.destroyed:
            xrcd.close()
        if p.ctx is not None and not p.ctx.destroyed:
            p.ctx.close()

    def _xrc_teardown(self) -> None:
        """Senders first, then each domain's holders, then its creator (the XRCD last)."""
        parts = list(self.xrc_senders.values())
        for x in self.xrcs.values():
            parts += sorted(x.parts.values(), key=lambda p: p.role == "creator")
        for p in parts:
            if not p.dead and not self._cleanup(self._release_part, p):
                return
