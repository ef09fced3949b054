"""Model against device for one schedule: the user-visible outcome of each side of each
connection (rdma_cm events and their statuses, the status of each work request's completion,
async events) and of each step, read from two histories through the runner's `schedule_bind`
records, so object ids and QPNs never need to agree. `differences()` lists where they part.

A difference is a candidate, not a finding: it is written out with both histories and the
schedule (write_candidate) to be classified in the findings registry (README "The findings
registry"): suspect the model first.
"""
from __future__ import annotations

import dataclasses
import json
import re
import pathlib
from typing import Optional

from .. import _core
from ..names import name, parse
from .schedule import Schedule


# Steps "at once" are at once on the model and a few ms apart on a device (each is a call to
# an agent): a peer's DREQ or DREP arrives before the next step on one and not on the other.
# A differential run paces both at least this far apart, so the model sees the device's order.
PACE_NS = 1_000_000


def paced(schedule: Schedule) -> Schedule:
    return dataclasses.replace(schedule, pace_ns=max(schedule.pace_ns, PACE_NS))


def outcome(history: list[dict]) -> dict:
    """{"conn/side": {"events": [...], "wc": {wr_id: status}, "async": [...]},
    "steps": [[i, op, result, errno], ...]} from a runner's history."""
    by_id, by_obj, by_qp, out = {}, {}, {}, {"steps": []}
    # The bindings first: on an agent lab the controller's bind record and the agent's first
    # events of the id interleave by time, either way round.
    for r in history:
        if r["kind"] == "schedule_bind":
            d = r["data"]
            if "xrc" in d:  # an XRC domain's TGT QP, or its sender (xrc.py)
                key = f"xrc:{d['xrc']}" + (f"/{d['sender']}" if "sender" in d else "")
            else:
                key = f"{d['conn']}/{d['side']}"
                by_id[(r["host"], d["cm_id"])] = key
            if d.get("qp"):
                by_obj[(r["host"], d["qp"])] = key
            if d.get("qp_num"):  # a device hands a destroyed QP's number out again
                by_qp.setdefault((r["host"], d["qp_num"]), []).append((r["seq"], key))
            out.setdefault(key, {"events": [], "wc": {}, "async": []})
    for r in history:
        kind, d = r["kind"], r.get("data", {})
        if kind == "teardown_begin":
            break  # the harness's cleanup: its timing is the lab's, not the schedule's
        if kind == "schedule_step":
            out["steps"].append([d["i"], d["op"], d["result"], d.get("errno", "")])
        elif kind == "cm_event":
            key = by_id.get((r["host"], r["object"]))
            if key:
                out[key]["events"].append(f"{d['event']}({d.get('status', 0)})")
        elif kind == "wc":
            key = _qp_key(r, by_obj, by_qp)
            if key:
                # ibv_poll_cq(3): with a status other than SUCCESS only wr_id, status, qp_num
                # and vendor_err are valid, so an error completion is its status alone.
                status = d.get("status")
                out[key]["wc"][str(d.get("wr_id"))] = (
                    f"{d.get('opcode')}:{status}" if status == "SUCCESS" else str(status))
        elif kind == "event_dispatched":
            # What the application's Dispatcher got (the same stack code on every lab): a
            # device records an async event only when a context reads it, the model also when
            # its device raises one nobody has open (vm:rxe seed 6: a port down before any
            # process on the host).
            if _qp_affiliated(d.get("event")):
                key = _qp_key(r, by_obj, by_qp, d.get("qp_num"))
            else:  # a port's or the device's: the host's, whichever QPs it has
                key = f"{r['host']}/device"
                out.setdefault(key, {"events": [], "wc": {}, "async": []})
            if key:
                out[key]["async"].append(d.get("event"))
    return out


def _qp_key(r: dict, by_obj: dict, by_qp: dict, qpn=None) -> Optional[str]:
    """The conn/side whose QP a record is about: by the QP's object label where the bind names
    it (labels are never reused), else by QP number, bound most recently before the record."""
    key = by_obj.get((r["host"], r["object"]))
    if key:
        return key
    binds = by_qp.get((r["host"], qpn if qpn is not None else r.get("data", {}).get("qp_num")))
    if not binds:
        return None
    before = [k for seq, k in binds if seq <= r["seq"]]
    return before[-1] if before else binds[0][1]


