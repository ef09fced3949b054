"""Model-vs-device agreement: for each device column of a run (vm:*, inventory:*) and the model
column of the personality that predicts its driver, which scenarios came out the same.

compared: the scenarios that ran (not skipped, no host lost) on both columns; agree: the same
outcome (the scenario's assertions held on both, or failed on both; a registered finding or
unclassified divergence reproduced is a failure of the assertion, an XPASS a pass). A
disagreement is explained when the device cell is an entry of the findings registry reproduced
there; any other is UNEXPLAINED.

Results are report.Result rows (from the JUnit XML, or from the pytest plugin's reports), with
the properties the plugin records: backend, provider (the device's driver; the personality on
the model), column, outcome, finding."""

from __future__ import annotations

import dataclasses
from typing import Optional

from .. import _core


def twin(driver: str) -> Optional[str]:
    """The model personality that predicts a kernel driver: its row in the engine's table of
    driver facts (core/common/driver_facts.cc), None where no personality copies it."""
    return _core.personality_of_driver(driver)


_HELD = "held"     # the scenario's assertions held
_BROKE = "broke"   # they did not (failed, error, a divergence reproduced)


def held(result) -> Optional[str]:
    """held / broke, or None where the scenario did not run to an outcome there."""
    outcome = result.outcome
    if outcome in ("skipped", "host_lost", ""):
        return None
    if outcome == "passed":
        return _HELD
    if outcome == "failed" and "XPASS" in (result.message or ""):
        return _HELD  # a registered divergence that did not happen: the device held
    return _BROKE


@dataclasses.dataclass
class Disagreement:
    scenario: str
    device: str            # held / broke
    model: str
    explained_by: str = ""  # a registry id
    kind: str = ""          # its kind

    def __str__(self) -> str:
        if self.explained_by:
            return f"{self.explained_by} ({self.kind or 'finding'})"
        what = ("device failed, model passed" if self.device == _BROKE
                else "device passed, model failed")
        return f"{self.scenario} (UNEXPLAINED: {what})"


@dataclasses.dataclass
class Agreement:
    provider: str
    column: str                   # the device's column, e.g. vm-rxe, inventory-mylab
    personality: Optional[str]    # the model personality that predicts it (twin)
    model_column: Optional[str]   # its column in this run, None when absent
    compared: int = 0
    agree: int = 0
    disagreements: list[Disagreement] = dataclasses.field(default_factory=list)

    @property
    def unexplained(self) -> list[Disagreement]:
        return [d for d in self.disagreements if not d.explained_by]

    def line(self) -> str:
        head = f"agreement {self.provider} ({self.column})"
        if self.personality is None:
            return (f"{head}: no model personality predicts {self.provider} (its row in "
                    "core/common/driver_facts.cc names none)")
        if self.model_column is None:
            return (f"{head}: no model column to compare with: add --lab "
                    f"model:{self.personality}")
        text = (f"{head} vs model:{self.personality}: {self.agree}/{self.compared} scenarios "
                "agree")
        if self.disagreements:
            text += (f"; {len(self.disagreements)} disagree: "
                     + ", ".join(str(d) for d in self.disagreements))
        return text


def _provider(result) -> str:
    props = result.properties
    return props.get("provider") or props.get("personality") or ""


def compare(results, registry=None) -> list[Agreement]:
    """One Agreement per device column of results, in column order."""
    columns: dict[str, dict] = {}
    for r in results:
        columns.setdefault(r.column, {})[r.scenario] = r
    model_columns = {_provider(next(iter(rows.values()))): col for col, rows in columns.items()
                     if next(iter(rows.values())).properties.get("backend") == "model"}
    out = []
    for col, rows in columns.items():
        first = next(iter(rows.values()))
        if first.properties.get("backend") in (None, "model"):
            continue
        provider = _provider(first)
        personality = twin(provider)
        model_col = model_columns.get(personality) if personality else None
        a = Agreement(provider, col, personality, model_col)
        if model_col is not None:
            _fill(a, rows, columns[model_col], registry)
        out.append(a)
    return out


def _fill(a: Agreement, device_rows: dict, model_rows: dict, registry) -> None:
    for scenario, dev in device_rows.items():
        model = model_rows.get(scenario)
        d, m = held(dev), (held(model) if model is not None else None)
        if d is None or m is None:
            continue
        a.compared += 1
        if d == m:
            a.agree += 1
            continue
        entry_id = dev.properties.get("finding", "") if dev.outcome == "finding" else ""
        kind = ""
        if entry_id and registry is not None and entry_id in registry.entries:
            kind = registry.entries[entry_id].kind
        a.disagreements.append(Disagreement(scenario, d, m, entry_id, kind))


def lines(results, registry=None) -> list[str]:
    return [a.line() for a in compare(results, registry)]
