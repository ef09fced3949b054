"""What the pytest plugin (rdmalab.run.pytest_plugin) keeps for a run and for each test: the
run's Settings, its findings registry, and the stash keys its modules share."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional

import pytest

from ..findings import registry as findings

if TYPE_CHECKING:
    from .labspec import LabSpec

# The run's (config.stash)
SETTINGS = pytest.StashKey["Settings"]()
FAILURES = pytest.StashKey[list]()  # (nodeid, replay command) of each failed phase
RESULTS = pytest.StashKey[list]()   # report.Result per test and column, for the agreement
REGISTRY = pytest.StashKey[findings.Registry]()

# A test's (item.stash)
PHASES = pytest.StashKey[dict]()    # when -> outcome, and what overrode it (host_lost, ...)
LABS = pytest.StashKey[list]()      # the labs a test's fixtures made
ENTRY = pytest.StashKey[tuple]()    # (registry entry, lab key) of a @finding that applies here
FIXED = pytest.StashKey[tuple]()    # (property, id): an entry this lab's kernel has fixed, or
                                    # is older than
EVIDENCE = pytest.StashKey[list]()  # evidence.Collector per lab of a test (None: no device)
SPLATS = pytest.StashKey[list]()    # the kernel-log splats its labs' evidence found
FILES = pytest.StashKey[dict]()     # {"history": [paths], "evidence": [dirs]} a test wrote


@dataclasses.dataclass
class Settings:
    specs: list[LabSpec]
    seed: int
    history_dir: Optional[str]
    timeout_s: float
    evidence_dir: Optional[str] = None
    evidence_temp: bool = False  # made for this session: the oracle runs without a bundle asked


def spec_of(item) -> Optional[LabSpec]:
    """The lab a test runs on, None if it uses no lab fixture."""
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("lab_spec") if callspec else None


def registry(config) -> findings.Registry:
    """The run's findings registry (--findings-registry, else the package's), loaded once."""
    if REGISTRY not in config.stash:
        path = config.getoption("findings_registry", None)
        try:
            config.stash[REGISTRY] = findings.load(path) if path else findings.default()
        except findings.FindingsError as e:
            raise pytest.UsageError(f"the findings registry is malformed:\n{e}") from e
    return config.stash[REGISTRY]
