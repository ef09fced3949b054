"""Which of a schedule's moments may never come (rdmalab.schedules.swarm draws the moments, the
shrinker cuts steps around them): mark_may_miss marks each such step "may_miss": true, and
leaves unmarked only those the steps before make certain on the model.
"""
from __future__ import annotations

from typing import Optional

from ..labs.engine import model_lab, personalities

# A step whose moment never comes fails the run unless it says "may_miss": true. A drawn
# moment is left unmarked only where the steps before it make it certain on the model; every
# other one is marked. Certain needs a quiet run so far: no wire rule, kill, reboot or port
# fault before the step (each can keep a connection from forming or a message from going out),
# so every connect so far has established. Then:
#   after       always comes;
#   verb        ibv_destroy_qp on a side still live, when a later destroy of that side (with
#               no moment of its own) comes before any disruptive step: that destroy enters the
#               verb on the side's QP;
#   cm_msg      REQ or REP #1 (its conn's connect sent them), DREQ #1 when its conn was ended
#               before by a disconnect, or a destroy of a side not holding acks, of a live side
#               (the first such step sends a DREQ), on a personality whose CM speaks IB CM MADs
#               (the iWARP CM's messages are TCP and MPA: the watch never matches);
#   cm_state    never certain: the state a disconnect passes through may be gone before the
#               wait begins, or belong to the other transport's CM (CLOSING is iWARP's);
#   cm_event, qpn_reused   not drawn; marked.
# Only the moment's own connection counts as a source, so a device lab's copy, which drops the
# steps on hosts it does not have with every step of their connections (run.swarm_cli._fit_hosts),
# keeps each unmarked moment's reason. The shrinker marks a drawn schedule's candidates anew.
_DISRUPTIVE = ("rule", "kill", "reboot", "port_down")
_IB_CM: dict[str, bool] = {}


def speaks_ib_cm(personality: Optional[str]) -> bool:
    """Whether the personality's CM messages are IB CM MADs (IB, RoCE) that a cm_msg moment's
    watch rule counts; False for iWARP (and for a name the model does not know)."""
    p = personality or "roce"
    if p not in _IB_CM:
        if p not in personalities():
            _IB_CM[p] = False
        else:
            with model_lab(seed=1, hosts=("a",), personality=p) as lab:
                _IB_CM[p] = lab.host("a").caps().transport in ("IB", "RoCE")
    return _IB_CM[p]


def mark_may_miss(steps: list[dict], personality: Optional[str]) -> list[dict]:
    """The steps, each with a moment that may never come marked "may_miss": true (and the
    mark taken off those that must come): see above."""
    ib_cm = speaks_ib_cm(personality)
    out: list[dict] = []
    quiet = True
    live: set[tuple] = set()       # (conn, side) established and not yet destroyed or dead
    holding: set[tuple] = set()    # (conn, side) holding its acks
    ended: set[str] = set()        # conns a disconnect or destroy has ended
    dreq: set[str] = set()         # conns whose ending step certainly sent a DREQ
    for i, st in enumerate(steps):
        st = {k: v for k, v in st.items() if k != "may_miss"}
        m = st.get("at")
        if m and m["moment"] != "after" and not (
                quiet and _certain(m, st, i, steps, live, dreq, ib_cm)):
            st["may_miss"] = True
        out.append(st)
        op, certain = st["op"], not st.get("may_miss")
        key = (st.get("conn"), st.get("side"))
        if op in _DISRUPTIVE:
            quiet = False
        elif op == "connect":
            live |= {(st["conn"], "client"), (st["conn"], "server")}
        elif op in ("disconnect", "destroy") and key in live:
            if key[0] not in ended:
                ended.add(key[0])
                if certain and (op == "disconnect" or key not in holding):
                    dreq.add(key[0])
            if op == "destroy":
                live.discard(key)
        elif op == "hold_acks":
            holding.add(key)
        elif op == "release_acks":
            holding.discard(key)
    return out


def _certain(m: dict, st: dict, i: int, steps: list[dict], live: set, dreq: set,
             ib_cm: bool) -> bool:
    kind = m["moment"]
    if kind == "cm_msg":
        if not ib_cm or m.get("src_host") or m.get("n", 1) != 1 or "conn" not in st:
            return False
        return m["msg"] in ("REQ", "REP") or (m["msg"] == "DREQ" and st["conn"] in dreq)
    if kind == "verb":
        key = (m["conn"], m["side"])
        if m["verb"] != "ibv_destroy_qp" or key not in live:
            return False
        for later in steps[i + 1:]:
            if later["op"] in _DISRUPTIVE:
                return False
            if (later["op"] == "destroy" and (later["conn"], later["side"]) == key and
                    later.get("at", {"moment": "after"})["moment"] == "after"):
                return True
        return False
    return False
