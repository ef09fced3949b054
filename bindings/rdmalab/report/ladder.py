"""A scenario's history as a ladder diagram: the layout numbers only (lanes, rows, arrows,
marks, compressed quiet stretches), pure Python. The HTML report (rdmalab.report.html) draws
them as SVG.

Hosts (and the fault switch, when the history has one) are vertical lanes, time runs down.
Arrows: exactly one per `cm_send` record (the model's CM messages) and per `wire` record (a
frame the switch or bridge received on a device lab), nothing else is an arrow. Everything
else worth seeing is a mark beside its lane: CM events, async events, completions, QP and cm_id
state changes, faults where they acted (the switch's drop/delay/duplicate/corrupt at the switch
lane, a model fabric fault between the two hosts).

Rows are ordinal (one per drawn record, so a burst at one instant stays readable) with a little
extra room for elapsed time; a stretch of at least QUIET_NS between two notable records (see
NOTABLE) is compressed into a band of thin rows, labelled with its length and what happened in
it ("94.3 s: 14 DREQ retries").

first_difference() compares the user-visible outcomes of two histories (a model personality and
the device it predicts) host by host and kind by kind (CM events, completions, async events,
drains: the order between kinds is timing, not an outcome), with backend object ids normalised
away, and only the kinds both sides record on that host (outcomes())."""

from __future__ import annotations

import dataclasses
import bisect
import json
import math
import re
from typing import Optional

QUIET_NS = 1_000_000_000   # a stretch this long between notable records is compressed
ROW = 16                   # px per row
THIN_ROW = 4               # px per row inside a compressed stretch
GAP_MIN_H = 30             # px of a compressed stretch, at least
TOP = 44                   # room for the lane names
LANE_W = 190               # px between lanes
LEFT = 80                  # room for the time axis
BULK = 4                   # a run of more post/wc records than this is summarised
DROP_MATCH_NS = 2_000_000_000  # a switch_drop names a wire record at most this far away

ARROW_KINDS = ("cm_send", "wire")
ETHERTYPES = {"0x0800": "IPv4", "0x86dd": "IPv6", "0x0806": "ARP", "0x8915": "RoCEv1"}
SWITCH_HOSTS = ("switch", "bridge")
# Plumbing of the event channels: in every history, seen through the event it carries.
HIDDEN = {"cm_event_read", "cm_event_dispatched", "cm_event_ack", "async_event_read",
          "async_event_ack", "event_dispatched", "handler_begin", "handler_end",
          "cm_handler_begin", "cm_handler_end", "lab_start", "fabric_options", "cm_create",
          "cm_retry"}  # (a retry's message arrow says #attempt)
# Traffic: what a quiet stretch may hold (retries, frames, the switch acting on them).
TRAFFIC = {"cm_send", "cm_recv", "cm_retry", "cm_unexpected", "cm_duplicate", "cm_stale",
           "retransmit", "wire", "switch_watch", "switch_drop", "switch_delay",
           "switch_duplicate", "switch_corrupt", "switch_reorder", "switch_release",
           "reorder_release", "cm_timewait"}
# Marks a loop repeats: a long run of them is summarised (_items).
BULKABLE = {"post", "wc", "retransmit", "switch_watch", "switch_drop", "switch_delay",
            "switch_duplicate", "switch_corrupt", "switch_reorder", "switch_release"}
# Outcomes a user sees, compared between a model and its device (first_difference).
OUTCOME_KINDS = ("cm_event", "wc", "async_event", "drain_end")


@dataclasses.dataclass
class Lane:
    name: str
    x: float
    switch: bool = False


@dataclasses.dataclass
class Arrow:
    seq: int
    kind: str            # cm_send | wire
    x1: float
    y1: float
    x2: float
    y2: float
    label: str
    title: str
    classes: str         # "arrow cm" / "arrow wire", + " lost" / " dropped" / " thin"
    t_ns: int
    quiet: bool = False  # inside a compressed stretch: drawn without its label


@dataclasses.dataclass
class Mark:
    seqs: list
    kind: str
    host: str
    x: float
    y: float
    label: str
    title: str
    classes: str         # "mark <category>"
    t_ns: int
    quiet: bool = False


@dataclasses.dataclass
class Gap:
    y1: float
    y2: float
    label: str
    t0: int
    t1: int


@dataclasses.dataclass
class Tick:
    y: float
    label: str


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


@dataclasses.dataclass
class Ladder:
    lanes: list
    arrows: list
    marks: list
    gaps: list
    ticks: list
    width: float
    height: float
    messages: int                     # cm_send + wire records == len(arrows)
    records: int
    highlights: list = dataclasses.field(default_factory=list)  # (y, text) first differences


