"""A test's outcome on its column, as its reports say it: a FaultNotSupported is a skip naming the
fault; a host lost mid-scenario, or a kernel-log splat no registry entry expected (judged at
teardown, the labs' shutdown included), fails it whatever it asserted; a failure names its seed
and replay command. The teardown report carries the row's JUnit properties: backend,
personality, column, provider, device, kernel, seed, outcome, and where they apply finding /
provider_fact, finding_fixed / finding_before, xpassed, history and evidence (paths relative
to the run's directory), kernel_splat and kernel_splat_expected."""

from __future__ import annotations

import os
from typing import Optional

import pytest

from ..errors import FaultNotSupported
from .labspec import replay_command
from .session import ENTRY, FAILURES, FILES, FIXED, LABS, PHASES, SETTINGS, SPLATS, spec_of


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if call.excinfo is not None and call.excinfo.errisinstance(FaultNotSupported):
        # The backend lacks the fault the scenario needs: a skip naming it, not a failure.
        rep.outcome = "skipped"
        rep.longrepr = (str(item.path), item.location[1] or 0,
                        f"Skipped: {call.excinfo.value}")
    spec = spec_of(item)
    if spec is None:
        return
    seed = item.config.stash[SETTINGS].seed
    phases = item.stash.setdefault(PHASES, {})
    _judge_lost_hosts(item, call, rep, phases)
    splats = item.stash.get(SPLATS, [])
    if rep.when == "teardown":
        _judge_splats(call, rep, phases, splats)
    phases[rep.when] = rep.outcome
    if rep.when == "call" and hasattr(rep, "wasxfail"):
        phases["xfail"] = "finding" if rep.skipped else "xpassed"
    if rep.failed:
        text = f"seed {seed} on {spec.option}\nreplay: {replay_command(item, spec, seed)}"
        rep.sections.append(("rdmalab", text))
        item.config.stash[FAILURES].append((item.nodeid, replay_command(item, spec, seed)))
    if rep.when == "teardown":
        item.user_properties += _row_properties(item, spec, seed, phases, splats)
        rep.user_properties = list(item.user_properties)


def _judge_lost_hosts(item, call, rep, phases: dict) -> None:
    """A host that died mid-scenario: the outcome says which and when, whatever the
    scenario's own error was (an EOFError from a dead agent tells nothing)."""
    lost = lost_hosts(item)
    if not lost or rep.when not in ("call", "teardown") or phases.get("host_lost"):
        return
    rep.outcome = "failed"
    text = "; ".join(f"host {h} ({i.get('machine')}) lost at t={i.get('at_ns', 0) / 1e9:.3f} s:"
                     f" {i.get('error')} ({i.get('records_kept')} of its records kept)"
                     for h, i in lost.items())
    if call.excinfo is not None:
        rep.sections.append(("rdmalab: the scenario's own error", call.excinfo.exconly()))
    rep.longrepr = f"HostLost: {text}"
    phases["host_lost"] = text


def _judge_splats(call, rep, phases: dict, splats: list[dict]) -> None:
    """A kernel splat fails the scenario whatever it asserted: its lab's shutdown is in the
    window, so it is judged here, after the labs are gone."""
    failure = splat_failure(splats)
    if not failure or phases.get("host_lost"):
        return
    rep.outcome = "failed"
    if call.excinfo is not None:
        rep.sections.append(("rdmalab: the teardown's own error", call.excinfo.exconly()))
    rep.longrepr = failure + "\n" + "\n".join(
        f"  {s['host']}: {s['kind']}: {s['first_line']}"
        + (f" (expected by {s['expected_by']})" if s.get("expected_by") else "")
        for s in splats)
    phases["kernel_splat"] = failure


def _row_properties(item, spec, seed: int, phases: dict, splats: list[dict]) -> list[tuple]:
    """The JUnit properties of the test's row in the result table."""
    try:
        device = spec.caps().name
    except Exception as e:  # the table still gets a row
        device = f"? ({e})"
    try:
        provider = spec.caps().personality
        kernel = spec.caps().kernel_release
    except Exception:
        provider = kernel = ""
    props = [("backend", spec.backend), ("personality", spec.personality),
             ("column", spec.id), ("provider", provider), ("device", device),
             ("kernel", kernel), ("seed", seed), ("outcome", final_outcome(phases))]
    if ENTRY in item.stash:
        entry = item.stash[ENTRY][0]
        props.append(("finding" if entry.xfails else "provider_fact", entry.id))
    if FIXED in item.stash:
        props.append(item.stash[FIXED])
    if phases.get("xfail") == "xpassed":
        props.append(("xpassed", "true"))
    return props + _file_properties(item) + _splat_properties(splats)


def _file_properties(item) -> list[tuple]:
    settings = item.config.stash[SETTINGS]
    files = item.stash.get(FILES, {})
    props = []
    if files.get("history"):
        props.append(("history", _relative(files["history"], settings.history_dir)))
    if files.get("evidence"):
        props.append(("evidence", _relative(files["evidence"], settings.evidence_dir)))
    return props


def _splat_properties(splats: list[dict]) -> list[tuple]:
    if not splats:
        return []
    props = [("kernel_splat", splats[0]["first_line"])]
    expected = sorted({s["expected_by"] for s in splats if s.get("expected_by")})
    if expected:
        props.append(("kernel_splat_expected", ",".join(expected)))
    return props


def _relative(paths: list[str], base: Optional[str]) -> str:
    """Paths relative to the run's directory (the parent of base), comma separated."""
    root = os.path.dirname(os.path.abspath(base)) if base else os.getcwd()
    return ",".join(os.path.relpath(os.path.abspath(p), root) for p in paths)


def lost_hosts(item) -> dict:
    """host -> loss info of every lab the test made."""
    lost = {}
    for lab in item.stash.get(LABS, []):
        lost.update(lab.lost_hosts())
    return lost


def final_outcome(phases: dict) -> str:
    if phases.get("host_lost"):
        return "host_lost"
    if phases.get("call") == "failed" or phases.get("kernel_splat"):
        return "failed"
    if "failed" in phases.values():
        return "error"
    if phases.get("xfail") == "finding":
        return "finding"
    if "skipped" in phases.values():
        return "skipped"
    return "passed"


def splat_failure(splats: list[dict]) -> str:
    """The failure text of the splats no registry entry expected ("" if none)."""
    bad = [s for s in splats if not s.get("expected_by")]
    if not bad:
        return ""
    first = bad[0]
    hosts = sorted({s["host"] for s in bad})
    return (f"KernelSplat: {len(bad)} kernel-log splat(s) on host(s) {', '.join(hosts)} during "
            f"the scenario; first on host {first['host']} ({first.get('kernel') or 'kernel ?'}): "
            f"{first['first_line']}  [{os.path.join(first['evidence'], first['file'])}]")
