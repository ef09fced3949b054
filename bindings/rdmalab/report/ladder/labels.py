"""What the ladder says: the words of its arrows, marks, hover titles, time axis and quiet
stretches (rdmalab.report.ladder.diagram places them)."""

from __future__ import annotations

import errno
import json
import re

ETHERTYPES = {"0x0800": "IPv4", "0x86dd": "IPv6", "0x0806": "ARP", "0x8915": "RoCEv1"}


def frame_label(frame: dict) -> str:
    """A switch frame summary as a short arrow label: REQ / SEND_ONLY psn 5 / TCP SYN."""
    if not isinstance(frame, dict):
        return "frame"
    if frame.get("cm"):
        return str(frame["cm"])
    proto = frame.get("proto", "")
    if proto == "iwarp" or "rdmap_opcode" in frame or "tcp_flags" in frame:
        if frame.get("rdmap_opcode"):
            return str(frame["rdmap_opcode"])
        if frame.get("mpa"):
            return f"MPA {frame['mpa']}"
        flags = frame.get("tcp_flags")
        return f"TCP {flags}" if flags else "TCP"
    if frame.get("opcode"):
        psn = frame.get("psn")
        return f"{frame['opcode']}" + (f" psn {psn}" if psn is not None else "")
    if proto:
        return str(proto)
    ethertype = str(frame.get("ethertype", "")).lower()
    if ethertype in ETHERTYPES:
        return ETHERTYPES[ethertype]
    return str(frame.get("why") or ethertype or "frame")  # why: the parser's, not parsed


def _status(value) -> str:
    return "" if value in (0, "0", None, "") else f" {value}"


def mark_label(rec: dict) -> tuple[str, str]:
    """(label, category) of a non-arrow record."""
    kind, data = rec["kind"], rec.get("data") or {}
    if kind == "cm_event":
        return f"{data.get('event', '?')}{_status(data.get('status'))}", "cm-event"
    if kind == "async_event":
        return f"{data.get('event', '?')}", "async"
    if kind == "iw_event":  # the iw_cm layer's event, under the rdma_cm one
        return f"iw_cm {data.get('event', '?')}{_status(data.get('status'))}", "state"
    if kind == "wc":
        status = data.get("status", "?")
        return f"wc {data.get('opcode', '?')} {'ok' if status == 'SUCCESS' else status}", "wc"
    if kind == "post":
        return f"post {data.get('opcode') or data.get('queue', '')} #{data.get('wr_id', '?')}", \
            "post"
    if kind == "qp_state":
        return f"{rec.get('object', 'qp')} {data.get('from', '?')}→{data.get('to', '?')}", \
            "state"
    if kind == "cm_state":
        layer = data.get("layer", "")
        return f"{layer or 'cm'} {data.get('from', '?')}→{data.get('to', '?')}", "state"
    if kind.startswith("switch_") or kind in ("fault", "wire_rule", "reorder_release"):
        return _fault_label(kind, data), "fault"
    if kind == "verb":
        return str(data.get("verb", "verb")), "verb"
    if kind == "kernel_log":
        return f"kernel: {str(data.get('text', ''))[:60]}", "fault"
    if kind in ("host_lost", "host_back", "process_crash", "device_removed", "device_added"):
        return kind, "fault"
    if kind == "cm_retry":
        return f"retry {data.get('msg', '')} #{data.get('attempt', '')}", "note"
    if kind == "stall":  # the machine stood still: every time near it is late by as much
        return f"stood still {int(data.get('late_ns', 0)) / 1e6:.0f} ms", "fault"
    if kind in WORKLOAD_LABELS:
        label, failed = WORKLOAD_LABELS[kind](data)
        return label, "workload fault" if failed else "workload"
    return kind, "note"


# -- a workload's records (rdmalab.workloads.records; the report room does not import the
# workloads room, so the kinds are named here as the metrics' classifier names them). Each
# gives (label, failed): a failure is drawn in the fault style.

def _took(ns) -> str:
    ns = int(ns or 0)
    if ns >= 1_000_000_000:
        return f" {ns / 1e9:.1f} s"
    if ns >= 1_000_000:
        return f" {ns / 1e6:.0f} ms"
    return f" {ns / 1e3:.0f} µs" if ns > 0 else ""


def _step_label(data: dict) -> tuple[str, bool]:
    """"connect 1.7 s", "io_stop 660 written", "connect failed: ECONNREFUSED"."""
    step = str(data.get("step", "step"))
    if not data.get("ok", True):
        err = data.get("errno") or 0
        why = errno.errorcode.get(err, str(err)) if err else str(data.get("error", ""))[:48]
        return f"{step} failed" + (f": {why}" if why else ""), True
    if step == "io_stop":
        extra = f" {data.get('written', 0)} written"
        if data.get("errors"):
            extra += f", {data['errors']} errors"
        if data.get("blocked"):
            return f"{step}{extra}, a write blocked", True
        return step + extra, False
    return step + _took(data.get("took_ns")), False


