"""A history as the report reads it: the records of a JSON-lines history file (read_history),
and the first user-visible outcome where two histories differ (first_difference).

first_difference() compares the user-visible outcomes of two histories (a model personality and
the device it predicts) host by host and kind by kind (CM events, completions, async events,
drains: the order between kinds is timing, not an outcome), with backend object ids normalised
away, and only the kinds both sides record on that host (outcomes())."""

from __future__ import annotations

import dataclasses
import json
from typing import Optional

# Outcomes a user sees, compared between a model and its device (first_difference).
OUTCOME_KINDS = ("cm_event", "wc", "async_event", "drain_end")


class HistoryError(ValueError):
    """A history file that cannot be read: the message names the file and line."""


def read_history(path: str, name: Optional[str] = None) -> list[dict]:
    """The records of a JSON-lines history file; HistoryError naming the file (as name, when
    given) and line when a line is not a record."""
    name = name or path
    try:
        with open(path, encoding="utf-8") as f:
            return [_record(line, name, n) for n, line in enumerate(f, 1) if line.strip()]
    except OSError as e:
        raise HistoryError(f"{name}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise HistoryError(f"{name}: not UTF-8 text ({e})") from None


def _record(line: str, name: str, n: int) -> dict:
    """One line's record; HistoryError naming the file and line when it is not one."""
    try:
        rec = json.loads(line)
    except ValueError as e:
        raise HistoryError(f"{name} line {n}: not JSON ({e})") from None
    if not isinstance(rec, dict):
        raise HistoryError(f"{name} line {n}: not a JSON object")
    missing = [k for k in ("seq", "t_ns", "kind") if k not in rec]
    if missing:
        raise HistoryError(f"{name} line {n}: record without {', '.join(missing)}")
    if not isinstance(rec.get("data", {}), dict):
        raise HistoryError(f"{name} line {n}: data is not an object")
    return rec


@dataclasses.dataclass
class Difference:
    """The first user-visible outcome where two histories differ: on host, the index-th
    outcome of its kind; model_seq / device_seq the record on each side (None where that side
    has no more outcomes of that kind on that host)."""
    host: str
    index: int
    model_seq: Optional[int]
    device_seq: Optional[int]
    model_text: str
    device_text: str
    kind: str = "outcome"

    def describe(self, model_name="model", device_name="device") -> str:
        return (f"first difference, host {self.host}, {self.kind} #{self.index + 1}: "
                f"{model_name} {self.model_text or '(nothing more)'}, "
                f"{device_name} {self.device_text or '(nothing more)'}")


def outcome_token(rec: dict) -> Optional[str]:
    """A user-visible outcome with backend object ids normalised away."""
    kind, data = rec["kind"], rec.get("data") or {}
    if kind == "cm_event":
        return f"cm_event {data.get('event')} status {data.get('status', 0)}"
    if kind == "wc":
        return f"wc {data.get('opcode')} {data.get('status')}"
    if kind == "async_event":
        return f"async_event {data.get('event')}"
    if kind == "drain_end":
        return f"drain {'complete' if data.get('complete') else 'INCOMPLETE'}"
    return None


def outcomes(records: list[dict]) -> dict[tuple[str, str], list[tuple[str, int]]]:
    """(host, kind) -> [(token, seq)] in history order. Completions inside a drain (between
    drain_begin and drain_end of one QP) are the drain's own: its markers on one backend, the
    flushes it counts on another (DrainMethod); the drain's outcome is its drain_end."""
    out: dict[tuple[str, str], list[tuple[str, int]]] = {}
    draining: set[tuple[str, str]] = set()
    for rec in records:
        where = (rec.get("host", ""), rec.get("object", ""))
        if rec["kind"] == "drain_begin":
            draining.add(where)
        elif rec["kind"] == "drain_end":
            draining.discard(where)
        elif rec["kind"] == "wc" and where in draining:
            continue
        token = outcome_token(rec)
        if token is not None:
            out.setdefault((rec.get("host", ""), rec["kind"]), []).append((token, rec["seq"]))
    return out


def first_difference(model: list[dict], device: list[dict]) -> Optional[Difference]:
    """The first outcome where the histories differ: per host and kind, the first index where
    the sequences differ (one ending early counts); of those, the lowest index (kinds in
    OUTCOME_KINDS order, then hosts in name order, break ties). None when they agree."""
    m, d = outcomes(model), outcomes(device)
    best: Optional[Difference] = None
    # Only what both sides record on a host is compared: a model lab that brings QPs up
    # without rdma_cm has no CM events, a device records a completion when it is polled and
    # the model when it is made (an overflowed CQ's): the scenario's assertions judge those.
    keys = sorted(set(m) & set(d), key=lambda hk: (OUTCOME_KINDS.index(hk[1]), hk[0]))
    for host, kind in keys:
        ms, ds = m.get((host, kind), []), d.get((host, kind), [])
        for i in range(max(len(ms), len(ds))):
            mt = ms[i] if i < len(ms) else None
            dt = ds[i] if i < len(ds) else None
            if mt is not None and dt is not None and mt[0] == dt[0]:
                continue
            if best is None or i < best.index:
                best = Difference(host, i, mt[1] if mt else None, dt[1] if dt else None,
                                  mt[0] if mt else "", dt[0] if dt else "", kind)
            break
    return best
