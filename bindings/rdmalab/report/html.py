"""OUT/report.html: one self-contained page (inline CSS, SVG and script, nothing fetched) built
from a run's files: the result matrix of OUT/junit.xml and, per scenario, a ladder diagram of
each lab column's history (OUT/history/*.jsonl), each device beside the model personality that
predicts it (agreement.twin) with the first user-visible difference marked.

The page's DOM is a contract (the browser test reads it): td.cell[data-scenario][data-column]
[data-outcome] in table#matrix; section.scenario[data-scenario] > figure.ladder[data-column]
[data-history][data-messages] > svg with one .arrow per cm_send/wire record; .gap for a
compressed stretch; .first-difference; a.evidence; body[data-rendered] set on load."""

from __future__ import annotations

import dataclasses
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Optional

from . import ladder, junit as report
from ..findings import agreement
from ..findings.agreement import twin

TEMPLATE = "report.html.j2"


class ReportError(Exception):
    """Input the report cannot be built from; the message names the file."""


@dataclasses.dataclass
class Column:
    name: str
    backend: str
    device: str
    kernel: str
    provider: str


@dataclasses.dataclass
class Figure:
    column: str
    history: str                 # relative to OUT
    ladder: Optional[ladder.Ladder]
    error: str = ""
    evidence: list = dataclasses.field(default_factory=list)  # (name, href)
    records: list = dataclasses.field(default_factory=list)
    highlight: dict = dataclasses.field(default_factory=dict)  # seq|None -> text
    differs: set = dataclasses.field(default_factory=set)     # seqs of differing outcomes
    twin: str = ""               # the column it is compared with
    agree: Optional[bool] = None
    difference: str = ""         # the first difference, in words
    outcome: str = ""            # the result's


@dataclasses.dataclass
class Scenario:
    name: str
    anchor: str
    figures: list


def cell_outcome(r: report.Result) -> str:
    if r.outcome == "passed" and r.properties.get("provider_fact"):
        return "provider-fact"
    return r.outcome


def _stem(r: report.Result) -> str:
    return report.history_name(f"{r.classname}.{r.name}" if r.classname else r.name)


def history_files(out: Path, r: report.Result) -> list[str]:
    """The result's history files relative to out: the `history` property, else the files
    the plugin names after the test (<stem>.jsonl, or <stem>.1.jsonl ... for several labs)."""
    listed = r.properties.get("history")
    if listed:
        return [p.strip() for p in listed.split(",") if p.strip()]
    stem = _stem(r)
    hist = out / "history"
    if (hist / f"{stem}.jsonl").exists():
        return [f"history/{stem}.jsonl"]
    several = sorted((p for p in hist.glob(f"{glob_escape(stem)}.*.jsonl")
                      if re.fullmatch(re.escape(stem) + r"\.\d+\.jsonl", p.name)),
                     key=lambda p: int(p.name[len(stem) + 1:-6]))
    return [f"history/{p.name}" for p in several]


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)


def evidence_links(out: Path, r: report.Result, stem: str) -> list[tuple[str, str]]:
    rel = r.properties.get("evidence") or f"evidence/{stem}"
    folder = out / rel
    if not folder.is_dir():
        return []
    return [(p.name, f"{rel}/{p.name}") for p in sorted(folder.iterdir()) if p.is_file()]


def columns_of(results: list[report.Result]) -> list[Column]:
    first: dict[str, report.Result] = {}
    for r in results:
        first.setdefault(r.column, r)
    cols = []
    for name in sorted(first):
        props = first[name].properties
        cols.append(Column(name, props.get("backend", ""), props.get("device", ""),
                           props.get("kernel", ""),
                           props.get("provider") or props.get("personality", "")))
    return cols


def _order(cols: list[Column]) -> list[str]:
    """Columns with each device right after the model personality that predicts it."""
    model_of = {c.provider: c.name for c in cols if c.backend == "model"}
    order: list[str] = []
    for c in cols:
        if c.backend in ("", "model"):
            continue
        model = model_of.get(twin(c.provider) or "")
        for name in ((model,) if model else ()) + (c.name,):
            if name not in order:
                order.append(name)
    return order + [c.name for c in cols if c.name not in order]


def twin_column(col: Column, cols: list[Column]) -> Optional[str]:
    if col.backend in ("", "model"):
        return None
    personality = twin(col.provider)
    return next((c.name for c in cols if c.backend == "model" and c.provider == personality),
                None)


