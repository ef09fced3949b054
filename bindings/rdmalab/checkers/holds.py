"""Every packet a wire rule held back (reorder; in the fault switch also delay) was let go
exactly once: no frame lost or sent twice by the fault itself.

The model names the packet (fault "reorder" data.packet, data.hold_ns / reorder_release
data.packet); the switch its record (switch_reorder, switch_delay data.seq / switch_release
data.of_seq). A model hold still unreleased when the history ends before its deadline (the
fault's t_ns + hold_ns, plus up to HOLD_SLACK_NS for the link latency the record does not
carry) may yet be released: not judged. checked: holds judged.
"""
from __future__ import annotations

from .base import Context, Result

NAME = "holds"
HOLD_SLACK_NS = 1_000_000


def check(history: list, ctx: Context) -> Result:
    res = Result(NAME)
    held, released = {}, {}
    for r in history:
        k = r["kind"]
        if k == "fault":
            d = r["data"]
            if d.get("fault") == "reorder" and "packet" in d:
                held[("model", d["packet"])] = r
        elif k == "reorder_release":
            released.setdefault(("model", r["data"].get("packet")), []).append(r)
        elif k in ("switch_reorder", "switch_delay"):
            held[("switch", r["data"].get("seq"))] = r
        elif k == "switch_release":
            released.setdefault(("switch", r["data"].get("of_seq")), []).append(r)
    end_ns = max((r["t_ns"] for r in history), default=0)
    for key, h in held.items():
        n = len(released.get(key, []))
        hold_ns = h["data"].get("hold_ns")
        if n == 0 and hold_ns is not None and end_ns < h["t_ns"] + hold_ns + HOLD_SLACK_NS:
            continue  # the history ended while it was still held
        res.checked += 1
        if n != 1:
            res.fail(f"{key[0]} hold {key[1]} ({h['kind']}, t_ns {h['t_ns']}): released {n} "
                     "times", tuple(x["seq"] for x in [h, *released.get(key, [])]),
                     host=h["host"], object=h["object"])
    for key, rs in released.items():
        if key not in held:
            res.fail(f"{key[0]} release of {key[1]} with no hold", (rs[0]["seq"],),
                     host=rs[0]["host"], object=rs[0]["object"])
    return res
