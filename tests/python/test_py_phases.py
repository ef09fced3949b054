"""tests/phases.py, make test's runner: lanes, after=, deadlines, the breakdown."""
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import phases  # noqa: E402

MAKEFILE = """\
slow:
\t@echo slow-start; sleep 1; echo slow-end
side:
\t@echo side phase=$(PHASE)
fails:
\t@echo about to fail; exit 3
needs-fails:
\t@echo never printed
hangs:
\t@sleep 60
"""


def run(tmp_path, *specs, deadline=30.0):
    (tmp_path / "Makefile").write_text(MAKEFILE)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "phases.py"), "--out", str(out),
                        "--deadline", str(deadline), *specs], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    report = json.loads((out / "phases.json").read_text())
    return r, {p["target"]: p for p in report["phases"]}, out


def test_lanes_run_side_by_side_and_each_phase_gets_phase_1(tmp_path):
    r, got, out = run(tmp_path, "a:slow", "b:side")
    assert r.returncode == 0, r.stdout + r.stderr
    assert got["slow"]["result"] == got["side"]["result"] == "passed"
    assert got["side"]["start_s"] < got["slow"]["start_s"] + got["slow"]["seconds"]  # overlap
    assert "side phase=1" in (out / "side.log").read_text()
    assert "slow-end" in r.stdout                          # the first lane streams
    assert "==== make test: time per phase" in r.stdout and "every phase passed" in r.stdout


def test_a_failure_shows_its_log_skips_what_needs_it_and_fails_the_run(tmp_path):
    r, got, _ = run(tmp_path, "a:slow", "b:fails", "b:needs-fails:after=fails", "b:side")
    assert r.returncode == 1
    assert got["fails"]["result"] == "failed (rc 2)"
    assert got["needs-fails"]["result"] == "skipped: fails did not pass"
    assert got["side"]["result"] == "passed"               # the rest of the lane still runs
    assert "about to fail" in r.stdout and "never printed" not in r.stdout
    assert "did not pass: fails, needs-fails" in r.stdout


def test_done_waits_for_a_phase_to_end_and_runs_even_when_it_failed(tmp_path):
    r, got, _ = run(tmp_path, "a:slow", "a:fails", "b:side:done=fails")
    assert r.returncode == 1
    assert got["fails"]["result"] == "failed (rc 2)"
    assert got["side"]["result"] == "passed"               # ran although fails did not pass
    assert got["side"]["start_s"] >= got["fails"]["start_s"] + got["fails"]["seconds"] - 0.01


def test_a_phase_past_its_deadline_is_stopped_and_named(tmp_path):
    r, got, _ = run(tmp_path, "a:hangs", "b:side", deadline=2.0)
    assert r.returncode == 1
    assert got["hangs"]["result"] == "timed out after 2 s"
    assert got["hangs"]["seconds"] < 30
    assert "ran past its deadline" in r.stdout


@pytest.mark.parametrize("specs, message", [
    (["slow"], "expected LANE:TARGET"),
    (["a:slow:fast"], "unknown option 'fast'"),
    (["a:slow", "b:slow"], "slow is listed twice"),
    (["a:slow:after=nothing"], "waits for nothing, which is not a phase"),
    (["a:slow:done=nothing"], "waits for nothing, which is not a phase"),
])
def test_a_malformed_phase_list_is_refused_by_name(specs, message):
    with pytest.raises(SystemExit, match=message):
        phases.parse(specs)


def test_the_makefiles_phase_list_parses_and_the_browser_test_follows_its_report():
    # make test's own list (Makefile TEST_PHASES), read through make itself.
    r = subprocess.run(["make", "-s", "--no-print-directory", "--eval",
                        "print-test-phases: ; @echo $(TEST_PHASES)", "print-test-phases"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = {p.target: p for p in phases.parse(r.stdout.split())}
    assert got["test-browser"].done_after == ["test-vm-siw"]  # it opens test-vm-siw's report,
    assert got["test-browser"].after == []  # also after a failed run
    assert got["test-browser"].lane != got["test-vm-siw"].lane