def read_results(junit: Path) -> list[report.Result]:
    if not junit.exists():
        raise ReportError(f"{junit}: no such file (the run's JUnit XML)")
    try:
        return report.read_junit(str(junit))
    except ET.ParseError as e:
        raise ReportError(f"{junit}: not a JUnit XML file ({e})") from None
    except OSError as e:
        raise ReportError(f"{junit}: cannot read ({e.strerror or e})") from None


def collect(out: Path, junit: Path) -> tuple[list, list[Column], list[Scenario], list[str]]:
    """(results, columns, scenarios, problems): problems name each history file that could not
    be read (its ladder shows the problem instead)."""
    results = read_results(junit)
    cols = columns_of(results)
    by_name = {c.name: c for c in cols}
    order = _order(cols)
    problems: list[str] = []
    scenarios: dict[str, dict[str, list[Figure]]] = {}
    for r in results:
        stem = _stem(r)
        figures = scenarios.setdefault(r.scenario, {}).setdefault(r.column, [])
        for rel in history_files(out, r):
            fig = Figure(r.column, rel, None, evidence=evidence_links(out, r, stem),
                         outcome=r.outcome)
            try:
                fig.records = ladder.read_history(str(out / rel), rel)
            except ladder.HistoryError as e:
                fig.error = str(e)
                problems.append(str(e))
            figures.append(fig)
    out_scenarios = []
    for name, by_col in scenarios.items():
        for col_name, figs in by_col.items():
            twin = twin_column(by_name[col_name], cols)
            for i, fig in enumerate(figs):
                partners = by_col.get(twin or "", [])
                # A skipped side stopped early on purpose: nothing to compare.
                if (i < len(partners) and fig.records and partners[i].records
                        and "skipped" not in (fig.outcome, partners[i].outcome)):
                    _mark_difference(partners[i], fig, twin, col_name)
        figures = [f for c in order for f in by_col.get(c, [])]
        for fig in figures:
            if not fig.error:
                fig.ladder = ladder.layout(fig.records, fig.highlight)
            fig.records = []  # drawn: free the memory
        anchor = "s-" + re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-")
        out_scenarios.append(Scenario(name, anchor, figures))
    return results, cols, out_scenarios, problems


def _mark_difference(model: Figure, device: Figure, model_col: str, device_col: str) -> None:
    diff = ladder.first_difference(model.records, device.records)
    device.twin = model_col
    device.agree = diff is None
    if diff is None:
        return
    text = diff.describe(model_col, device_col)
    device.difference = text
    if not model.difference:
        model.difference, model.twin, model.agree = text, device_col, False
    model.highlight[diff.model_seq] = text
    device.highlight[diff.device_seq] = text
    model.differs.add(diff.model_seq)
    device.differs.add(diff.device_seq)


def render(out: Path, junit: Path) -> tuple[str, list[str]]:
    """(the page, problems)."""
    import jinja2  # deferred: optional; only the HTML page needs it, not the text report
    results, cols, scenarios, problems = collect(out, junit)
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("rdmalab.report", "templates"),
        autoescape=True, trim_blocks=True, lstrip_blocks=True,
        undefined=jinja2.StrictUndefined)
    cell = {(r.scenario, r.column): r for r in results}
    rows = list(dict.fromkeys(r.scenario for r in results))
    anchors = {s.name: s.anchor for s in scenarios}
    counts: dict[str, int] = {}
    for r in results:
        counts[cell_outcome(r)] = counts.get(cell_outcome(r), 0) + 1
    try:
        agreed = agreement.lines(results, report._registry(None)[0])
    except Exception as e:  # the page still shows the matrix
        agreed = [f"agreement not computed: {e}"]
    page = env.get_template(TEMPLATE).render(
        out=str(out), junit=os.path.relpath(junit, out), columns=cols, rows=rows, cell=cell,
        anchors=anchors, scenarios=scenarios, counts=counts, agreement=agreed,
        problems=problems, cell_outcome=cell_outcome, label=report.CELL,
        lanes_top=ladder.TOP)
    return page, problems


def write(out: Path, junit: Optional[Path] = None) -> tuple[Path, list[str]]:
    """Writes out/report.html; (its path, problems)."""
    out = Path(out)
    junit = Path(junit) if junit else out / "junit.xml"
    page, problems = render(out, junit)
    path = out / "report.html"
    path.write_text(page, encoding="utf-8")
    return path, problems
