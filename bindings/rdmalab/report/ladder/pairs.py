"""Where the ladder's arrows end: a CM message's cm_send paired with the cm_recv that received
it, and a `wire` frame paired with the switch_drop that dropped it (the arrow then ends at the
switch). rdmalab.report.ladder.diagram draws them."""

from __future__ import annotations

import bisect

DROP_MATCH_NS = 2_000_000_000  # a switch_drop names a wire record at most this far away
_FRAME_KEY = ("src", "dst", "len", "psn", "cm", "opcode", "rdmap_opcode", "seq")


def _recv_key(rec: dict, sender: str, receiver: str) -> tuple:
    data = rec.get("data") or {}
    return (sender, receiver, data.get("msg"), data.get("local_comm_id"),
            data.get("remote_comm_id"), data.get("src_ep"), data.get("dst_ep"))


def match_recvs(rows: list[dict]) -> dict[int, int]:
    """cm_send seq -> row of the cm_recv that received it (first come, first matched); rows:
    each row's (first) record."""
    pending: dict[tuple, list[int]] = {}
    out: dict[int, int] = {}
    for i, rec in enumerate(rows):
        data = rec.get("data") or {}
        if rec["kind"] == "cm_send":
            pending.setdefault(_recv_key(rec, rec.get("host"), data.get("dst")), []).append(
                rec["seq"])
        elif rec["kind"] == "cm_recv":
            queue = pending.get(_recv_key(rec, data.get("src"), rec.get("host")))
            if queue:
                out[queue.pop(0)] = i
    return out


def _same_frame(a: dict, b: dict) -> bool:
    """Two summaries of one frame (the switch's rule record, the capture's decode): equal on
    every field both have, and both say enough."""
    common = [k for k in a if k in b]
    return len(common) >= 3 and all(a[k] == b[k] for k in common)


def dropped_wires(records: list[dict]) -> set[int]:
    """wire seqs whose frame a switch_drop record names: the same frame summary, the nearest
    in time (within DROP_MATCH_NS: the capture's and the switch's clocks are both converted
    to the lab's time line). Wires are indexed by a few frame fields so that long loops stay
    fast; a drop whose fields index nothing looks at every wire near it in time."""
    out: set[int] = set()
    wires = sorted((r for r in records if r["kind"] == "wire"
                    and isinstance((r.get("data") or {}).get("frame"), dict)),
                   key=lambda r: int(r.get("t_ns") or 0))
    every = ([int(w.get("t_ns") or 0) for w in wires], wires)
    index: dict[tuple, tuple[list, list]] = {}
    for w in wires:
        times, items = index.setdefault(
            tuple(w["data"]["frame"].get(k) for k in _FRAME_KEY), ([], []))
        times.append(int(w.get("t_ns") or 0))
        items.append(w)
    for rec in records:
        frame = (rec.get("data") or {}).get("frame")
        if rec["kind"] != "switch_drop" or not isinstance(frame, dict):
            continue
        t = int(rec.get("t_ns") or 0)
        times, items = index.get(tuple(frame.get(k) for k in _FRAME_KEY)) or every
        _take_nearest(out, frame, t, times, items, items is not wires)
    return out


def _take_nearest(out: set[int], frame: dict, t: int, times: list, items: list,
                  bucket: bool) -> None:
    """Adds to out the wire nearest t (outward, nearest first, within DROP_MATCH_NS) that
    carries frame and is not taken yet; a bucket's match leaves its bucket."""
    left = bisect.bisect_left(times, t) - 1
    right = left + 1
    while left >= 0 or right < len(items):
        dl = t - times[left] if left >= 0 else None
        dr = times[right] - t if right < len(items) else None
        k = left if dr is None or (dl is not None and dl <= dr) else right
        if abs(times[k] - t) > DROP_MATCH_NS:
            return
        w = items[k]
        if w["seq"] not in out and _same_frame(frame, w["data"]["frame"]):
            out.add(w["seq"])
            if bucket:  # matched: out of its bucket
                del times[k], items[k]
            return
        if k == left:
            left -= 1
        else:
            right += 1