def _qp_affiliated(event) -> bool:
    """Whether an async event names a QP (the engine's affiliation table, semantics.md E)."""
    try:
        kind = _core.affiliation(parse(_core.AsyncEventType, event, "async event"))
    except (ValueError, TypeError):
        return True  # an unknown name: compared by QP, as before
    return name(kind) == "QP"


# A WR outstanding when its QP goes to ERR completes or is flushed depending on whether it
# finished first (IBA 10.8.3.3; ibv_post_send(3)): either is legal, and which one happens
# depends on how long the lab took between the steps, which a device cannot make zero.
TIMING = "timing: "


def _race(x: str, y: str) -> bool:
    return {x.split(":")[-1], y.split(":")[-1]} == {"SUCCESS", "WR_FLUSH_ERR"}


def differences(model: dict, device: dict) -> list[str]:
    """Where two outcomes part, one line each, in schedule order. Lines starting with TIMING
    are differences both rules allow (see _race): printed, never candidates."""
    diffs = []
    ms, ds = {s[0]: s for s in model["steps"]}, {s[0]: s for s in device["steps"]}
    for i in sorted(set(ms) | set(ds)):
        a, b = ms.get(i), ds.get(i)
        if a is None or b is None or a[2:] != b[2:]:
            diffs.append(f"step {i} ({(a or b)[1]}): model {_step(a)}, device {_step(b)}")
    for key in sorted(k for k in set(model) | set(device) if k != "steps"):
        a, b = model.get(key), device.get(key)
        if a is None or b is None:
            diffs.append(f"{key}: only on the {'device' if a is None else 'model'}")
            continue
        if a["events"] != b["events"]:
            diffs.append(f"{key} events: model {a['events']}, device {b['events']}")
        for wr in sorted(set(a["wc"]) | set(b["wc"]), key=int):
            x, y = a["wc"].get(wr, "no completion"), b["wc"].get(wr, "no completion")
            if x != y:
                diffs.append(f"{TIMING if _race(x, y) else ''}{key} wr {wr}: model {x}, "
                             f"device {y}")
        if a["async"] != b["async"]:
            diffs.append(f"{key} async events: model {a['async']}, device {b['async']}")
    return diffs


def _step(s: Optional[list]) -> str:
    if s is None:
        return "not run"
    return s[2] + (f" {s[3]}" if s[3] else "")


# A step the device lab cannot do (its result "unsupported": e.g. injecting QP_REQ_ERR on
# siw) is not a difference of the stack: the model runs the schedule again without it and the
# comparison names it on a line of its own, never a candidate.
UNSUPPORTED = "unsupported: "


def unsupported_steps(device: dict) -> list[int]:
    """The steps a device outcome says its lab could not do."""
    return sorted(s[0] for s in device["steps"] if s[2] == "unsupported")


def without_steps(schedule: Schedule, steps: list[int]) -> Schedule:
    """The schedule with those steps made 0-ns waits: step numbers (and wr_ids) stay."""
    kept = [dict(st) for st in schedule.steps]
    for i in steps:
        kept[i] = {"op": "wait", "ns": 0}
    return schedule.with_steps(kept)


def skip_steps(model: dict, device: dict, steps: list[int]) -> list[str]:
    """Drops those steps' results from both outcomes; the lines that say so."""
    gone = set(steps)
    for o in (model, device):
        o["steps"] = [s for s in o["steps"] if s[0] not in gone]
    return [f"{UNSUPPORTED}step {i}: the device lab cannot do it; the model ran without it"
            for i in steps]


def candidates(diffs: list[str]) -> list[str]:
    """The differences no rule allows: what a candidate finding is made of."""
    return [d for d in diffs if not d.startswith((TIMING, UNSUPPORTED))]


def write_candidate(out: pathlib.Path, schedule: Schedule, lab: str, diffs: list[str],
                    model_history: list, device_history: list) -> pathlib.Path:
    """out/<lab>-seed<seed>/: schedule.json, model.jsonl, device.jsonl, differences.txt."""
    d = out / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', lab)}-seed{schedule.seed}"
    d.mkdir(parents=True, exist_ok=True)
    schedule.dump(d / "schedule.json")
    for file, hist in (("model.jsonl", model_history), ("device.jsonl", device_history)):
        (d / file).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in hist))
    (d / "differences.txt").write_text(
        f"candidate finding: schedule seed {schedule.seed} on {lab}\n"
        f"classify it in bindings/rdmalab/findings/findings.toml (finding / provider-fact / "
        f"unclassified), or fix the model if the model is wrong\n\n" + "\n".join(diffs) + "\n")
    return d
