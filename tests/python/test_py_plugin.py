"""The pytest plugin, run on small generated test files with pytester."""

import re
import shutil
import socket
import xml.etree.ElementTree as ET

import pytest

from rdmalab.report.junit import history_name
from rdmalab.run.labspec import parse_lab_option

PLUGIN = ("-p", "rdmalab.run.pytest_plugin")


def run(pytester, source, *args):
    pytester.makepyfile(test_gen=source)
    # The inner run is a session of its own, not an xdist worker of this one (a worker does
    # not probe inventories: its controller did).
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PYTEST_XDIST_WORKER", raising=False)
        return pytester.runpytest(*PLUGIN, *args)


def test_lab_option_parsing():
    assert [s.id for s in parse_lab_option("model:ib,roce")] == ["model-ib", "model-roce"]
    assert "model-iwarp-siw" in [s.id for s in parse_lab_option("model")]
    with pytest.raises(pytest.UsageError, match="unknown personality ibx"):
        parse_lab_option("model:ibx")
    with pytest.raises(pytest.UsageError, match="unknown lab 'verbs'"):
        parse_lab_option("verbs")
    # A colon with nothing after it names nothing: refused like `inventory:` (rdmalab.run.inputs).
    for text in ("vm:", "netns:", "model:", "inventory:", "model: "):
        with pytest.raises(pytest.UsageError, match="nothing after the colon"):
            parse_lab_option(text)


def test_history_name_is_a_safe_file_name():
    assert history_name("tests/scenarios/test_x.py::test_y[model-ib]") == \
        "tests.scenarios.test_x.test_y-model-ib"
    assert "/" not in history_name("a/b.py::C::d[x y/z]")


def test_lab_fixture_is_parametrized_by_personality(pytester):
    result = run(pytester, """
        def test_two_hosts(lab, hosts, personality):
            assert [h.name for h in hosts] == ["a", "b"]
            assert lab.host("a").caps().personality == personality
    """, "--lab", "model:ib,roce", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_two_hosts[[]model-ib[]] PASSED*",
                                 "*test_two_hosts[[]model-roce[]] PASSED*"])


def test_requires_skips_naming_the_missing_capability(pytester):
    result = run(pytester, """
        import pytest

        @pytest.mark.requires("xrc")
        def test_xrc(lab):
            pass

        @pytest.mark.requires(transport="iWARP")
        def test_iwarp(lab):
            pass

        @pytest.mark.requires(event="QP_FATAL")
        def test_fatal(lab):
            pass
    """, "--lab", "model:ib,roce", "-rs")
    result.assert_outcomes(passed=2, skipped=4)
    out = result.stdout.str()
    assert re.search(r"requires xrc: no XRC on roce \(device \S+ \(personality roce\)\)", out)
    assert re.search(r"requires transport=iWARP: device \S+ \(personality ib\) is IB", out)
    assert re.search(r"requires event=QP_FATAL: device \S+ \(personality roce\) does not raise "
                     r"QP_FATAL", out)
    assert "PytestUnknownMarkWarning" not in out


def test_requires_unknown_feature_is_an_error(pytester):
    result = run(pytester, """
        import pytest

        @pytest.mark.requires("teleport")
        def test_x(lab):
            pass
    """, "--lab", "model:ib")
    assert result.ret != 0
    assert "unknown feature" in result.stdout.str() + result.stderr.str()


def test_failure_prints_seed_and_replay(pytester):
    result = run(pytester, """
        def test_fails(lab):
            assert lab.seed == 0
    """, "--lab", "model:ib", "--seed", "5")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*seed 5 on model:ib*",
        "*replay: python3 -m rdmalab run --lab model:ib --seed 5 -k 'test_fails[[]model-ib[]]'*",
    ])


def test_hung_wait_fails_with_the_dump(pytester):
    result = run(pytester, """
        def test_hangs(lab):
            lab.wait_until(lambda: False, 1000, what="the peer to reach RTS")
    """, "--lab", "model:ib")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "Hung: waited 1000 ns for the peer to reach RTS" in out
    assert "replay: python3 -m rdmalab run --lab model:ib --seed 1" in out
    assert "--- state ---" in out


def test_handler_error_fails_the_test_at_teardown(pytester):
    result = run(pytester, """
        def test_bad_thread(lab):
            def body():
                lab.sleep(10**9)  # cut short by the shutdown at teardown
                raise ValueError("handler bug")
            lab.spawn("t", body)
            lab.run_for(1000)
    """, "--lab", "model:ib")
    result.assert_outcomes(passed=1, errors=1)
    assert "handler bug" in result.stdout.str()


def test_history_dir_and_junit_properties(pytester, tmp_path):
    hist = tmp_path / "hist"
    junit = tmp_path / "junit.xml"
    result = run(pytester, """
        import pytest

        def test_ok(lab):
            lab.record("hello")

        @pytest.mark.requires("xrc")
        def test_skipped(lab):
            pass
    """, "--lab", "model:roce", "--seed", "9", "--history-dir", str(hist),
        "--junitxml", str(junit))
    result.assert_outcomes(passed=1, skipped=1)
    files = sorted(p.name for p in hist.iterdir())
    assert files == ["test_gen.test_ok-model-roce.jsonl"]
    assert '"kind":"hello"' in (hist / files[0]).read_text()
    cases = {c.get("name"): {p.get("name"): p.get("value") for p in c.iter("property")}
             for c in ET.parse(junit).getroot().iter("testcase")}
    assert cases["test_ok[model-roce]"]["outcome"] == "passed"
    assert cases["test_ok[model-roce]"]["seed"] == "9"
    assert cases["test_ok[model-roce]"]["backend"] == "model"
    assert cases["test_ok[model-roce]"]["device"]
    assert cases["test_skipped[model-roce]"]["outcome"] == "skipped"


