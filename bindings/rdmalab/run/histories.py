"""What a test's labs leave behind: at its end each lab is shut down and its history written
(--history-dir, one JSON-lines file per lab, named after the test id); a device lab's evidence
bundle (rdmalab.report.evidence: capture, rdma res, kernel logs) is begun with the lab and
closed after its shutdown, and the kernel-log splats it found are kept for the test's outcome."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Optional

import pytest

from ..errors import raise_parked
from ..protocol import Lab
from ..report import evidence
from ..report.junit import history_name
from .labspec import LabSpec
from .session import EVIDENCE, FILES, SPLATS, Settings, registry


def start_evidence(item, lab, spec: LabSpec, settings: Settings,
                   collectors: list) -> Optional[evidence.Collector]:
    """An evidence.Collector begun for a device lab when bundles are wanted, else None. A
    test's second lab renames the first's bundle <stem>.1 (as its history is named)."""
    if not spec.kind.device:
        return None
    if not settings.evidence_dir:  # the kernel-log oracle needs a bundle to put splats in
        settings.evidence_dir = tempfile.mkdtemp(prefix="rdmalab-evidence-")
        settings.evidence_temp = True
    stem = history_name(item.nodeid)
    n = len(collectors) + 1
    if n == 2 and collectors[0] is not None:
        first = collectors[0]
        moved = first.dir.with_name(f"{stem}.1")
        shutil.rmtree(moved, ignore_errors=True)
        first.dir.rename(moved)
        first.dir = moved
    name = stem if n == 1 else f"{stem}.{n}"
    try:
        reg = registry(item.config)
    except pytest.UsageError:
        reg = None
    directory = os.path.join(settings.evidence_dir, name)
    shutil.rmtree(directory, ignore_errors=True)  # a rerun's bundle replaces the last one's
    c = evidence.Collector(lab, directory, scenario=item.nodeid, column=spec.id, registry=reg)
    c.begin()
    return c


def finish_labs(item, labs: list[Lab], settings: Settings) -> None:
    """Every lab of the test shut down, its history and evidence written (their paths kept in
    the test's FILES, its splats in SPLATS); then a parked error fails the test."""
    collectors = item.stash.get(EVIDENCE, [])
    files = item.stash.setdefault(FILES, {"history": [], "evidence": []})
    splats = item.stash.setdefault(SPLATS, [])
    try:
        for i, lab in enumerate(labs):
            path = None
            if settings.history_dir:
                suffix = f".{i + 1}" if len(labs) > 1 else ""
                path = os.path.join(settings.history_dir,
                                    history_name(item.nodeid) + suffix + ".jsonl")
            c = collectors[i] if i < len(collectors) else None
            if c is None:
                _write_history(lab, path, files)
                lab.shutdown()
            else:
                _finish_with_evidence(lab, c, path, files, splats)
    finally:
        raise_parked()  # a handler or hook that raised fails the test here at the latest


def _finish_with_evidence(lab: Lab, c: evidence.Collector, path: Optional[str], files: dict,
                          splats: list[dict]) -> None:
    """A device lab with evidence: its history is written once the shutdown's kernel log and
    the capture are in it; the splats the bundle found are kept, each naming its bundle, even
    when the shutdown raised."""
    try:
        c.scenario_end()
        lab.shutdown()
    finally:
        splats += [dict(s, evidence=str(c.dir)) for s in c.finish()]
        _write_history(lab, path, files)
        c.write_history(path)
        files["evidence"].append(str(c.dir))


def _write_history(lab: Lab, path: Optional[str], files: dict) -> None:
    if path:
        lab.write_history(path)
        files["history"].append(path)
