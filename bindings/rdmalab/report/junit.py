"""The result table of a run, read from pytest's JUnit XML: one row per scenario, one column
per lab (backend-personality), each cell passed / FAILED / ERROR / skipped / finding, then the
skip reasons, the findings reproduced and provider facts asserted (from the findings registry,
rdmalab/findings/findings.toml), the agreement of each device with its model personality
(rdmalab.findings.agreement) and the failures with their replay commands."""

from __future__ import annotations

import dataclasses
import re
import xml.etree.ElementTree as ET
from pathlib import PurePosixPath
from typing import Optional

from ..findings import registry as findings


@dataclasses.dataclass
class Result:
    scenario: str
    column: str
    outcome: str  # passed, failed, error, skipped, finding (a device divergence, xfail),
    #               host_lost (a host stopped answering mid-scenario)
    message: str
    properties: dict
    classname: str = ""  # the JUnit testcase's, which name its history files
    name: str = ""
    detail: str = ""     # the failure's or skip's full text, when the JUnit file has it


def read_junit(path: str) -> list[Result]:
    results = []
    for case in ET.parse(path).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        outcome, message, detail = "passed", "", ""
        for tag, name in (("skipped", "skipped"), ("error", "error"), ("failure", "failed")):
            node = case.find(tag)
            if node is not None:
                outcome, message = name, node.get("message") or ""
                detail = (node.text or "").strip()
                if tag == "skipped" and node.get("type") == "pytest.xfail":
                    outcome = "finding"  # a known device divergence, reproduced
        if props.get("outcome") == "host_lost":
            outcome = "host_lost"
        scenario, column = split_name(case.get("classname", ""), case.get("name", ""), props)
        column = kernel_column(column, props)
        results.append(Result(scenario, column, outcome, message, props,
                              case.get("classname", ""), case.get("name", ""), detail))
    return results


def kernel_column(column: str, props: dict) -> str:
    """A device's column names its kernel ("vm-rxe" -> "vm-rxe@6.12.117+deb13"): results are
    keyed by lab, device and kernel. The model's column stays as it is."""
    kernel = props.get("kernel", "")
    if not kernel or props.get("backend") in (None, "model") or "@" in column:
        return column
    return f"{column}@{kernel.removesuffix('-amd64')}"


def split_name(classname: str, name: str, props: dict) -> tuple[str, str]:
    """("test_x.test_y[model-ib]", props) -> ("test_x::test_y", "model-ib")."""
    module = classname.rsplit(".", 1)[-1] if classname else ""
    base, _, params = name.partition("[")
    params = params.rstrip("]")
    column = "-"
    if "column" in props or ("backend" in props and "personality" in props):
        column = props.get("column") or f"{props['backend']}-{props['personality']}"
        rest = re.sub(r"(^|-)" + re.escape(column) + r"($|-)", "-", params).strip("-")
        params = rest
    row = f"{module}::{base}" if module else base
    return (f"{row}[{params}]" if params else row), column


def split_nodeid(nodeid: str, props: dict) -> tuple[str, str]:
    """split_name for a pytest node id: tests/s/test_x.py::test_y[model-ib] -> as the JUnit
    classname tests.s.test_x and name test_y[model-ib] give."""
    parts = nodeid.split("::")
    classname = parts[-2] if len(parts) > 2 else PurePosixPath(parts[0]).stem
    return split_name(classname, parts[-1], props)


def history_name(nodeid: str) -> str:
    """A file name for a test id (the history's and the evidence bundle's):
    tests/scenarios/test_x.py::test_y[model-ib] -> tests.scenarios.test_x.test_y-model-ib; a
    JUnit case's "classname.name" gives the same."""
    name = nodeid.replace(".py::", ".").replace("::", ".").replace("/", ".")
    name = name.replace("[", "-").replace("]", "")
    return re.sub(r"[^A-Za-z0-9_.,=+-]+", "_", name)


CELL = {"passed": "passed", "failed": "FAILED", "error": "ERROR", "skipped": "skipped",
        "finding": "finding", "host_lost": "HOST-LOST"}


def format_table(results: list[Result], replay: Optional[dict] = None, registry=None) -> str:
    """The table; registry: the findings registry (default: the package's)."""
    if not results:
        return "no test results\n"
    rows = list(dict.fromkeys(r.scenario for r in results))  # in the order they ran
    cols = sorted({r.column for r in results})
    cell = {(r.scenario, r.column): r for r in results}
    width0 = max(len("scenario"), *(len(r) for r in rows))
    widths = [max(len(c), 7) for c in cols]
    out = ["scenario".ljust(width0) + "  " + "  ".join(c.ljust(w) for c, w in zip(cols, widths))]
    out.append("-" * len(out[0]))
    for row in rows:
        cells = []
        for col, w in zip(cols, widths):
            r = cell.get((row, col))
            cells.append((CELL.get(r.outcome, r.outcome) if r else "").ljust(w))
        out.append(row.ljust(width0) + "  " + "  ".join(cells).rstrip())
    counts = {k: sum(1 for r in results if r.outcome == k) for k in CELL}
    out.append("")
    out.append(", ".join(f"{n} {k}" for k, n in counts.items() if n) or "nothing ran")
    skipped = [r for r in results if r.outcome == "skipped"]
    if skipped:
        out.append("\nskipped:")
        out += [f"  {r.scenario} [{r.column}]: {r.message}" for r in skipped]
    registry, registry_error = _registry(registry)
    out += _findings_section(results, registry)
    facts = [r for r in results if r.properties.get("provider_fact") and r.outcome == "passed"]
    if facts:
        out.append("\nprovider facts asserted (passed as the registry says):")
        out += [f"  {r.properties['provider_fact']} [{r.column}]: {r.scenario}" for r in facts]
    from ..findings import agreement  # deferred: the engine; the report imports without it
    agreed = agreement.lines(results, registry)
    if agreed:
        out.append("\nmodel vs device:")
        out += [f"  {line}" for line in agreed]
    if registry_error:
        out.append(f"\nthe findings registry could not be read: {registry_error}")
    bad = [r for r in results if r.outcome in ("failed", "error", "host_lost")]
    if bad:
        out.append("\nfailed:")
        for r in bad:
            first = r.message.splitlines()[0] if r.message else ""
            out.append(f"  {r.scenario} [{r.column}] seed {r.properties.get('seed', '?')}: {first}")
    return "\n".join(out) + "\n"


def _registry(registry):
    if registry is not None:
        return registry, ""
    try:
        return findings.default(), ""
    except findings.FindingsError as e:
        return None, str(e)


def _findings_section(results: list[Result], registry) -> list[str]:
    reproduced = [r for r in results if r.outcome == "finding"]
    if not reproduced:
        return []
    out = ["\nfindings (the device diverges from the scenario's assertion, as registered):"]
    for r in reproduced:
        entry_id = r.properties.get("finding", "")
        entry = registry.entries.get(entry_id) if registry is not None else None
        if entry is None:  # a JUnit file from before the registry, or an unknown id
            out.append(f"  {r.scenario} [{r.column}]: {r.message}")
            continue
        out.append(f"  {entry.id} [{r.column}] ({entry.kind}): {r.scenario}")
        out.append(f"      {entry.summary}")
        if entry.rule is not None:
            out.append(f"      rule: {entry.rule.citation}")
        if entry.sources:
            out.append(f"      source: {'; '.join(str(s) for s in entry.sources)}")
    return out


def failed(results: list[Result]) -> bool:
    return any(r.outcome in ("failed", "error", "host_lost") for r in results)
