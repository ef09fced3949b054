"""A scenario's history as a ladder diagram: the layout numbers only (lanes, rows, arrows,
marks, compressed quiet stretches), pure Python. The HTML report (rdmalab.report.html) draws
them as SVG; the words on them are rdmalab.report.ladder.labels', the arrows' ends
rdmalab.report.ladder.pairs'.

Hosts (and the fault switch, when the history has one) are vertical lanes, time runs down.
Arrows: exactly one per `cm_send` record (the model's CM messages) and per `wire` record (a
frame the switch or bridge received on a device lab), nothing else is an arrow. Everything
else worth seeing is a mark beside its lane: CM events, async events, completions, QP and cm_id
state changes, faults where they acted (the switch's drop/delay/duplicate/corrupt at the switch
lane, a model fabric fault between the two hosts), and a workload's steps, unit states, I/O
errors and resumptions and read-back (its once-a-second I/O progress is not drawn).

Rows are ordinal (one per drawn record, so a burst at one instant stays readable) with a little
extra room for elapsed time; a stretch of at least QUIET_NS between two notable records (see
_notable) is compressed into a band of thin rows, labelled with its length and what happened in
it ("94.3 s: 14 DREQ retries")."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from ...faults.records import SWITCH, wire_action
from .labels import bulk_label, format_t, frame_label, mark_label, quiet_label, title_of
from .pairs import dropped_wires, match_recvs

QUIET_NS = 1_000_000_000   # a stretch this long between notable records is compressed
ROW = 16                   # px per row
THIN_ROW = 4               # px per row inside a compressed stretch
GAP_MIN_H = 30             # px of a compressed stretch, at least
TOP = 44                   # room for the lane names
LANE_W = 190               # px between lanes
LEFT = 80                  # room for the time axis
BULK = 4                   # a run of more post/wc records than this is summarised

ARROW_KINDS = ("cm_send", "wire")
SWITCH_HOSTS = ("switch", "bridge")
# Plumbing of the event channels: in every history, seen through the event it carries.
HIDDEN = {"cm_event_read", "cm_event_dispatched", "cm_event_ack", "async_event_read",
          "async_event_ack", "event_dispatched", "handler_begin", "handler_end",
          "cm_handler_begin", "cm_handler_end", "lab_start", "fabric_options", "cm_create",
          "cm_retry"}  # (a retry's message arrow says #attempt)
# A workload's io record of this phase comes once a second (rdmalab.workloads.records): not
# drawn; its "errors" and "resumed" phases are.
IO_PROGRESS = ("io", "progress")
# Traffic: what a quiet stretch may hold (retries, frames, the switch acting on them).
TRAFFIC = {"cm_send", "cm_recv", "cm_retry", "cm_unexpected", "cm_duplicate", "cm_stale",
           "retransmit", "wire", "switch_watch", "switch_drop", "switch_delay",
           "switch_duplicate", "switch_corrupt", "switch_reorder", "switch_release",
           "reorder_release", "cm_timewait"}
# Marks a loop repeats: a long run of them is summarised (_items).
BULKABLE = {"post", "wc", "retransmit", "switch_watch", "switch_drop", "switch_delay",
            "switch_duplicate", "switch_corrupt", "switch_reorder", "switch_release"}


def _drawn(rec: dict) -> bool:
    """Whether a record has a row: not the event channels' plumbing, not I/O progress."""
    kind = rec["kind"]
    if kind in HIDDEN:
        return False
    return (kind, (rec.get("data") or {}).get("phase")) != IO_PROGRESS


def shown(rec: dict) -> dict:
    """A record as the ladder sorts it: the fault switch's actions on frames (its lane's wire
    action records, rdmalab.faults.records) as switch_<action> and switch_release, so that they
    bulk and sit in quiet stretches as the frames they act on do; any other record as it is."""
    if rec.get("host") != SWITCH or rec["kind"] not in ("fault", "reorder_release"):
        return rec
    action = wire_action(rec) if rec["kind"] == "fault" else "release"
    return dict(rec, kind=f"switch_{action}") if action else rec


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


