"""The findings registry (bindings/rdmalab/findings/findings.toml): it validates, malformed entries are
refused naming the entry and field, the scenarios' @finding markers and the registry name each
other, README's table is the generated one, and the plugin applies the entries."""

import ast
import re
import textwrap
from pathlib import Path

import pytest

from rdmalab.findings import registry as findings

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "tests" / "scenarios"

GOOD_FINDING = """
["rxe-x"]
kind = "finding"
provider = "rxe"
summary = "what rxe does"
rule = { citation = "IBA Vol 1 10.3.1", quote = "the rule" }
source = [{ file = "drivers/infiniband/sw/rxe/rxe_qp.c", function = "rxe_qp_from_attr" }]
kernels = { reproduces = ["6.1.192 (Debian 6.1.0-56)"] }
reproducer = "pytest tests/scenarios/test_x.py::test_y --lab vm:rxe"
scenario = "tests/scenarios/test_x.py::test_y"
writeup = "docs/findings/rxe-x.md"
"""


def parse(text):
    return findings.parse(textwrap.dedent(text), "reg.toml")


def error_of(text) -> str:
    with pytest.raises(findings.FindingsError) as e:
        parse(text)
    return str(e.value)


# -- the real registry

def test_the_registry_validates_and_its_files_exist():
    registry = findings.load()  # raises FindingsError naming every problem
    assert registry.entries
    assert findings.check_files(registry, REPO) == []
    for entry in registry:
        assert entry.kind in findings.KINDS
        if entry.kind == "finding":  # what the parser enforces, checked on the real file too
            assert entry.rule.citation and entry.rule.quote and entry.writeup
            assert all(s.file and s.function for s in entry.sources) and entry.sources


