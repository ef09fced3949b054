"""make bench's kernel-ULP section (bench/ulp.py) without a VM: its -k expression selects
exactly the campaigns it names, and its figures come from ulp_campaign records (campaigns per
hour beside the workload alone, and the run's wall clock beside the campaigns' own time)."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the bench package lives at the repository root

from bench import ulp  # noqa: E402


def collected(expr: str) -> set[str]:
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "rdmalab.run.pytest_plugin",
                        "--collect-only", "-q", str(REPO / "tests" / "ulp"), "--lab", "model",
                        "-k", expr], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return {line.split("[", 1)[1].rstrip("]")
            for line in r.stdout.splitlines() if "test_ulp_campaign[" in line}


def test_the_selection_is_exactly_the_named_nvme_campaigns():
    """Each id is <column>-<campaign>-<workload>; a column's name may hold dashes."""
    ids = collected(ulp.selection(ulp.SELECTED))
    named = {name: {i for i in ids if i.endswith(f"-{name}-nvme")} for name in ulp.SELECTED}
    assert all(named.values()), named
    assert set().union(*named.values()) == ids


def record(campaign: str, took_s: float) -> dict:
    return {"campaign": campaign, "took_s": took_s, "recovery_s": 1.5}


def test_figures_rate_each_fault_campaign_beside_the_workload_alone():
    recs = [record(ulp.NO_FAULT, 40.0), record("partition 10 s", 60.0),
            record("target reboot", 120.0)]
    figs = ulp.figures(recs, 300.0, "vm:rxe")
    part, reboot, run = figs
    assert part.value == pytest.approx(60.0) and part.reference == pytest.approx(90.0)
    assert reboot.ratio == pytest.approx(1 / 3)
    assert run.value == pytest.approx(3 / 300 * 3600)       # the boot's time included
    assert run.reference == pytest.approx(3 / 220 * 3600)   # the campaigns' own


def test_a_run_without_the_reference_or_any_fault_campaign_is_an_error_saying_so():
    with pytest.raises(RuntimeError, match="0 unfaulted and 1 fault"):
        ulp.figures([record("partition 10 s", 60.0)], 100.0, "vm:rxe")