# -- rows

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
        elif rec["kind"] == "wire_rule" and rec.get("object") == SWITCH:
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
        if not _drawn(rec):
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


def _quiet_stretches(items: list[_Item]) -> list[tuple[int, int]]:
    """(first notable row before, first notable row after) of each quiet stretch: consecutive
    notable rows at least QUIET_NS apart (and the traffic after the last notable row)."""
    notable = [i for i, it in enumerate(items) if it.notable]
    bounds = list(zip(notable, notable[1:]))
    if notable and notable[-1] < len(items) - 1:
        bounds.append((notable[-1], len(items)))  # trailing traffic
    out = []
    for a, b in bounds:
        t_end = items[b].t if b < len(items) else items[-1].t
        if t_end - items[a].t >= QUIET_NS:
            out.append((a, b))
    return out


def _rows(items: list[_Item], stretches: list[tuple[int, int]], t0: int
          ) -> tuple[list[float], list[Gap], list[Tick]]:
    """Each row's y, the compressed stretches and the time axis: one row per item, a little
    lower the longer since the last; a quiet stretch is a band of thin rows after its first."""
    ys: list[float] = [0.0] * len(items)
    gaps: list[Gap] = []
    ticks: list[Tick] = []
    gap_after = {a: (a, b) for a, b in stretches}
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
            gaps.append(Gap(y1, y2, quiet_label(t1 - item.t, [it.recs for it in items[a + 1:b]]),
                            item.t, t1))
            y, i, after_gap = y2, b, True
            continue
        i += 1
    return ys, gaps, ticks


# -- arrows and marks

@dataclasses.dataclass
class _Canvas:
    """What drawing one row needs to know of the others."""
    lane_x: dict          # lane name -> x
    mid: float            # the switch's lane, else the middle: where lost and dropped arrows end
    ys: list              # row -> y
    recv_rows: dict       # cm_send seq -> the row of its cm_recv
    dropped: set          # wire seqs a switch dropped
    in_band: set          # rows inside a compressed stretch
    thin: str             # " thin" where arrows are too many to draw wide, else ""


def _draw(records: list[dict], items: list[_Item], ys: list[float], lanes: list[Lane],
          stretches: list[tuple[int, int]]) -> tuple[list[Arrow], list[Mark]]:
    """An arrow per cm_send (to its cm_recv) and per wire record (src host to dst host, the
    switch when dropped); a mark per other row."""
    switch = next((lane for lane in lanes if lane.switch), None)
    c = _Canvas(
        lane_x={lane.name: lane.x for lane in lanes},
        mid=(switch.x if switch else
             (sum(lane.x for lane in lanes) / len(lanes) if lanes else LEFT + 40)),
        ys=ys, recv_rows=match_recvs([it.recs[0] for it in items]),
        dropped=dropped_wires(records),
        in_band={k for a, b in stretches for k in range(a + 1, b)},
        thin=" thin" if sum(1 for r in records if r["kind"] in ARROW_KINDS) > 2000 else "")
    arrows: list[Arrow] = []
    marks: list[Mark] = []
    for i, item in enumerate(items):
        if item.kind == "cm_send":
            arrows.append(_cm_arrow(c, i, item))
        elif item.kind == "wire":
            arrows.append(_wire_arrow(c, i, item))
        elif item.kind != "cm_recv":  # a cm_recv is an arrow's end
            marks.append(_mark(c, i, item))
    return arrows, marks


def _cm_arrow(c: _Canvas, i: int, item: _Item) -> Arrow:
    """A CM message from its sender down to the row where it was received; one never received
    (lost in the fabric) a short arrow ending halfway."""
    rec = item.recs[0]
    data, y = rec.get("data") or {}, c.ys[i]
    x1 = c.lane_x.get(rec.get("host") or "", c.mid)
    x2 = c.lane_x.get(data.get("dst", ""), c.mid)
    classes = "arrow cm"
    j = c.recv_rows.get(rec["seq"])
    if j is not None:
        y2 = c.ys[j]
    else:
        x2 = (x1 + x2) / 2 if x1 != x2 else x1 + 30
        y2 = y + 6
        classes += " lost"
    if y2 <= y:
        y2 = y + 3
    label = str(data.get("msg", "?"))
    if (data.get("attempt") or 1) > 1:
        label += f" #{data['attempt']}"
    return Arrow(rec["seq"], "cm_send", x1, y, x2, y2, label, title_of(rec), classes + c.thin,
                 item.t, i in c.in_band)


