"""Model against device (rdmalab.findings.agreement): synthetic columns, and a real two-column model run
with one column relabelled as a device."""

import subprocess
import sys
from pathlib import Path

from rdmalab.findings import agreement, registry as findings
from rdmalab.report import junit as report
from rdmalab.report.junit import Result

BINDINGS = Path(__file__).resolve().parents[2] / "bindings"


def cell(scenario, column, outcome, backend, provider, message="", **props):
    return Result(scenario, column, outcome, message,
                  {"backend": backend, "provider": provider, "column": column, **props})


def device(scenario, outcome, message="", **props):
    return cell(scenario, "vm-rxe", outcome, "vm", "rxe", message, **props)


def model(scenario, outcome, personality="roce"):
    return cell(scenario, f"model-{personality}", outcome, "model", personality)


REGISTRY = findings.parse("""
["rxe-f"]
kind = "unclassified"
provider = "rxe"
summary = "s"
kernels = { reproduces = ["6.1"] }
reproducer = "pytest tests/scenarios/test_x.py::test_f"
scenario = "tests/scenarios/test_x.py::test_f"
""", "reg.toml")


def test_agreement_counts_explains_and_flags():
    results = [
        model("t::same_pass", "passed"), device("t::same_pass", "passed"),
        model("t::same_fail", "failed"), device("t::same_fail", "error"),
        model("t::f", "passed"), device("t::f", "finding", finding="rxe-f"),
        model("t::odd", "passed"), device("t::odd", "failed"),
        model("t::odd2", "failed"), device("t::odd2", "passed"),
        model("t::skipped_on_model", "skipped"), device("t::skipped_on_model", "failed"),
        model("t::lost", "passed"), device("t::lost", "host_lost"),
        device("t::device_only", "passed"),
        # the registered divergence gone (XPASS(strict)): the device behaved as the model
        model("t::gone", "passed"), device("t::gone", "failed", "[XPASS(strict)] finding"),
        model("t::other_model", "failed", "ib"),
    ]
    [a] = agreement.compare(results, REGISTRY)
    assert (a.provider, a.column, a.personality, a.model_column) == \
        ("rxe", "vm-rxe", "roce", "model-roce")
    assert (a.agree, a.compared) == (3, 6)
    assert [str(d) for d in a.disagreements] == [
        "rxe-f (unclassified)",
        "t::odd (UNEXPLAINED: device failed, model passed)",
        "t::odd2 (UNEXPLAINED: device passed, model failed)"]
    assert [d.scenario for d in a.unexplained] == ["t::odd", "t::odd2"]
    assert a.line() == (
        "agreement rxe (vm-rxe) vs model:roce: 3/6 scenarios agree; 3 disagree: rxe-f "
        "(unclassified), t::odd (UNEXPLAINED: device failed, model passed), t::odd2 "
        "(UNEXPLAINED: device passed, model failed)")


def test_a_device_finding_the_model_copies_agrees():
    results = [model("t::f", "finding"), device("t::f", "finding", finding="rxe-f")]
    [a] = agreement.compare(results, REGISTRY)
    assert (a.agree, a.compared, a.disagreements) == (1, 1, [])


def test_without_the_twin_column_it_says_which_to_add():
    results = [model("t::a", "passed", "ib"), device("t::a", "passed"),
               cell("t::a", "inventory-lab", "passed", "inventory", "bnxt_re")]
    assert agreement.lines(results) == [
        "agreement rxe (vm-rxe): no model column to compare with: add --lab model:roce",
        "agreement bnxt_re (inventory-lab): no model personality predicts bnxt_re (its row in "
        "core/common/driver_facts.cc names none)"]
    assert agreement.lines([model("t::a", "passed")]) == []  # no device: nothing to say


