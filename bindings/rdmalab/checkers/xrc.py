"""The XRC receive (TGT) QP outlives its creator while another process keeps it (seed 003).

Rule (docs/semantics.md D, and the model's XrcTgtLifetime in core/model/qp.cc ModelQp::release
and core/model/resources.cc XrcdCore::maybe_destroy):
- "handle" (today's kernel, the `ib` personality): uverbs_free_qp destroys a handle on every
  removal reason, process exit included; the TGT QP lives while some process holds a handle on
  it (the creator's, or one from ibv_open_qp). Holding the XRCD alone does not keep it.
- "xrcd" (the 2007 proposal and the 2011 commit "RDMA/uverbs: Export XRC TGT QPs to user
  space", the `ib-legacy` personality): the TGT QP lives until the XRC domain's last reference
  (an XRCD handle) goes.
So with the creator killed, while another process still holds what the rule counts, the TGT
QP must keep working. Broken when, before the runner's `teardown_begin`:
- the model records `tgt_qp_destroyed` for it while such a reference is held, or
- a send of the domain's sender completes with RETRY_EXC_ERR (the responder never answered:
  a TGT QP that is gone; a live one NAKs with REM_* or RNR), the TGT QP never entered ERR, no
  reference count reached zero before, and no fault touched the two hosts before it (packet
  loss or a long reorder between them, a port down or a reboot also exhaust retries: then
  unknown, with the reason; kills, injected async events and faults on CM MADs do not).
A device whose rule is unknown is judged only where both rules agree (a handle and an XRCD
reference held).

Input: the runner's records (rdmalab.schedules.xrc): `schedule_bind` with `xrc` (role
creator/holder: `holds`, `qp_num` the TGT QP's, `tgt_lifetime`; role sender: the sender's
`qp_num`), `schedule_release` (`released`), `fault` kill/reboot records, `process_crash`,
`host_lost`. No XRC in the history: valid, nothing checked.
"""
from __future__ import annotations

from .. import _core
from ..names import name
from .base import UNKNOWN, Context, Result

NAME = "xrc"
_KEEPS = {"handle": ("qp",), "xrcd": ("xrcd",), "unknown": ("qp", "xrcd")}
_GONE = "RETRY_EXC_ERR"
# Faults that cannot exhaust a sender's retries: a kill (judged through the references it
# drops) and an injected async event (it acts on its own QP only).
_HARMLESS = ("kill", "async_event")


class _Domain:
    def __init__(self, host: str, name: str, tgt_qpn: int, rule: str):
        self.host, self.name, self.tgt_qpn, self.rule = host, name, tgt_qpn, rule
        self.holds: dict[str, set] = {}      # process -> {"qp", "xrcd"} it still holds
        self.seqs: dict[str, int] = {}       # process -> its bind record
        self.ended = False                   # its references reached zero: gone legitimately
        self.errored = False                 # the TGT QP entered ERR (a NAK, a fatal event)

    def keepers(self) -> list[str]:
        """The processes whose references keep the TGT QP alive under the rule."""
        need = _KEEPS[self.rule]
        if self.rule == "unknown":  # both rules must agree: a handle and an XRCD held
            if not any("xrcd" in h for h in self.holds.values()):
                return []
            need = ("qp",)
        return sorted(p for p, h in self.holds.items() if any(k in h for k in need))

    def changed(self) -> None:
        if not self.keepers():
            self.ended = True