def _wire_arrow(c: _Canvas, i: int, item: _Item) -> Arrow:
    """A frame from its src host to its dst host (the switch when dropped or broadcast)."""
    rec = item.recs[0]
    data, y = rec.get("data") or {}, c.ys[i]
    src, dst = data.get("src_host") or "", data.get("dst_host") or ""
    x1 = c.lane_x.get(src, c.mid)
    classes = "arrow wire"
    if rec["seq"] in c.dropped:
        x2, classes = c.mid, classes + " dropped"
    elif dst:
        x2 = c.lane_x.get(dst, c.mid)
    else:
        x2, classes = c.mid, classes + " broadcast"
    if x1 == x2:
        x2 = x1 + 24
    return Arrow(rec["seq"], "wire", x1, y, x2, y + 5, frame_label(data.get("frame") or {}),
                 title_of(rec), classes + c.thin, item.t, i in c.in_band)


def _mark(c: _Canvas, i: int, item: _Item) -> Mark:
    """A row's mark beside its host's lane (a summarised run: its label and count)."""
    rec = item.recs[0]
    kind, data, host = rec["kind"], rec.get("data") or {}, rec.get("host") or ""
    label, category = mark_label(rec)
    if len(item.recs) > 1:
        label = f"{bulk_label(rec)} ×{len(item.recs)}"
    if kind == "fault" and data.get("src") in c.lane_x and data.get("dst") in c.lane_x:
        # a model fabric fault: between the hosts, where the packet was
        x = (c.lane_x[data["src"]] + c.lane_x[data["dst"]]) / 2
    else:
        x = c.lane_x.get(host, c.mid)
    title = title_of(rec) if len(item.recs) == 1 else (
        f"{len(item.recs)} records, #{rec['seq']}..#{item.recs[-1]['seq']}\n" + title_of(rec))
    return Mark([r["seq"] for r in item.recs], kind, host, x, c.ys[i], label, title,
                f"mark {category}", item.t, i in c.in_band)


# -- the ladder

def _highlights(items: list[_Item], ys: list[float], height: float,
                highlight: Optional[dict]) -> list[tuple[float, str]]:
    """(y, text) of each highlighted record's row; the ladder's end for None or a record
    not drawn."""
    row_of_seq = {rec["seq"]: i for i, item in enumerate(items) for rec in item.recs}
    out = []
    for seq, text in (highlight or {}).items():
        if seq is None or seq not in row_of_seq:
            out.append((height - 14, text))
        else:
            out.append((ys[row_of_seq[seq]], text))
    return out


def layout(records: list[dict], highlight: Optional[dict] = None) -> Ladder:
    """The ladder of a history. highlight: {seq or None: text}; a seq marks that record's row
    as a first difference, None marks the end of the ladder (that side had nothing more)."""
    records = sorted((shown(r) for r in records), key=lambda r: r["seq"])
    lanes = _lanes(records)
    items = _items(records)
    t0 = min((int(r.get("t_ns") or 0) for r in records), default=0)
    stretches = _quiet_stretches(items)
    ys, gaps, ticks = _rows(items, stretches, t0)
    arrows, marks = _draw(records, items, ys, lanes, stretches)
    height = max((ys[-1] if ys else TOP) + 40, max((g.y2 for g in gaps), default=0) + 30)
    width = (lanes[-1].x if lanes else LEFT) + LANE_W
    messages = sum(1 for r in records if r["kind"] in ARROW_KINDS)
    return Ladder(lanes, arrows, marks, gaps, ticks, width, height, messages, len(records),
                  _highlights(items, ys, height, highlight))
