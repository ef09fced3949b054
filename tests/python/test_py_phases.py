"""tests/phases.py, make test's runner: lanes, after=, deadlines, the breakdown; and
tests/phase_report.py, what it reports after the table (slowest scenarios, compile time)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import phase_report  # noqa: E402
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
suite:
\t@mkdir -p res && cp junit.src res/junit.xml
compile:
\t@cat ninja.add >> bld/.ninja_log
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


def test_phase_specs_name_their_junit_files_and_build_folder():
    got = phases.parse(["vm:rxe:after=b:junit=out/vm-rxe/junit.xml,out/vm-rxe/junit-vm.xml",
                        "side:b:nice:ninja=build-asan"])
    assert got[0].junit == ["out/vm-rxe/junit.xml", "out/vm-rxe/junit-vm.xml"]
    assert got[0].after == ["b"] and got[0].ninja is None
    assert got[1].ninja == "build-asan" and got[1].nice and got[1].junit == []


# ---- phase_report: JUnit files

def case(name, seconds, child="", classname="tests.scenarios.test_cm", props=None):
    p = "".join(f'<property name="{k}" value="{v}"/>' for k, v in (props or {}).items())
    return (f'<testcase classname="{classname}" name="{name}" time="{seconds}">'
            f'{"<properties>" + p + "</properties>" if p else ""}{child}</testcase>')


def junit(path, *cases):
    path.write_text('<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
                    + "".join(cases) + "</testsuite></testsuites>")
    return path


def test_the_longest_testcases_come_first_labeled_with_the_time_per_run(tmp_path):
    cases = [case(f"test_d{i}[inventory-inventory-rxe]", 10 * i + 5) for i in range(8)]
    cases += [case(f"test_m{i}[model-roce]", i) for i in range(8)]
    cases += [case("test_f[inventory-inventory-rxe]", 200, '<failure message="x">boom</failure>'),
              case("test_x[model-roce]", 50, '<skipped type="pytest.xfail" message="known"/>'),
              case("test_s[inventory-inventory-rxe]", 0.25, '<skipped type="pytest.skip"/>'),
              case("test_e[inventory-inventory-rxe]", 1, '<error message="setup"/>')]
    vm = case("test_host_lost", 120, classname="tests.vm.test_inventory")
    got = phase_report.scenarios([str(junit(tmp_path / "junit.xml", *cases)),
                                  str(junit(tmp_path / "junit-vm.xml", vm))])
    top = [(c["seconds"], c["outcome"], c["run"], c["id"]) for c in got["longest"]]
    assert len(top) == 10 and got["testcases"] == 21
    assert top[:4] == [
        (200.0, "failed", "device", "test_cm.py::test_f[inventory-inventory-rxe]"),
        (120.0, "passed", "device", "test_inventory.py::test_host_lost"),  # tests/vm: no lab
        (75.0, "passed", "device", "test_cm.py::test_d7[inventory-inventory-rxe]"),
        (65.0, "passed", "device", "test_cm.py::test_d6[inventory-inventory-rxe]")]
    assert (50.0, "xfail", "model", "test_cm.py::test_x[model-roce]") in top
    assert [c["seconds"] for c in got["longest"]] == sorted(
        [c["seconds"] for c in got["longest"]], reverse=True)
    assert got["device"] == {"testcases": 12, "seconds": sum(10 * i + 5 for i in range(8))
                             + 200 + 0.25 + 1 + 120}
    assert got["model"] == {"testcases": 9, "seconds": sum(range(8)) + 50}
    title, rows, notes = phase_report.scenario_block("test-vm-rxe", 900, got)
    assert title == "test-vm-rxe: the 10 longest of 21 testcases"
    assert rows[1] == ("200.0", "failed", "device", "test_cm.py::test_f[inventory-inventory-rxe]")
    assert notes == ["device runs 641 s in 12 testcases, model runs 78 s in 9; "
                     "the phase took 900 s"]


def test_a_backend_property_decides_the_run_over_the_id(tmp_path):
    got = phase_report.scenarios([str(junit(
        tmp_path / "j.xml",
        case("test_a[x]", 3, props={"backend": "vm", "personality": "siw", "xpassed": "true"}),
        case("test_b[vm-siw]", 2, props={"backend": "model"}),
        case("test_c", 1, classname="tests.vm.test_k.TestHost")))])
    assert [(c["run"], c["outcome"], c["id"]) for c in got["longest"]] == [
        ("device", "xpass", "test_cm.py::test_a[x]"),
        ("model", "passed", "test_cm.py::test_b[vm-siw]"),
        ("device", "passed", "test_k.py::TestHost::test_c")]


def test_a_missing_malformed_or_stale_junit_file_is_one_line_and_the_rest_is_read(tmp_path):
    good = junit(tmp_path / "good.xml", case("test_a[model-roce]", 2),
                 case("test_b[model-roce]", "not-a-number"))
    (tmp_path / "broken.xml").write_text("<testsuites><testcase name='x'")
    (tmp_path / "other.xml").write_text("<html/>")
    stale = junit(tmp_path / "stale.xml", case("test_old[model-roce]", 99))
    os.utime(stale, (1_000_000, 1_000_000))
    paths = [str(tmp_path / n) for n in ("missing.xml", "broken.xml", "other.xml", "stale.xml")]
    got = phase_report.scenarios(paths + [str(good)], since=2_000_000)
    problems = {pathlib.Path(f["path"]).name: f["problem"] for f in got["files"]}
    assert problems["missing.xml"] == "not written"
    assert problems["broken.xml"].startswith("unreadable (")
    assert problems["other.xml"] == "not a JUnit file (its root is <html>)"
    assert problems["stale.xml"] == "older than the phase (left by an earlier run), not read"
    assert problems["good.xml"] is None
    assert [(c["id"], c["seconds"]) for c in got["longest"]] == [
        ("test_cm.py::test_a[model-roce]", 2.0), ("test_cm.py::test_b[model-roce]", 0.0)]
    _, _, notes = phase_report.scenario_block("p", 1, got)
    assert sum(1 for n in notes if "missing.xml" in n) == 1 and len(notes) == 5
    empty = phase_report.scenarios([paths[0]])
    assert phase_report.scenario_block("p", 1, empty) == (
        "p: scenarios: no testcases read", None, [f"{paths[0]}: not written"])


# ---- phase_report: ninja logs

NINJA_HEADER = "# ninja log v5\n"
BUILD_NINJA = """\
build core/libengine.a: CXX_STATIC_LIBRARY_LINKER__engine_RelWithDebInfo core/CMakeFiles/engine.dir/a.cc.o
build core/app_tests core/app_tests[1]_tests.cmake | ${cmake_ninja_workdir}core/app_tests[1]_tests.cmake: CXX_EXECUTABLE_LINKER__app_tests_ core/CMakeFiles/app_tests.dir/t.cc.o
build /abs/_core.so: CXX_MODULE_LIBRARY_LINKER___core_RelWithDebInfo bindings/CMakeFiles/_core.dir/m.cc.o
"""


def entry(start, end, output, digest="h", mtime=5):
    return f"{start}\t{end}\t{mtime}\t{output}\t{digest}\n"


def test_compile_time_counts_only_the_steps_logged_during_the_phase_by_target(tmp_path):
    build = tmp_path / "build"
    build.mkdir()
    (build / "build.ninja").write_text(BUILD_NINJA)
    log = build / ".ninja_log"
    log.write_text(NINJA_HEADER + entry(0, 90000, "core/CMakeFiles/engine.dir/old.cc.o"))
    mark = phase_report.ninja_mark(str(build))
    work = str(build.resolve())
    with open(log, "a") as f:
        f.write(entry(0, 4000, "core/CMakeFiles/engine.dir/a.cc.o", "1")
                + entry(0, 6000, "core/CMakeFiles/engine.dir/b.cc.o", "2")
                + entry(4000, 9000, "bindings/CMakeFiles/_core.dir/m.cc.o", "3")
                + entry(9000, 9500, "core/libengine.a", "4")
                + entry(9500, 11500, f"{work}/core/app_tests[1]_tests.cmake", "5")  # one link
                + entry(9500, 11500, "core/app_tests", "5")                      # step, three
                + entry(9500, 11500, "core/app_tests[1]_tests.cmake", "5")       # outputs
                + entry(11500, 12500, "/abs/_core.so", "6")
                + entry(12500, 12600, "build.ninja", "7"))
    got = phase_report.compile_time(str(build), mark)
    assert got["problem"] is None and got["notes"] == []
    assert [(t["target"], round(t["seconds"], 3), t["steps"]) for t in got["targets"]] == [
        ("engine", 10.5, 3), ("_core", 6.0, 2), ("app_tests", 2.0, 1), ("(other)", 0.1, 1)]
    assert got["steps"] == 7 and round(got["sum_s"], 3) == 18.6   # not old.cc.o's 90 s
    assert [(s["seconds"], s["output"]) for s in got["slowest"]] == [
        (6.0, "core/CMakeFiles/engine.dir/b.cc.o"), (5.0, "bindings/CMakeFiles/_core.dir/m.cc.o"),
        (4.0, "core/CMakeFiles/engine.dir/a.cc.o")]
    title, rows, notes = phase_report.compile_block("build", 13, got)
    assert rows[1] == ("10.5", "3", "engine") and rows[-1] == ("0.1", "1", "(other)")
    assert notes[0].startswith("7 steps, 19 s summed, in a 13 s phase")
    assert notes[1] == ("slowest: 6.0 s core/CMakeFiles/engine.dir/b.cc.o; "
                        "5.0 s bindings/CMakeFiles/_core.dir/m.cc.o; "
                        "4.0 s core/CMakeFiles/engine.dir/a.cc.o")
    again = phase_report.compile_time(str(build), phase_report.ninja_mark(str(build)))
    assert again["steps"] == 0                       # a phase that built nothing
    assert phase_report.compile_block("build", 1, again)[2][0].startswith("nothing built")


def test_a_new_log_counts_whole_and_a_malformed_or_missing_one_is_a_line(tmp_path):
    mark = phase_report.ninja_mark(str(tmp_path))   # no log yet: a fresh build folder
    (tmp_path / ".ninja_log").write_text(
        NINJA_HEADER + entry(0, 3000, "x/CMakeFiles/t.dir/a.cc.o", "1") + "garbage\n"
        + entry(5, 1, "x/CMakeFiles/t.dir/b.cc.o", "2") + "1\t2\t3\tpartial")
    got = phase_report.compile_time(str(tmp_path), mark)
    assert [(t["target"], t["seconds"]) for t in got["targets"]] == [("t", 3.0)]
    assert got["notes"] == [f"3 unreadable line(s) of {tmp_path}/.ninja_log skipped"]
    gone = phase_report.compile_time(str(tmp_path / "nothing"), mark)
    assert gone["problem"] == f"no {tmp_path}/nothing/.ninja_log: ninja did not build there"
    assert gone["steps"] == 0
    assert phase_report.compile_block("p", 1, gone)[2] == [gone["problem"]]


def test_a_log_ninja_rewrote_meanwhile_is_read_by_its_outputs_mtime(tmp_path):
    log = tmp_path / ".ninja_log"
    log.write_text(NINJA_HEADER + entry(0, 1000, "x/CMakeFiles/old.dir/a.cc.o", "1", mtime=1)
                   + entry(0, 1000, "x/CMakeFiles/old.dir/b.cc.o", "2", mtime=2))
    mark = phase_report.ninja_mark(str(tmp_path))
    late = mark["wall_ns"] + 10**9
    log.write_text(NINJA_HEADER + entry(0, 1000, "x/CMakeFiles/old.dir/b.cc.o", "2", mtime=2)
                   + entry(0, 2000, "x/CMakeFiles/new.dir/c.cc.o", "3", mtime=late))
    got = phase_report.compile_time(str(tmp_path), mark)
    assert [t["target"] for t in got["targets"]] == ["new"]
    assert got["notes"] == ["ninja rewrote its log during the phase: steps chosen by their "
                            "outputs' mtime"]


# ---- both, through the runner

def test_the_runner_reports_scenarios_and_compile_time_after_its_table(tmp_path):
    (tmp_path / "junit.src").write_text(junit(
        tmp_path / "junit.tmp", case("test_slow[inventory-inventory-rxe]", 30),
        case("test_fast[model-roce]", 0.5)).read_text())
    (tmp_path / "bld").mkdir()
    (tmp_path / "bld" / ".ninja_log").write_text(
        NINJA_HEADER + entry(0, 50000, "CMakeFiles/old.dir/o.cc.o"))        # an earlier run's
    (tmp_path / "ninja.add").write_text(entry(0, 7000, "core/CMakeFiles/engine.dir/a.cc.o"))
    stale = junit(tmp_path / "old.xml", case("test_old[model-roce]", 1))
    os.utime(stale, (1_000_000, 1_000_000))
    r, got, out = run(tmp_path, "a:suite:junit=res/junit.xml,res/missing.xml",
                      "b:compile:ninja=bld", "b:fails",
                      "b:needs-fails:after=fails:junit=res/junit.xml:ninja=bld",
                      "b:side:junit=old.xml:ninja=nothing")
    assert r.returncode == 1, r.stdout + r.stderr
    s = got["suite"]["scenarios"]
    assert [(c["id"], c["run"]) for c in s["longest"]] == [
        ("test_cm.py::test_slow[inventory-inventory-rxe]", "device"),
        ("test_cm.py::test_fast[model-roce]", "model")]
    assert s["device"]["seconds"] == 30 and s["model"]["seconds"] == 0.5
    c = got["compile"]["compile"]
    assert [(t["target"], t["seconds"]) for t in c["targets"]] == [("engine", 7.0)]
    assert got["needs-fails"]["scenarios"] == {"problem": "the phase did not run"}
    assert got["needs-fails"]["compile"]["problem"] == "the phase did not run"
    assert got["side"]["scenarios"]["files"][0]["problem"].startswith("older than the phase")
    assert got["side"]["compile"]["problem"] == "no nothing/.ninja_log: ninja did not build there"
    text = r.stdout[r.stdout.index("==== make test: time per phase"):]
    for line in ["==== suite: the 2 longest of 2 testcases", "res/missing.xml: not written",
                 "==== compile: compile time by target (bld/.ninja_log)",
                 "==== needs-fails: scenarios: the phase did not run",
                 "old.xml: older than the phase (left by an earlier run), not read",
                 "no nothing/.ninja_log: ninja did not build there"]:
        assert line in text, text
    assert text.index("==== suite:") < text.index("==== compile:")
    md = (out / "times.md").read_text()
    assert "| 30.0 | passed | device | test_cm.py::test_slow[inventory-inventory-rxe] |" in md
    assert "## compile: compile time by target (bld/.ninja_log)" in md
    assert "| 7.0 | 1 | engine |" in md
    assert "## make test: time per phase (lanes run side by side)" in md
