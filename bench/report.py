"""One home for a benchmark figure and the table `make bench` prints.

A Figure is a measured value beside a reference measured in the same run (perftest on the same
rxe pair, the direct link beside the switch, rxe's wall time beside the model's); ratio is
value / reference. goal, when set, is the ratio the project aims at, and better says which way
is better ("higher": message rates; "lower": latencies, boot times)."""
from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Optional


@dataclasses.dataclass
class Figure:
    section: str          # traffic | model | labs | switch
    name: str             # what was measured, e.g. "SEND 64 B message rate"
    value: float
    unit: str             # "Mmsg/s", "us", "s", "cycles/s", "frames/s", "x"
    reference_name: str   # e.g. "ib_send_bw", "direct link", "rxe wall time"
    reference: Optional[float]  # None: the reference could not be measured (see note)
    better: str = "higher"  # higher | lower
    goal: Optional[float] = None  # the ratio aimed at: >= goal (higher) or <= goal (lower)
    note: str = ""        # backend, kernel, sizes, why a reference is missing

    @property
    def ratio(self) -> Optional[float]:
        if self.reference in (None, 0):
            return None
        return self.value / self.reference

    @property
    def meets_goal(self) -> Optional[bool]:
        r = self.ratio
        if self.goal is None or r is None:
            return None
        return r >= self.goal if self.better == "higher" else r <= self.goal

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["ratio"] = self.ratio
        d["meets_goal"] = self.meets_goal
        return d


def _num(v: Optional[float]) -> str:
    if v is None:
        return "-"
    if v == 0 or 0.01 <= abs(v) < 100000:
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return f"{v:.3g}"


def table(figures: list[Figure]) -> str:
    rows = [("section", "figure", "value", "reference", "ref value", "ratio", "goal", "")]
    for f in figures:
        goal = "" if f.goal is None else (">= " if f.better == "higher" else "<= ") + f"{f.goal:g}"
        verdict = {True: "ok", False: "MISSED", None: ""}[f.meets_goal]
        rows.append((f.section, f.name, f"{_num(f.value)} {f.unit}", f.reference_name,
                     "-" if f.reference is None else f"{_num(f.reference)} {f.unit}",
                     "-" if f.ratio is None else f"{f.ratio:.3f}", goal, verdict))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"  [{f.section}] {f.name}: {f.note}" for f in figures if f.note]
    return "\n".join(lines + (["", "notes:"] + notes if notes else []))


def write_json(figures: list[Figure], path: pathlib.Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([f.as_dict() for f in figures], indent=2) + "\n")
