"""What the ladder says: the words of its arrows, marks, hover titles, time axis and quiet
stretches (rdmalab.report.ladder.diagram places them)."""

from __future__ import annotations

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
    return kind, "note"


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