def test_the_engines_driver_facts_map_drivers_to_personalities():
    from rdmalab import _core
    from rdmalab.labs.engine import personalities
    twins = {row.driver: row.personality for row in _core.driver_facts()}
    assert {p for p in twins.values() if p} <= set(personalities())
    assert {d: agreement.twin(d) for d in ("rxe", "siw", "cxgb4", "mlx5", "mana", "bnxt_re")} == {
        "rxe": "roce", "siw": "iwarp-siw", "cxgb4": "iwarp-cxgb4", "mlx5": "ib", "mana": "mana",
        "bnxt_re": None}


def test_result_table_prints_the_agreement():
    results = [model("t::a", "passed"), device("t::a", "failed")]
    table = report.format_table(results, registry=REGISTRY)
    assert ("model vs device:\n  agreement rxe (vm-rxe) vs model:roce: 0/1 scenarios agree; "
            "1 disagree: t::a (UNEXPLAINED: device failed, model passed)") in table


def test_a_real_model_run_against_a_fake_device_column(tmp_path):
    """Two real model columns through the CLI, then model-roce dressed as a device column of
    driver mlx5 (whose twin is ib): the comparison reads ib's predictions against roce's
    outcomes, every disagreement a real difference of the two personalities."""
    scenarios = BINDINGS.parent / "tests" / "scenarios"
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "rdmalab", "run", "--lab", "model:roce,ib",
                        "--out", str(out), "-k", "dead_peer or qp_state or drain",
                        str(scenarios)],
                       env={"PYTHONPATH": str(BINDINGS), "PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    results = report.read_junit(str(out / "junit.xml"))
    assert {x.properties.get("provider") for x in results} == {"roce", "ib"}
    for x in results:  # model-roce becomes a device column of driver mlx5 (twin: ib)
        if x.column == "model-roce":
            x.column = "inventory-fake"
            x.properties.update(backend="inventory", provider="mlx5", column="inventory-fake")
    [a] = agreement.compare(results, findings.default())
    assert a.model_column == "model-ib" and a.compared > 5
    # roce (copying rxe) never completes a SEND with retry_cnt 7; ib does: the one
    # disagreement, explained by the registry entry reproduced on the "device"
    assert [str(d) for d in a.disagreements] == ["rxe-retry-cnt-7-is-infinite (finding)"]
    assert a.agree == a.compared - 1
    assert a.line().startswith(f"agreement mlx5 (inventory-fake) vs model:ib: {a.agree}/"
                               f"{a.compared} scenarios agree; 1 disagree: ")


def test_pytest_summary_compares_a_device_column_with_its_twin(pytester):
    """The plugin's summary, end to end: a conftest dresses the model-ib column as an rxe
    device (as a vm:rxe column's properties would read) beside model:roce."""
    pytester.makeconftest("""
        import pytest

        @pytest.hookimpl(tryfirst=True)
        def pytest_runtest_logreport(report):
            props = dict(report.user_properties)
            if props.get("column") == "model-ib":
                props.update(backend="vm", provider="rxe", column="vm-rxe")
                report.user_properties = list(props.items())
                report.nodeid = report.nodeid.replace("[model-ib]", "[vm-rxe]")
    """)
    pytester.makepyfile(test_gen="""
        def test_same(lab):
            pass

        def test_differs(lab):
            assert lab.host("a").caps().personality == "ib"
    """)
    result = pytester.runpytest("-p", "rdmalab.run.pytest_plugin", "--lab", "model:roce,ib")
    result.stdout.fnmatch_lines([
        "*rdmalab: model vs device*",
        "agreement rxe (vm-rxe) vs model:roce: 1/2 scenarios agree; 1 disagree: "
        "test_gen::test_differs (UNEXPLAINED: device passed, model failed)"])
    result = pytester.runpytest("-p", "rdmalab.run.pytest_plugin", "--lab", "model:ib")
    result.stdout.fnmatch_lines(["agreement rxe (vm-rxe): no model column to compare with: "
                                 "add --lab model:roce"])