def test_wall_clock_safety_net(pytester):
    result = run(pytester, """
        import time

        def test_slow(lab):
            time.sleep(5)
    """, "--lab", "model:ib", "--rdmalab-timeout", "0.5")
    result.assert_outcomes(failed=1)
    assert "WallClockTimeout" in result.stdout.str()


def test_lab_factory_builds_other_shapes(pytester):
    result = run(pytester, """
        def test_three(lab_factory, personality):
            lab = lab_factory(hosts=("x", "y", "z"))
            assert sorted(lab.hosts) == ["x", "y", "z"]
            assert {h.caps().personality for h in lab.hosts.values()} == {personality}
            assert lab.replay.startswith("python3 -m rdmalab run")
    """, "--lab", "model:iwarp-siw")
    result.assert_outcomes(passed=1)


def test_requires_without_a_lab_fails(pytester):
    result = run(pytester, """
        import pytest

        @pytest.mark.requires("xrc")
        def test_x():
            pass
    """, "--lab", "model:ib")
    result.assert_outcomes(errors=1)
    assert "@requires needs a lab" in result.stdout.str()


def test_netns_lab_spec():
    """--lab netns:rxe is its own column; an unknown device is refused by name."""
    assert [s.id for s in parse_lab_option("netns:rxe")] == ["netns-rxe"]
    assert [s.option for s in parse_lab_option("netns")] == ["netns:rxe"]
    with pytest.raises(pytest.UsageError, match="unknown netns lab device mlx5"):
        parse_lab_option("netns:mlx5")


TWO_SCENARIOS = """
    def test_one(lab):
        pass

    def test_two(lab):
        pass
"""


def inventory_file(d, hosts: str):
    (d / "id_test").write_text("not a real key\n")
    (d / "known_hosts").write_text("")
    p = d / "lab.toml"
    p.write_text('[lab]\nknown_hosts = "known_hosts"\n' + hosts)
    return p


def host(name: str, port: int, extra: str = "") -> str:
    """An inventory [[host]] table; its data address comes from the name's digits ("h2" ->
    10.0.0.2), not from the port, which is random and would collide one time in 250."""
    return (f'\n[[host]]\nname = "{name}"\n'
            f'ssh = {{ user = "root", address = "127.0.0.1", port = {port}, '
            f'identity = "id_test" }}\ndevice = "rxe0"\nnetdev = "lo"\n{extra}'
            f'data_address = "10.0.0.{int(name.lstrip("h"))}"\n')


def assert_one_error_before_any_scenario(result, words):
    """pytest stopped before collecting (usage error), with one message and no traceback of
    the harness's own frames."""
    out, err = result.stdout.str(), result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out + err
    assert err.count("ERROR:") == 1, err
    for w in words:
        assert w in err, (w, err)
    for bad in ("ERROR at setup", "Traceback", "pytest_plugin.py", "inventory.py",
                "sshmachine.py", "test_one", "collected"):
        assert bad not in out + err, (bad, out + err)


def test_bad_inventory_is_one_error_before_any_scenario(pytester, tmp_path):
    """--lab inventory:BAD: the file's FILE:LINE: host "h1": field ... message once, as a
    usage error before any scenario, not an error at the setup of each."""
    p = inventory_file(tmp_path, host("h1", 2201, 'gid_index = "one"\n') + host("h2", 2202))
    line = p.read_text().splitlines().index('gid_index = "one"') + 1
    result = run(pytester, TWO_SCENARIOS, "--lab", f"inventory:{p}")
    assert_one_error_before_any_scenario(result, [
        f'{p}:{line}: host "h1": field gid_index: expected an integer >= 0, got "one"'])


def test_unreachable_inventory_hosts_are_one_error_before_any_scenario(pytester, tmp_path):
    """Every inventory host is tried once at the session's start: those ssh cannot reach are
    named, each with ssh's reason, in one usage error before any scenario."""
    if not shutil.which("ssh"):
        pytest.skip("openssh-client not installed")
    ports = []
    for _ in range(2):
        with socket.socket() as sock:  # a port nobody listens on: connection refused
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
    p = inventory_file(tmp_path, host("h1", ports[0]) + host("h2", ports[1]))
    first, second = [i + 1 for i, t in enumerate(p.read_text().splitlines()) if t == "[[host]]"]
    result = run(pytester, TWO_SCENARIOS, "--lab", f"inventory:{p}")
    assert_one_error_before_any_scenario(result, [
        f"--lab inventory:{p}: 2 of the inventory's 2 hosts cannot be reached",
        f'{p}:{first}: host "h1": ', f'{p}:{second}: host "h2": ', f"port {ports[0]}",
        f"port {ports[1]}", "Connection refused"])
