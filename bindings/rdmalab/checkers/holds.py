"""Every packet a wire rule held back (a reorder; in the fault switch also a delay) was let go
exactly once: no frame lost or sent twice by the fault itself.

The records are rdmalab.faults.records': a `fault` record of a held packet names it
(data.packet) and its `reorder_release` names it again. A hold still unreleased when the
history ends before its deadline (the fault's t_ns + hold_ns, plus up to HOLD_SLACK_NS for the
link latency the record does not carry) may yet be released: not judged. checked: holds judged.
"""
from __future__ import annotations

from ..faults.records import holds, wire_action
from .base import Context, Result

NAME = "holds"
HOLD_SLACK_NS = 1_000_000


def check(history: list, ctx: Context) -> Result:
    res = Result(NAME)
    held, released = {}, {}
    for r in history:
        if wire_action(r) and holds(r["data"]):
            held[(r["host"], r["data"]["packet"])] = r
        elif r["kind"] == "reorder_release":
            released.setdefault((r["host"], r["data"].get("packet")), []).append(r)
    end_ns = max((r["t_ns"] for r in history), default=0)
    for key, h in held.items():
        n = len(released.get(key, []))
        hold_ns = h["data"].get("hold_ns")
        if n == 0 and hold_ns is not None and end_ns < h["t_ns"] + hold_ns + HOLD_SLACK_NS:
            continue  # the history ended while it was still held
        res.checked += 1
        if n != 1:
            res.fail(f"packet {key[1]} held by a {h['data']['fault']} at t_ns {h['t_ns']}: "
                     f"released {n} times", tuple(x["seq"] for x in [h, *released.get(key, [])]),
                     host=h["host"], object=h["object"])
    for key, rs in released.items():
        if key not in held:
            res.fail(f"release of packet {key[1]} with no hold", (rs[0]["seq"],),
                     host=rs[0]["host"], object=rs[0]["object"])
    return res