def _state_label(data: dict) -> tuple[str, bool]:
    """"nvme0 live→resetting"; a unit's first state alone: "nvme0 live"."""
    unit, state, previous = data.get("unit", "?"), data.get("state", "?"), data.get("previous")
    return (f"{unit} {previous}→{state}" if previous else f"{unit} {state}"), False


def _io_label(data: dict) -> tuple[str, bool]:
    """"write errors: EIO: Input/output error", "writes resumed after 37 errors"."""
    op, phase, errors = data.get("op", "io"), data.get("phase"), data.get("errors", 0)
    if phase == "errors":
        error = str(data.get("error") or "")[:48]
        return f"{op} errors" + (f": {error}" if error else ""), True
    if phase == "resumed":
        return f"{op}s resumed after {errors} error{'' if errors == 1 else 's'}", False
    return f"{op}s {data.get('ok', 0)} ok, {errors} errors", False


def _count(data: dict, name: str) -> int:
    """io_verify's count of lost or corrupt blocks (name_count; the list where it is not)."""
    value = data.get(f"{name}_count", data.get(name, 0))
    return len(value) if isinstance(value, list) else int(value or 0)


def _verify_label(data: dict) -> tuple[str, bool]:
    """"verify 381 acked, 0 lost"; corrupt blocks named where there are any."""
    lost, corrupt = _count(data, "lost"), _count(data, "corrupt")
    label = f"verify {data.get('acked', '?')} acked, {lost} lost"
    if corrupt:
        label += f", {corrupt} corrupt"
    return label, bool(lost or corrupt)


WORKLOAD_LABELS = {"workload": _step_label, "ulp_state": _state_label, "io": _io_label,
                   "io_verify": _verify_label}


def _fault_label(kind: str, data: dict) -> str:
    """A fault where it acted: the switch's action on a frame, a rule, a model fabric fault."""
    what = (data.get("fault", "fault") if kind in ("fault", "wire_rule")
            else kind.removeprefix("switch_"))
    frame = data.get("frame")
    rule = data.get("rule")
    if kind == "wire_rule" and isinstance(rule, dict):
        detail = " ".join(f"{k}={v}" for k, v in rule.items() if k != "action")
        return f"rule {what}" + (f" {detail}" if detail else "")
    if frame:
        return f"{what} {frame_label(frame)}"
    if kind == "fault" and data.get("opcode"):
        return f"{what} {data['opcode']}" + (f" psn {data['psn']}" if "psn" in data else "")
    return str(what)


def bulk_label(rec: dict) -> str:
    """A record's mark label without what changes from one loop turn to the next."""
    return re.sub(r" (#|psn )\S+", "", mark_label(rec)[0])


def title_of(rec: dict) -> str:
    """The hover text: every field of the record."""
    head = f"#{rec.get('seq')} t={rec.get('t_ns', 0) / 1e9:.6f} s host={rec.get('host', '')} " \
           f"{rec.get('kind')} {rec.get('object', '')}"
    return head + "\n" + json.dumps(rec.get("data") or {}, sort_keys=True, indent=1)


def format_t(ns: float) -> str:
    s = ns / 1e9
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.0f} µs"


def quiet_label(duration_ns: int, inside: list[list[dict]]) -> str:
    """A compressed stretch's label: its length and what happened in it (inside: the records
    of each of its rows) — the retries, else the frames, else the messages, else the kinds."""
    retries: dict[str, int] = {}
    frames: dict[str, int] = {}
    sends = 0
    # Frames as the wire records count them; the switch's watch records where there are none.
    framing = "wire" if any(recs[0]["kind"] == "wire" for recs in inside) else "switch_watch"
    for recs in inside:
        rec = recs[0]
        data = rec.get("data") or {}
        if rec["kind"] == "cm_send":
            sends += 1
            if (data.get("attempt") or 1) > 1:
                retries[data.get("msg", "?")] = retries.get(data.get("msg", "?"), 0) + 1
        elif rec["kind"] == framing:
            lab = frame_label(data.get("frame") or {})
            frames[lab] = frames.get(lab, 0) + 1
    head = f"{duration_ns / 1e9:.1f} s: "
    if retries:
        return head + ", ".join(f"{n} {m} retr{'ies' if n > 1 else 'y'}"
                                for m, n in retries.items())
    if frames:
        return head + ", ".join(f"{n} {m} frame{'s' if n > 1 else ''}"
                                for m, n in frames.items())
    if sends:
        return head + f"{sends} messages"
    if inside:
        kinds: dict[str, int] = {}
        for recs in inside:
            kinds[recs[0]["kind"]] = kinds.get(recs[0]["kind"], 0) + len(recs)
        return head + ", ".join(f"{k}" + (f" ×{n}" if n > 1 else "") for k, n in kinds.items())
    return head + "quiet"