class HistoryError(ValueError):
    """A history file that cannot be read: the message names the file and line."""


def read_history(path: str, name: Optional[str] = None) -> list[dict]:
    """The records of a JSON-lines history file; HistoryError naming the file (as name, when
    given) and line when a line is not a record."""
    name = name or path
    records = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError as e:
                    raise HistoryError(f"{name} line {n}: not JSON ({e})") from None
                if not isinstance(rec, dict):
                    raise HistoryError(f"{name} line {n}: not a JSON object")
                missing = [k for k in ("seq", "t_ns", "kind") if k not in rec]
                if missing:
                    raise HistoryError(f"{name} line {n}: record without "
                                       f"{', '.join(missing)}")
                if not isinstance(rec.get("data", {}), dict):
                    raise HistoryError(f"{name} line {n}: data is not an object")
                records.append(rec)
    except OSError as e:
        raise HistoryError(f"{name}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise HistoryError(f"{name}: not UTF-8 text ({e})") from None
    return records


# -- labels

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
    if kind.startswith("switch_") or kind == "fault" or kind == "reorder_release":
        what = kind.removeprefix("switch_") if kind != "fault" else data.get("fault", "fault")
        frame = data.get("frame")
        rule = data.get("rule")
        if kind == "fault" and isinstance(rule, dict):
            detail = " ".join(f"{k}={v}" for k, v in rule.items() if k != "action")
            return f"rule {what}" + (f" {detail}" if detail else ""), "fault"
        if frame:
            return f"{what} {frame_label(frame)}", "fault"
        if kind == "fault" and data.get("opcode"):
            return f"{what} {data['opcode']}" + (f" psn {data['psn']}" if "psn" in data
                                                 else ""), "fault"
        return str(what), "fault"
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


# -- outcomes and the first difference

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


# -- layout

@dataclasses.dataclass
class _Item:
    """One row: a record (or a summarised run of post/wc records)."""
    recs: list
    notable: bool

    @property
    def t(self) -> int:
        return int(self.recs[0].get("t_ns") or 0)

    @property
    def kind(self) -> str:
        return self.recs[0]["kind"]


def _lanes(records: list[dict]) -> list[Lane]:
    hosts: list[str] = []
    switch = ""

    def add(h):
        if h and h not in SWITCH_HOSTS and h not in hosts:
            hosts.append(h)
    for rec in records:
        host, data = rec.get("host") or "", rec.get("data") or {}
        if host in SWITCH_HOSTS:
            switch = switch or host
        elif rec["kind"] == "fault" and rec.get("object") == "switch":
            switch = switch or "switch"
        else:
            add(host)
        if rec["kind"] == "cm_send":
            add(data.get("dst", ""))
        if rec["kind"] == "wire":
            add(data.get("src_host", ""))
            add(data.get("dst_host", ""))
    hosts.sort()
    names = list(hosts)
    if switch:
        names.insert((len(hosts) + 1) // 2, switch)
    return [Lane(n, LEFT + 40 + i * LANE_W, n == switch) for i, n in enumerate(names)]


def bulk_label(rec: dict) -> str:
    """A record's mark label without what changes from one loop turn to the next."""
    return re.sub(r" (#|psn )\S+", "", mark_label(rec)[0])


def _items(records: list[dict]) -> list[_Item]:
    """The rows: a record each, but a run of more than BULK post / wc / switch-action records
    (wire records may interleave: they stay rows of their own, being arrows) becomes one row
    per (host, kind, bulk label), where the first of them was."""
    items: list[_Item] = []
    run: list[dict] = []
    seen: set = set()

    def flush():
        bulky = sum(1 for rec in run if rec["kind"] != "wire") > BULK
        groups: dict = {}
        for rec in run:
            notable = _notable(rec, seen)
            key = (rec.get("host"), rec["kind"], bulk_label(rec))
            if not bulky or rec["kind"] == "wire":
                items.append(_Item([rec], notable))
            elif key in groups:
                groups[key].recs.append(rec)
                groups[key].notable |= notable
            else:
                groups[key] = _Item([rec], notable)
                items.append(groups[key])
        run.clear()
    for rec in records:
        kind = rec["kind"]
        if kind in HIDDEN:
            continue
        if kind in BULKABLE or (kind == "wire" and run):
            run.append(rec)
            continue
        flush()
        items.append(_Item([rec], _notable(rec, seen)))
    flush()
    return items


def _notable(rec: dict, seen: set) -> bool:
    """Whether a record ends a quiet stretch: anything but traffic; of the traffic, a CM
    message's first attempt and the first frame or fault of its kind (their repeats are the
    retries a quiet stretch holds)."""
    kind, data = rec["kind"], rec.get("data") or {}
    if kind not in TRAFFIC:
        if kind != "fault" or "src" not in data:
            return True
    if kind == "cm_send":
        return (data.get("attempt") or 1) <= 1
    if kind in ("wire", "fault") or kind.startswith("switch_"):
        frame = data.get("frame") or data
        key = (kind, rec.get("host"), data.get("src_host") or data.get("src"),
               data.get("dst_host") or data.get("dst"),
               frame.get("cm") or frame.get("opcode") or frame.get("rdmap_opcode")
               or frame.get("tcp_flags"))
        if key not in seen:
            seen.add(key)
            return True
    return False


def _quiet_label(duration_ns: int, inside: list[_Item]) -> str:
    retries: dict[str, int] = {}
    frames: dict[str, int] = {}
    sends = 0
    # Frames as the wire records count them; the switch's watch records where there are none.
    framing = "wire" if any(it.kind == "wire" for it in inside) else "switch_watch"
    for item in inside:
        rec = item.recs[0]
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
        for item in inside:
            kinds[item.kind] = kinds.get(item.kind, 0) + len(item.recs)
        return head + ", ".join(f"{k}" + (f" ×{n}" if n > 1 else "") for k, n in kinds.items())
    return head + "quiet"


def layout(records: list[dict], highlight: Optional[dict] = None) -> Ladder:
    """The ladder of a history. highlight: {seq or None: text}; a seq marks that record's row
    as a first difference, None marks the end of the ladder (that side had nothing more)."""
    records = sorted(records, key=lambda r: r["seq"])
    lanes = _lanes(records)
    lane_x = {lane.name: lane.x for lane in lanes}
    switch = next((lane for lane in lanes if lane.switch), None)
    items = _items(records)
    t0 = min((int(r.get("t_ns") or 0) for r in records), default=0)

    # Quiet stretches: between consecutive notable rows at least QUIET_NS apart.
    notable = [i for i, it in enumerate(items) if it.notable]
    gaps_spec: list[tuple[int, int]] = []   # (first notable before, first notable after)
    bounds = list(zip(notable, notable[1:]))
    if notable and notable[-1] < len(items) - 1:
        bounds.append((notable[-1], len(items)))  # trailing traffic
    for a, b in bounds:
        t_end = items[b].t if b < len(items) else items[-1].t
        if t_end - items[a].t >= QUIET_NS:
            gaps_spec.append((a, b))

    # Rows: one per item; a quiet stretch is a band of thin rows after its first row.
    ys: list[float] = [0.0] * len(items)
    gaps: list[Gap] = []
    ticks: list[Tick] = []
    gap_after = {a: (a, b) for a, b in gaps_spec}
    y = float(TOP)
    i, after_gap = 0, False
    while i < len(items):
        item = items[i]
        if i and not after_gap:
            dt = max(0, item.t - items[i - 1].t)
            y += ROW + round(min(12.0, 2 * math.log10(1 + dt / 1000)), 1)
        elif i:
            y += ROW
        y = round(y, 1)
        ys[i] = y
        label = format_t(item.t - t0)
        if not ticks or (ticks[-1].label != label and (y - ticks[-1].y >= 28 or after_gap)):
            ticks.append(Tick(y, label))  # sparse enough to read
        after_gap = False
        if i in gap_after:
            a, b = gap_after[i]
            y1 = y + 8
            yy = y1 + 14  # room for the label
            for k in range(a + 1, b):
                yy = round(yy + THIN_ROW, 1)
                ys[k] = yy
            y2 = max(yy + 6, y1 + GAP_MIN_H)
            t1 = items[b].t if b < len(items) else items[-1].t
            gaps.append(Gap(y1, y2, _quiet_label(t1 - item.t, items[a + 1:b]), item.t, t1))
            y, i, after_gap = y2, b, True
            continue
        i += 1

    row_of_seq: dict[int, int] = {}
    for i, item in enumerate(items):
        for rec in item.recs:
            row_of_seq[rec["seq"]] = i

    # Arrows: cm_send -> its cm_recv; wire: src host -> dst host (the switch when dropped).
    recv_rows = _match_recvs(items)
    dropped = _dropped_wires(records)
    arrows: list[Arrow] = []
    marks: list[Mark] = []
    mid = (switch.x if switch else
           (sum(lane.x for lane in lanes) / len(lanes) if lanes else LEFT + 40))
    in_band = {k for a, b in gaps_spec for k in range(a + 1, b)}
    thin = sum(1 for r in records if r["kind"] in ARROW_KINDS) > 2000
    for i, item in enumerate(items):
        rec = item.recs[0]
        kind, data, host = rec["kind"], rec.get("data") or {}, rec.get("host") or ""
        y = ys[i]
        if kind == "cm_send":
            x1 = lane_x.get(host, mid)
            dst = data.get("dst", "")
            x2 = lane_x.get(dst, mid)
            classes = "arrow cm"
            j = recv_rows.get(rec["seq"])
            if j is not None:
                y2 = ys[j]
            else:  # never received: lost in the fabric
                x2 = (x1 + x2) / 2 if x1 != x2 else x1 + 30
                y2 = y + 6
                classes += " lost"
            if y2 <= y:
                y2 = y + 3
            label = str(data.get("msg", "?"))
            if (data.get("attempt") or 1) > 1:
                label += f" #{data['attempt']}"
            arrows.append(Arrow(rec["seq"], kind, x1, y, x2, y2, label, title_of(rec),
                                classes + (" thin" if thin else ""), item.t, i in in_band))
        elif kind == "wire":
            src, dst = data.get("src_host") or "", data.get("dst_host") or ""
            x1 = lane_x.get(src, mid)
            classes = "arrow wire"
            if rec["seq"] in dropped:
                x2, classes = mid, classes + " dropped"
            elif dst:
                x2 = lane_x.get(dst, mid)
            else:
                x2, classes = mid, classes + " broadcast"
            if x1 == x2:
                x2 = x1 + 24
            arrows.append(Arrow(rec["seq"], kind, x1, y, x2, y + 5,
                                frame_label(data.get("frame") or {}), title_of(rec),
                                classes + (" thin" if thin else ""), item.t, i in in_band))
        elif kind == "cm_recv":
            continue  # an arrow's end
        else:
            label, category = mark_label(rec)
            if len(item.recs) > 1:
                label = f"{bulk_label(rec)} ×{len(item.recs)}"
            if kind == "fault" and data.get("src") in lane_x and data.get("dst") in lane_x:
                # a model fabric fault: between the hosts, where the packet was
                x = (lane_x[data["src"]] + lane_x[data["dst"]]) / 2
            elif host in lane_x:
                x = lane_x[host]
            else:
                x = mid
            title = title_of(rec) if len(item.recs) == 1 else (
                f"{len(item.recs)} records, #{rec['seq']}..#{item.recs[-1]['seq']}\n"
                + title_of(rec))
            marks.append(Mark([r["seq"] for r in item.recs], kind, host, x, y, label, title,
                              f"mark {category}", item.t, i in in_band))

    height = max((ys[-1] if ys else TOP) + 40, max((g.y2 for g in gaps), default=0) + 30)
    highlights = []
    for seq, text in (highlight or {}).items():
        if seq is None or seq not in row_of_seq:
            highlights.append((height - 14, text))
        else:
            highlights.append((ys[row_of_seq[seq]], text))
    width = (lanes[-1].x if lanes else LEFT) + LANE_W
    messages = sum(1 for r in records if r["kind"] in ARROW_KINDS)
    return Ladder(lanes, arrows, marks, gaps, ticks, width, height, messages, len(records),
                  highlights)


def _recv_key(rec: dict, sender: str, receiver: str) -> tuple:
    data = rec.get("data") or {}
    return (sender, receiver, data.get("msg"), data.get("local_comm_id"),
            data.get("remote_comm_id"), data.get("src_ep"), data.get("dst_ep"))


def _match_recvs(items: list[_Item]) -> dict[int, int]:
    """cm_send seq -> row of the cm_recv that received it (first come, first matched)."""
    pending: dict[tuple, list[int]] = {}
    out: dict[int, int] = {}
    for i, item in enumerate(items):
        rec = item.recs[0]
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


_FRAME_KEY = ("src", "dst", "len", "psn", "cm", "opcode", "rdmap_opcode", "seq")


def _dropped_wires(records: list[dict]) -> set[int]:
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
        left = bisect.bisect_left(times, t) - 1
        right = left + 1
        while left >= 0 or right < len(items):  # outward from t, nearest first
            dl = t - times[left] if left >= 0 else None
            dr = times[right] - t if right < len(items) else None
            k = left if dr is None or (dl is not None and dl <= dr) else right
            if abs(times[k] - t) > DROP_MATCH_NS:
                break
            w = items[k]
            if w["seq"] not in out and _same_frame(frame, w["data"]["frame"]):
                out.add(w["seq"])
                if items is not wires:  # matched: out of its bucket
                    del times[k], items[k]
                break
            if k == left:
                left -= 1
            else:
                right += 1
    return out
