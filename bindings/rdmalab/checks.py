"""Checkers over a history (the Jepsen pattern): each reads the records, never the engine, and
returns a CheckResult that is valid, invalid (with the offending records) or unknown.

A history is a list of dicts as ``Lab.history()`` returns them:
``{"seq", "t_ns", "host", "object", "kind", "data"}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional


@dataclass
class CheckResult:
    name: str
    valid: Optional[bool]  # None: unknown (the history cannot say)
    problems: list = field(default_factory=list)
    details: dict = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.valid is True

    def __str__(self) -> str:
        state = {True: "valid", False: "INVALID", None: "unknown"}[self.valid]
        text = f"{self.name}: {state}"
        for p in self.problems[:20]:
            text += f"\n  - {p}"
        if len(self.problems) > 20:
            text += f"\n  ... {len(self.problems) - 20} more"
        return text


def _of(history: Iterable[dict], *kinds: str, host: Optional[str] = None,
        obj: Optional[str] = None):
    return [r for r in history
            if r["kind"] in kinds and (host is None or r["host"] == host)
            and (obj is None or r["object"] == obj)]


def _key(r: dict) -> tuple:
    return (r["host"], r["object"])


def _event_id(r: dict):
    """Dispatcher records name the event by its per-context sequence number (data.seq)."""
    return r["data"].get("seq", -1 - r["seq"])


def no_handler_after_destroy(history: list) -> CheckResult:
    """No async-event handler starts for an object after its destroy returned (seeds 001, 002)."""
    destroyed_at = {}
    for r in _of(history, "destroy_end"):
        destroyed_at.setdefault(_key(r), r["seq"])
    problems = []
    for r in _of(history, "handler_begin"):
        end = destroyed_at.get(_key(r))
        if end is not None and r["seq"] > end:
            problems.append(f"{r['host']} {r['object']}: handler_begin seq {r['seq']} "
                            f"at {r['t_ns']} ns "
                            f"after destroy_end seq {end}")
    if not destroyed_at:
        return CheckResult("no_handler_after_destroy", None, ["no destroy in the history"])
    return CheckResult("no_handler_after_destroy", not problems, problems,
                       {"destroyed": len(destroyed_at)})


def destroy_waits_for_handlers(history: list) -> CheckResult:
    """Every handler that began before destroy_begin of its object ended before destroy_end."""
    problems = []
    checked = 0
    for end in _of(history, "destroy_end"):
        begin = next((r for r in _of(history, "destroy_begin", host=end["host"], obj=end["object"])
                      if r["seq"] < end["seq"]), None)
        if begin is None:
            continue
        for hb in _of(history, "handler_begin", host=end["host"], obj=end["object"]):
            if hb["seq"] > end["seq"]:
                continue
            checked += 1
            he = next((r for r in _of(history, "handler_end", host=hb["host"], obj=hb["object"])
                       if r["seq"] > hb["seq"]), None)
            if he is None or he["seq"] > end["seq"]:
                problems.append(f"{end['host']} {end['object']}: handler from seq {hb['seq']} "
                                f"still running when destroy returned (seq {end['seq']})")
    if checked == 0:
        return CheckResult("destroy_waits_for_handlers", None, ["no handler overlapped a destroy"])
    return CheckResult("destroy_waits_for_handlers", not problems, problems, {"handlers": checked})


def handlers_serialized(history: list) -> CheckResult:
    """Handlers for one object never overlap and run in dispatch order (seed 001's per-id queue)."""
    problems = []
    running = {}
    order = {}
    began = {}
    for r in history:
        k = _key(r)
        if r["kind"] == "event_dispatched":
            order.setdefault(k, []).append(_event_id(r))
        elif r["kind"] == "handler_begin":
            if running.get(k):
                problems.append(f"{k[0]} {k[1]}: handler_begin seq {r['seq']} while another runs")
            running[k] = True
            began.setdefault(k, []).append(_event_id(r))
        elif r["kind"] == "handler_end":
            running[k] = False
    for k, seqs in began.items():
        started = set(seqs)
        dispatched = [s for s in order.get(k, []) if s in started]
        if dispatched != seqs:
            problems.append(f"{k[0]} {k[1]}: handlers ran in order {seqs}, dispatched {dispatched}")
    if not began:
        return CheckResult("handlers_serialized", None, ["no handler ran"])
    return CheckResult("handlers_serialized", not problems, problems,
                       {"objects": len(began), "handlers": sum(len(v) for v in began.values())})


def holds_released(history: list) -> CheckResult:
    """Every packet a wire rule held back (reorder; in the fault switch also delay) was let go
    exactly once: no frame lost or sent twice by the fault itself. The model names the packet
    (fault "reorder" / reorder_release data.packet); the switch its record (switch_reorder,
    switch_delay data.seq / switch_release data.of_seq)."""
    held, released = {}, {}
    for r in history:
        d = r["data"]
        if r["kind"] == "fault" and d.get("fault") == "reorder" and "packet" in d:
            held[("model", d["packet"])] = r
        elif r["kind"] == "reorder_release":
            released.setdefault(("model", d.get("packet")), []).append(r)
        elif r["kind"] in ("switch_reorder", "switch_delay"):
            held[("switch", d.get("seq"))] = r
        elif r["kind"] == "switch_release":
            released.setdefault(("switch", d.get("of_seq")), []).append(r)
    problems = [f"{k[0]} hold {k[1]} ({held[k]['kind']}, t_ns {held[k]['t_ns']}): released "
                f"{len(released.get(k, []))} times" for k in held if len(released.get(k, [])) != 1]
    problems += [f"{k[0]} release of {k[1]} with no hold" for k in released if k not in held]
    if not held:
        return CheckResult("holds_released", None, ["no held packet in the history"])
    return CheckResult("holds_released", not problems, problems, {"held": len(held)})


def events_for(history: list, host: str, obj: str, kinds=("handler_begin",)) -> list:
    """The event type names that reached an object's handler, in order."""
    return [r["data"].get("event") for r in _of(history, *kinds, host=host, obj=obj)]


def records(history: list, kind: str, host: Optional[str] = None,
            obj: Optional[str] = None) -> list:
    return _of(history, kind, host=host, obj=obj)
