"""A scenario's history as a ladder diagram (docs/DESIGN.md: the one place that turns a history
into a layout), pure Python; the HTML report (rdmalab.report.html) draws it as SVG.

Its rooms: diagram (lanes, rows, compressed quiet stretches, arrows and marks: layout()),
labels (what the arrows, marks, titles and time axis say), pairs (where an arrow ends: a
cm_send's cm_recv, a dropped frame's switch), history (a history file's records, and the first
user-visible difference between a model's history and its device's: first_difference())."""

from __future__ import annotations

from .diagram import ROW, TOP, Arrow, Gap, Ladder, Lane, Mark, Tick, layout
from .history import Difference, HistoryError, first_difference, read_history
from .labels import frame_label

__all__ = [
    "Arrow", "Difference", "Gap", "HistoryError", "Ladder", "Lane", "Mark", "ROW", "TOP", "Tick",
    "first_difference", "frame_label", "layout", "read_history",
]
