"""The plugin's terminal summary: each device column compared with the model column of its
personality (rdmalab.findings.agreement), what the machine pools left on their hosts, where the
evidence bundles are when no directory was asked for, and how to replay each failure."""

from __future__ import annotations

import shutil

import pytest

from ..findings import agreement
from ..report import junit as report
from .labkinds import LAB_KINDS
from .pools import leaks
from .session import FAILURES, RESULTS, SETTINGS, registry


class ResultCollector:
    """Keeps each test's final outcome per column (its teardown report's properties; with
    pytest-xdist these arrive from the workers) for the agreement summary."""

    def __init__(self, config):
        self.config = config

    def pytest_runtest_logreport(self, report):
        if report.when != "teardown":
            return
        props = dict(report.user_properties)
        if "column" not in props:
            return
        self.config.stash[RESULTS].append(result_of(report.nodeid, props))


def result_of(nodeid: str, props: dict) -> report.Result:
    """A report.Result (the table's row, column, outcome) from a test's properties."""
    scenario, column = report.split_nodeid(nodeid, props)
    message = "[XPASS(strict)]" if props.get("xpassed") else ""
    return report.Result(scenario, column, str(props.get("outcome", "")), message,
                         {k: str(v) for k, v in props.items()})


def pytest_configure(config):
    config.stash[FAILURES] = []
    config.stash[RESULTS] = []
    config.pluginmanager.register(ResultCollector(config), "rdmalab-results")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    results = config.stash.get(RESULTS, [])
    if any(_device_column(r) for r in results):
        terminalreporter.section("rdmalab: model vs device")
        try:
            reg = registry(config)
        except pytest.UsageError:
            reg = None
        for line in agreement.lines(results, reg):
            terminalreporter.write_line(line)
    left = leaks()
    if left:
        terminalreporter.section("rdmalab: left on the hosts after the run (health check)")
        for leak in left:
            terminalreporter.write_line(leak)
    settings = config.stash.get(SETTINGS, None)
    if settings is not None and settings.evidence_temp:
        if exitstatus == 0:
            shutil.rmtree(settings.evidence_dir, ignore_errors=True)
        else:
            terminalreporter.write_line(f"rdmalab: evidence bundles (no --history-dir or "
                                        f"--evidence-dir given): {settings.evidence_dir}")
    failures = config.stash.get(FAILURES, [])
    if not failures:
        return
    terminalreporter.section("rdmalab: replay failures")
    for nodeid, command in dict(failures).items():
        terminalreporter.write_line(f"{nodeid}\n    {command}")


def _device_column(result: report.Result) -> bool:
    kind = LAB_KINDS.get(result.properties.get("backend"))
    return kind is not None and kind.device