def check(history: list, ctx: Context) -> Result:
    res = Result(NAME)
    domains: dict[tuple, _Domain] = {}      # (host, xrc) -> domain
    senders: dict[tuple, _Domain] = {}      # (sender host, qp_num) -> its domain
    faults: list = []                       # (seq, hosts it touched or None: any)
    unjudged = []
    for r in history:
        k, d, host = r["kind"], r.get("data", {}), r["host"]
        if k == "teardown_begin":
            break
        if k == "schedule_bind" and "xrc" in d:
            if d.get("role") == "sender":
                dom = domains.get((d.get("tgt_host"), d["xrc"]))
                if dom is not None:
                    senders[(host, d.get("qp_num"))] = dom
                continue
            dom = domains.get((host, d["xrc"]))
            if dom is None:
                rule = d.get("tgt_lifetime") or _personality_rule(ctx.personality)
                dom = domains[(host, d["xrc"])] = _Domain(host, d["xrc"], d.get("qp_num", 0),
                                                          rule if rule in _KEEPS else "unknown")
                res.checked += 1
            dom.holds[d["process"]] = set(d.get("holds", ("qp", "xrcd")))
            dom.seqs[d["process"]] = r["seq"]
        elif k == "schedule_release" and (host, d.get("xrc")) in domains:
            dom = domains[(host, d["xrc"])]
            dom.holds.get(d["process"], set()).difference_update(d.get("released", ()))
            dom.changed()
        elif k in ("fault", "process_crash", "host_lost"):
            what = d.get("fault") if k == "fault" else k
            if what not in _HARMLESS and d.get("opcode") != "MAD":  # a MAD: the CM's
                faults.append((r["seq"], _touched(r)))
            if what in ("kill", "process_crash"):
                _drop(domains, host, d.get("process"))
            elif what in ("reboot", "host_lost"):
                _drop(domains, d.get("host") or host, None)
        elif k == "tgt_qp_destroyed":
            for dom in domains.values():
                if (dom.host, dom.tgt_qpn) == (host, d.get("qp_num")) and not dom.ended:
                    _gone(res, dom, r, f"destroyed ({d.get('reason', '')})")
        elif k == "qp_state" and d.get("to") == "ERR":
            for dom in domains.values():
                if (dom.host, dom.tgt_qpn) == (host, d.get("qp_num")):
                    dom.errored = True
        elif k == "wc" and d.get("status") == _GONE and (host, d.get("qp_num")) in senders:
            dom = senders[(host, d["qp_num"])]
            if dom.ended or dom.errored:
                continue
            pair = {host, dom.host}
            hit = next((seq for seq, hosts in faults if hosts is None or hosts <= pair), None)
            if hit is not None:
                unjudged.append(f"{host} wr_id {d.get('wr_id')} (record {r['seq']}; a fault "
                                f"acted at record {hit})")
                continue
            _gone(res, dom, r, f"unreachable: a send from {host} got {_GONE} "
                               f"(wr_id {d.get('wr_id')})")
    if unjudged and res.verdict != "invalid":
        res.verdict = UNKNOWN
        res.reason = (f"{len(unjudged)} sends to a TGT QP still held ended {_GONE} after a "
                      f"fault that also exhausts retries: {', '.join(unjudged[:3])}")
    return res


def _personality_rule(personality) -> str:
    """A model personality's TGT QP lifetime rule (caps.xrc_tgt_lifetime); "unknown" for a
    device, whose rule the history's tgt_lifetime says or nothing does."""
    if personality not in _core.personalities():
        return "unknown"
    return name(_core.personality_caps(personality).xrc_tgt_lifetime)


def _touched(r: dict):
    """The hosts a fault record touched: a packet's two ends, a port's or reboot's host;
    None when the record does not say (then it may have touched any)."""
    d = r["data"]
    if d.get("src") and d.get("dst"):
        return frozenset((d["src"], d["dst"]))
    if d.get("fault") in ("port_down", "port_up", "reboot", "host_lost") or \
            r["kind"] == "host_lost":
        return frozenset((d.get("host") or r["host"],))
    return None


def _drop(domains: dict, host: str, process) -> None:
    """A kill (one process) or a reboot/loss (every process of the host) released its refs."""
    for dom in domains.values():
        if dom.host != host:
            continue
        for p in list(dom.holds):
            if process is None or p == process:
                del dom.holds[p]
        dom.changed()


def _gone(res: Result, dom: _Domain, r: dict, how: str) -> None:
    keepers = dom.keepers()
    res.fail(f"XRC TGT QP {dom.tgt_qpn} of {dom.name} {how} while "
             f"{', '.join(keepers)} still held {'a handle' if dom.rule == 'handle' else 'the XRCD'}"
             f" on it (rule {dom.rule}, semantics.md D)",
             (*(dom.seqs[p] for p in keepers), r["seq"]), host=dom.host, object=f"xrc:{dom.name}")
    dom.ended = True  # one problem per death