def scenario_markers() -> dict[str, list]:
    """node id -> the args of each @pytest.mark.finding(...) on it, read from the source."""
    out: dict[str, list] = {}
    for path in sorted(SCENARIOS.glob("test_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            nodeid = f"{path.relative_to(REPO).as_posix()}::{node.name}"
            out.setdefault(nodeid, [])
            for dec in node.decorator_list:
                if (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute)
                        and dec.func.attr == "finding"):
                    out[nodeid].append((dec.args, dec.keywords))
    return out


def test_every_marker_names_an_entry_and_every_entry_a_marked_scenario():
    registry = findings.load()
    markers = scenario_markers()
    used = set()
    for nodeid, marks in markers.items():
        for args, keywords in marks:
            assert len(args) == 1 and not keywords and isinstance(args[0], ast.Constant), (
                f"{nodeid}: @finding takes one registry id")
            entry = registry.entries.get(args[0].value)
            assert entry is not None, f"{nodeid}: no entry {args[0].value!r} in the registry"
            assert nodeid in entry.scenarios, (
                f"{nodeid} carries {entry.id}, whose scenario is {entry.scenarios}")
            used.add(entry.id)
    for entry in registry:
        for nodeid in entry.scenarios:
            assert nodeid in markers, f"[{entry.id}] scenario: no test {nodeid}"
            ids = [a[0].value for a, _ in markers[nodeid] if a and isinstance(a[0], ast.Constant)]
            assert entry.id in ids, f"[{entry.id}] scenario: {nodeid} has no @finding({entry.id!r})"
    assert used == set(registry.entries)


def test_readme_table_is_the_generated_one():
    readme = (REPO / "README.md").read_text()
    assert findings.readme_block(readme) == findings.markdown_tables(findings.load()), (
        "README's findings table is stale: PYTHONPATH=bindings /usr/bin/python3 -m rdmalab "
        "findings --readme README.md")


# -- validation

def test_a_complete_finding_parses():
    entry = parse(GOOD_FINDING).get("rxe-x")
    assert entry.kind == "finding" and entry.providers == ("rxe",)
    assert entry.raises_class() is AssertionError
    assert entry.applies_to("rxe") and not entry.applies_to("model:roce")
    assert str(entry.sources[0]) == "drivers/infiniband/sw/rxe/rxe_qp.c rxe_qp_from_attr"


def test_a_finding_without_rule_source_or_writeup_is_refused():
    text = re.sub(r"^(rule|source|writeup) = .*\n", "", GOOD_FINDING, flags=re.M)
    err = error_of(text)
    assert 'reg.toml:2: [rxe-x] rule: required for kind \'finding\'' in err
    assert "[rxe-x] source: required for kind 'finding'" in err
    assert "[rxe-x] writeup: required for kind 'finding'" in err


def test_a_finding_needs_the_quote_and_the_function():
    text = GOOD_FINDING.replace(', quote = "the rule"', "").replace(
        ', function = "rxe_qp_from_attr"', "")
    err = error_of(text)
    assert "[rxe-x] rule.quote: required for kind 'finding'" in err
    assert "[rxe-x] source[0].function: required for kind 'finding'" in err


def test_unknown_kind_raises_and_keys_are_refused():
    assert "[rxe-x] kind: 'bug' is not a kind; kinds: finding, unclassified, provider-fact" in \
        error_of(GOOD_FINDING.replace('kind = "finding"', 'kind = "bug"'))
    assert "[rxe-x] raises: 'Hang' is neither an exception rdmalab exports" in \
        error_of(GOOD_FINDING + 'raises = "Hang"\n')
    err = error_of(GOOD_FINDING + 'severity = "high"\n')
    assert "[rxe-x] severity: unknown field" in err
    err = error_of(GOOD_FINDING.replace('quote = "the rule"', 'quote = "q", page = 3'))
    assert "[rxe-x] rule.page: unknown field" in err
    assert "[rxe-x] models: 'rocee' is not a model personality" in \
        error_of(GOOD_FINDING + 'models = ["rocee"]\n')


def test_raises_resolves_rdmalab_errors():
    import rdmalab
    entry = parse(GOOD_FINDING + 'raises = "Hung"\n').get("rxe-x")
    assert entry.raises_class() is rdmalab.Hung
    assert parse(GOOD_FINDING + 'raises = "Error"\n').get("rxe-x").raises_class() is rdmalab.Error


def test_a_provider_fact_needs_less_and_takes_no_raises():
    fact = """
        ["siw-y"]
        kind = "provider-fact"
        provider = ["siw"]
        models = ["model:iwarp-siw"]
        summary = "what siw does"
        scenario = ["tests/scenarios/test_x.py::test_y"]
    """
    entry = parse(fact).get("siw-y")
    assert not entry.xfails and entry.applies_to("model:iwarp-siw") and entry.applies_to("siw")
    assert "[siw-y] raises: only for kinds finding, unclassified" in \
        error_of(fact + '        raises = "Hung"\n')


def test_missing_fields_and_bad_toml_name_the_file():
    err = error_of('["x"]\nkind = "unclassified"\n')
    for field in ("provider", "summary", "kernels", "scenario", "reproducer"):
        assert f"reg.toml:1: [x] {field}: required for kind 'unclassified'" in err
    assert "reg.toml: invalid TOML" in error_of('["x"\nkind = 1\n')
    assert "reg.toml:1: [x]: an entry is a table" in error_of('x = 3\n')


def test_the_reproducer_runs_the_scenario():
    err = error_of(GOOD_FINDING.replace("tests/scenarios/test_x.py::test_y --lab", "--lab"))
    assert "[rxe-x] reproducer: one command that runs the entry's scenario" in err


def test_readme_block_is_rewritten_in_place():
    registry = parse(GOOD_FINDING)
    text = f"before\n{findings.BEGIN}\nold table\n{findings.END}\nafter\n"
    new = findings.replace_block(text, findings.markdown_tables(registry))
    assert new.startswith("before\n") and new.endswith(f"{findings.END}\nafter\n")
    assert "| [rxe-x](docs/findings/rxe-x.md) | rxe | what rxe does | IBA Vol 1 10.3.1: " \
           "\"the rule\" |" in new
    assert findings.readme_block(new) == findings.markdown_tables(registry)
    with pytest.raises(findings.FindingsError, match="no <!-- findings:begin -->"):
        findings.replace_block("no block", "x")


# -- the plugin

PLUGIN = ("-p", "rdmalab.run.pytest_plugin")

REGISTRY = """
["roce-divergence"]
kind = "unclassified"
provider = "rxe"
models = ["roce"]
summary = "roce does it differently"
kernels = { reproduces = ["6.1"] }
reproducer = "pytest tests/scenarios/test_gen.py::test_diverges --lab vm:rxe"
scenario = "tests/scenarios/test_gen.py::test_diverges"
raises = "Hung"

["roce-fact"]
kind = "provider-fact"
provider = "rxe"
models = ["roce"]
summary = "a fact"
scenario = "tests/scenarios/test_gen.py::test_fact"
"""


def run_plugin(pytester, source, *args):
    pytester.makefile(".toml", reg=REGISTRY)
    pytester.makepyfile(test_gen=source)
    return pytester.runpytest(*PLUGIN, "--findings-registry", "reg.toml", *args)


def test_plugin_xfails_a_divergence_and_records_a_provider_fact(pytester):
    result = run_plugin(pytester, """
        import pytest
        from rdmalab import Hung

        @pytest.mark.finding("roce-divergence")
        def test_diverges(lab):
            if lab.host("a").caps().personality == "roce":
                raise Hung("x", "dump")

        @pytest.mark.finding("roce-fact")
        def test_fact(lab):
            pass
    """, "--lab", "model:roce,ib", "-rxX", "--junitxml", "j.xml")
    result.assert_outcomes(passed=3, xfailed=1)
    result.stdout.fnmatch_lines(["*XFAIL*test_diverges[[]model-roce[]]*unclassified "
                                 "roce-divergence on model:roce (*): roce does it differently*"])
    junit = (pytester.path / "j.xml").read_text()
    assert '<property name="finding" value="roce-divergence"' in junit
    assert '<property name="outcome" value="finding"' in junit
    assert junit.count('name="provider_fact" value="roce-fact"') == 1  # model-roce only
    from rdmalab.report import junit as report
    table = report.format_table(report.read_junit(str(pytester.path / "j.xml")),
                                registry=findings.load(pytester.path / "reg.toml"))
    assert "roce-divergence [model-roce] (unclassified): test_gen::test_diverges" in table
    assert "provider facts asserted" in table and "roce-fact [model-roce]: test_gen::test_fact" \
        in table


def test_plugin_refuses_the_old_form_and_unknown_ids(pytester):
    result = run_plugin(pytester, """
        import pytest

        @pytest.mark.finding("rxe", "name", "text")
        def test_old(lab):
            pass
    """, "--lab", "model:roce")
    assert result.ret != 0
    out = result.stdout.str() + result.stderr.str()
    assert "one argument, the id of an entry" in out and "old form" in out
    result = run_plugin(pytester, """
        import pytest

        @pytest.mark.finding("no-such-finding")
        def test_unknown(lab):
            pass
    """, "--lab", "model:roce")
    assert result.ret != 0
    out = result.stdout.str() + result.stderr.str()
    assert "finding('no-such-finding'): no finding 'no-such-finding' in" in out


def test_since_and_fixed_bound_the_kernels_an_entry_applies_to():
    """kernels.since / kernels.fixed: the entry applies on [since, fixed) only."""
    from rdmalab.findings import registry as findings
    e = findings.parse('''["since-bound"]
kind = "provider-fact"
provider = "rxe"
summary = "came in with 6.12"
kernels = { reproduces = ["7.2.13"], checked = ["7.2.13 source"], since = "v6.12: a change" }
reproducer = "pytest tests/scenarios/test_cm.py::test_lost_rtu_is_recovered --lab vm:rxe"
evidence = "the history"
scenario = "tests/scenarios/test_cm.py::test_lost_rtu_is_recovered"
''').get("since-bound")
    assert e.since_in == (6, 12) and e.fixed_in is None
    assert not e.applies_to("rxe", "6.1.0-56-amd64")
    assert e.applies_to("rxe", "6.12.117+deb13-amd64") and e.applies_to("rxe", "7.2.13+deb14-amd64")
    assert e.applies_to("rxe", "")  # an unknown kernel: as registered
    assert not e.applies_to("siw", "7.2.13+deb14-amd64")
    fixed = findings.default().get("siw-query-qp-reports-no-state")
    assert fixed.applies_to("siw", "6.1.0-56-amd64") and not fixed.applies_to("siw", "7.2.13")
