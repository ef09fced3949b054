"""python3 -m rdmalab run / report: junit, histories and the result table."""

import subprocess
import sys
import textwrap
from pathlib import Path

from rdmalab.report import junit as report

BINDINGS = Path(__file__).resolve().parents[2] / "bindings"


def rdmalab_cli(*args, cwd):
    env = {"PYTHONPATH": str(BINDINGS), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "rdmalab", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def write_scenarios(directory: Path, failing: bool) -> Path:
    directory.mkdir()
    (directory / "test_cli_gen.py").write_text(textwrap.dedent(f"""
        import pytest

        def test_ok(lab):
            assert lab.host("a").caps().personality in ("ib", "roce")

        @pytest.mark.requires("xrc")
        def test_xrc(lab):
            assert {not failing}
    """))
    return directory


def test_run_writes_junit_histories_and_table(tmp_path):
    scen = write_scenarios(tmp_path / "scen", failing=False)
    out = tmp_path / "out"
    r = rdmalab_cli("run", "--lab", "model:ib,roce", "--seed", "4", "--out", str(out), str(scen),
                    cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (out / "junit.xml").exists()
    hist = sorted(p.name for p in (out / "history").iterdir())
    assert len(hist) == 3 and all(h.endswith(".jsonl") for h in hist)
    table = r.stdout
    assert "test_cli_gen::test_ok" in table and "model-ib" in table and "model-roce" in table
    assert "requires xrc" in table  # the skip reason of model-roce
    assert (out / "report.txt").read_text() in table


def test_run_fails_when_a_scenario_fails(tmp_path):
    scen = write_scenarios(tmp_path / "scen", failing=True)
    r = rdmalab_cli("run", "--lab", "model:ib", "--out", str(tmp_path / "o"), str(scen),
                    "-k", "test_xrc", cwd=tmp_path)
    assert r.returncode != 0
    assert "FAILED" in r.stdout and "seed 1" in r.stdout


def test_split_name_uses_lab_properties():
    props = {"backend": "model", "personality": "ib"}
    assert report.split_name("tests.scenarios.test_drain", "test_x[model-ib]", props) == \
        ("test_drain::test_x", "model-ib")
    assert report.split_name("m.test_a", "test_y[model-ib-4]", props) == \
        ("test_a::test_y[4]", "model-ib")
    assert report.split_name("m.test_a", "test_z", {}) == ("test_a::test_z", "-")


def test_same_seed_twice_gives_identical_history_files(tmp_path):
    """The issue's replay promise, end to end: the real scenario suite run twice through the
    CLI with one seed writes byte-identical histories; another seed does not."""
    scenarios = BINDINGS.parent / "tests" / "scenarios"
    select = "qp_fatal or drain_with_the_wire_cut or xrc_lifetime"

    def histories(seed, name):
        out = tmp_path / name
        r = rdmalab_cli("run", "--lab", "model:ib,mana", "--seed", str(seed), "--out", str(out),
                        "-k", select, str(scenarios), cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        return {p.name: p.read_bytes() for p in sorted((out / "history").iterdir())}

    first, second = histories(7, "first"), histories(7, "second")
    assert len(first) >= 10
    assert first == second
    assert histories(8, "third") != first


def test_table_reports_a_reproduced_finding_and_fails_a_gone_one(tmp_path):
    """A strict xfail from @finding is a 'finding' cell with its text; an XPASS(strict) (the
    device no longer diverges) is a failure."""
    junit = tmp_path / "junit.xml"
    junit.write_text(textwrap.dedent("""\
        <testsuites><testsuite>
          <testcase classname="tests.scenarios.test_x" name="test_a[vm-rxe]">
            <properties><property name="backend" value="vm"/>
              <property name="personality" value="rxe"/></properties>
            <skipped type="pytest.xfail" message="finding f1 on rxe (rxe0): it diverges"/>
          </testcase>
          <testcase classname="tests.scenarios.test_x" name="test_b[vm-rxe]">
            <properties><property name="backend" value="vm"/>
              <property name="personality" value="rxe"/></properties>
            <failure message="[XPASS(strict)] finding f2 on rxe (rxe0): gone"/>
          </testcase>
        </testsuite></testsuites>"""))
    results = report.read_junit(str(junit))
    assert [r.outcome for r in results] == ["finding", "failed"]
    table = report.format_table(results)
    assert "finding f1 on rxe (rxe0): it diverges" in table
    assert report.failed(results)


def test_finding_marker_applies_to_its_device_only():
    import pytest

    from rdmalab.findings import registry as findings
    from rdmalab.run.markers import finding_on

    class Caps:
        personality, name = "siw", "siw0"

    class Spec:
        def __init__(self, backend):
            self.backend = backend

        def caps(self):
            return Caps()

    def entry(entry_id, provider, models=""):
        return textwrap.dedent(f"""
            ["{entry_id}"]
            kind = "unclassified"
            provider = "{provider}"
            summary = "text"
            kernels = {{ reproduces = ["6.1"] }}
            reproducer = "pytest tests/scenarios/test_x.py::test_y"
            scenario = "tests/scenarios/test_x.py::test_y"
        """) + models
    registry = findings.parse(entry("f", "siw") + entry("g", "siw", 'models = ["iwarp-siw"]\n')
                              + entry("h", "rxe"))
    mark = pytest.mark.finding("f").mark
    found = finding_on(mark, Spec("vm"), registry)
    assert found is not None and found[0].id == "f" and found[1] == "siw"
    assert finding_on(mark, Spec("model"), registry) is None   # the model predicts the spec

    class ModelCaps:
        personality, name = "iwarp-siw", "model-iwarp-siw0"

    class ModelSpec(Spec):
        def caps(self):
            return ModelCaps()

    copied = pytest.mark.finding("g").mark                      # a personality copying it
    assert finding_on(copied, ModelSpec("model"), registry)[1] == "model:iwarp-siw"
    assert finding_on(pytest.mark.finding("h").mark, Spec("vm"), registry) is None
    # An entry fixed in v6.8 applies to a 6.1 kernel, not to a 6.8 or later one.
    fixed = findings.parse(entry("k", "siw").replace(
        'reproduces = ["6.1"]', 'reproduces = ["6.1"], fixed = "v6.8: \\"a fix\\""'))

    class OldCaps(Caps):
        kernel_release = "6.1.0-56-amd64"

    class NewCaps(Caps):
        kernel_release = "6.8.0-1-amd64"

    class KernelSpec(Spec):
        def __init__(self, caps):
            super().__init__("vm")
            self._caps = caps

        def caps(self):
            return self._caps

    assert fixed.entries["k"].fixed_in == (6, 8)
    assert finding_on(pytest.mark.finding("k").mark, KernelSpec(OldCaps()), fixed) is not None
    assert finding_on(pytest.mark.finding("k").mark, KernelSpec(NewCaps()), fixed) is None
    assert finding_on(pytest.mark.finding("k").mark, Spec("vm"), fixed) is not None  # unknown
    with pytest.raises(pytest.UsageError, match="old form"):
        finding_on(pytest.mark.finding("siw", "f", "text").mark, Spec("vm"), registry)
    with pytest.raises(pytest.UsageError, match="no finding 'nope'"):
        finding_on(pytest.mark.finding("nope").mark, Spec("vm"), registry)


def test_kernel_is_passed_to_pytest_and_names_the_column():
    """`run --kernel sid` reaches the plugin; a device's column names its kernel, the model's
    does not."""
    from rdmalab.run import cli
    args = cli.build_parser().parse_args(["run", "--lab", "vm:rxe", "--kernel", "sid"])
    cmd = cli.pytest_command(args, [])
    assert cmd[cmd.index("--kernel") + 1] == "sid"
    props = {"backend": "vm", "personality": "rxe", "column": "vm-rxe",
             "kernel": "7.2.13+deb14-amd64"}
    assert report.kernel_column("vm-rxe", props) == "vm-rxe@7.2.13+deb14"
    assert report.kernel_column("model-roce", dict(props, backend="model")) == "model-roce"
    assert report.kernel_column("vm-rxe", dict(props, kernel="")) == "vm-rxe"
