"""No secrets (README "Running on your own machines", issue 26): a value refused as a secret,
or any field whose name says it is one (rdmalab.run.inputs.is_secret_name), is never echoed: not
in a message, a traceback's locals, a history, JUnit, the report, an evidence bundle or a log.

Each test plants a fresh random secret and looks for it everywhere the refusal could have put
it: the exception's message and every frame of its traceback (what pytest prints with
--showlocals), and, for whole runs (pytest with the plugin, `rdmalab run`), stdout, stderr and
every file the run wrote.
"""
import os
import pathlib
import secrets
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINDINGS = ROOT / "bindings"

from rdmalab.machines import inventory
from rdmalab.machines.inventory import InventoryError, load

# A valid inventory: vm1 writes ssh and power as inline tables, vm2 ssh as dotted keys.
BASE = """\
[lab]
known_hosts = "known_hosts"

[[switch]]
name = "vmlab"
control = "/tmp/rdmalab-test-sw.ctl"

[[host]]
name = "vm1"
ssh = { user = "root", address = "127.0.0.1", port = 2222, identity = "id_ed25519" }
device = "rxe0"
netdev = "eth0"
data_address = "10.0.0.1"
power = { on = "true", off = "true", cycle = "true" }
wire = { via = "switch", switch = "vmlab" }

[[host]]
name = "vm2"
ssh.address = "127.0.0.1"
ssh.port = 2223
ssh.identity = "id_ed25519"
device = "rxe1"
gid_index = 3
netdev = "eth1"
data_address = "10.0.0.2"
"""

# Where a user can write a field: (text in BASE, the same with the secret S planted, the text
# that marks the line the message must name, the words the message must hold).
PLACES = {
    "ssh inline": ('port = 2222, identity', 'port = 2222, password = "S", identity',
                   'password = "S"', ['host "vm1": field ssh.password: ']),
    "ssh dotted": ('ssh.port = 2223\n', 'ssh.port = 2223\nssh.passphrase = "S"\n',
                   'ssh.passphrase', ['host "vm2": field ssh.passphrase: ']),
    "host field": ('netdev = "eth1"\n', 'netdev = "eth1"\nsudo_passwd = "S"\n', 'sudo_passwd',
                   ['host "vm2": field sudo_passwd: ']),
    "power command table": ('off = "true", cycle', 'off = "true", password = "S", cycle',
                            'password = "S"', ['host "vm1": field power.password: ']),
    "power sub-table": ('data_address = "10.0.0.2"\n', 'data_address = "10.0.0.2"\n'
                        '[host.power]\non = "true"\nipmi_password = "S"\n', 'ipmi_password',
                        ['host "vm2": field power.ipmi_password: ']),
    "lab table": ('known_hosts = "known_hosts"\n',
                  'known_hosts = "known_hosts"\napi_token = "S"\n', 'api_token',
                  ["[lab]: field api_token: "]),
    "switch table": ('control = "/tmp/rdmalab-test-sw.ctl"\n',
                     'control = "/tmp/rdmalab-test-sw.ctl"\nsecret = "S"\n', 'secret =',
                     ['switch "vmlab": field secret: ']),
    "top level": ('[lab]\n', 'password = "S"\n\n[lab]\n', 'password',
                  ["field password: "]),
    "multi-line string": ('netdev = "eth1"\n', 'netdev = "eth1"\npassphrase = """\nS\n"""\n',
                          'passphrase', ['host "vm2": field passphrase: ']),
    "a secret's table": ('data_address = "10.0.0.2"\n',
                         'data_address = "10.0.0.2"\n[host.secret]\nvalue = "S"\n',
                         '[host.secret]', ['host "vm2": field secret: ']),
    "a number": ('netdev = "eth0"\n', 'netdev = "eth0"\npass = S\n', 'pass =',
                 ['host "vm1": field pass: ']),
    "an array": ('netdev = "eth0"\n', 'netdev = "eth0"\ntokens = ["x", "S"]\n', 'tokens',
                 ['host "vm1": field tokens: ']),
}


def plant(place: str) -> tuple[str, str, int, list[str]]:
    """(inventory text, the secret, the line the message names, words it holds)."""
    old, new, marker, words = PLACES[place]
    assert BASE.count(old) == 1, old
    secret = str(secrets.randbelow(10**15) + 10**15) if place == "a number" \
        else "s3cr3t-" + secrets.token_hex(12)
    text = BASE.replace(old, new.replace("S", secret))
    line = next(i + 1 for i, t in enumerate(text.splitlines())
                if marker.replace("S", secret) in t)
    return text, secret, line, words


@pytest.fixture
def invdir(tmp_path):
    d = tmp_path / "inv"
    d.mkdir()
    (d / "id_ed25519").write_text("not a real key\n")
    (d / "known_hosts").write_text("")
    return d


def texts_in(value, depth: int = 0, seen=None):
    """Every string reachable from a value: what a traceback's locals could show."""
    seen = set() if seen is None else seen
    if id(value) in seen or depth > 8:
        return
    seen.add(id(value))
    if isinstance(value, (str, bytes)):
        yield value if isinstance(value, str) else value.decode(errors="replace")
        return
    if isinstance(value, (int, float)):
        yield repr(value)
        return
    yield repr(value) if type(value).__repr__ is not object.__repr__ else ""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from texts_in(k, depth + 1, seen)
            yield from texts_in(v, depth + 1, seen)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for v in value:
            yield from texts_in(v, depth + 1, seen)
    elif isinstance(getattr(value, "__dict__", None), dict) \
            and not isinstance(value, type) and type(value).__module__ != "builtins":
        yield from texts_in(vars(value), depth + 1, seen)


def shown_by_pytest(e) -> str:
    """What pytest prints for an exception with --showlocals --tb=long, from the first frame
    after the test's own (which planted the secret)."""
    e.traceback = e.traceback[1:]
    return str(e.getrepr(style="long", showlocals=True, chain=True))


def assert_not_in_exception(exc: BaseException, secret: str) -> None:
    """Neither the exception nor any exception chained to it (shown or not) nor any local of
    any harness frame their tracebacks went through holds the secret."""
    chain, todo = [], [exc]
    while todo:
        e = todo.pop()
        if e is None or any(e is c for c in chain):
            continue
        chain.append(e)
        todo += [e.__cause__, e.__context__]
    for e in chain:
        assert secret not in str(e) and secret not in repr(e.args), e
        tb = e.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if not code.co_filename.endswith(("test_py_secrets.py", "python_api.py")):
                for name, v in tb.tb_frame.f_locals.items():
                    for t in texts_in(v):
                        assert secret not in t, (f"{code.co_filename}:{code.co_name} local "
                                                 f"{name!r} holds the secret")
            tb = tb.tb_next


# ---- the loader -------------------------------------------------------------------------------

@pytest.mark.parametrize("place", list(PLACES), ids=list(PLACES))
def test_secret_refused_naming_its_place_never_its_value(invdir, place):
    text, secret, line, words = plant(place)
    p = invdir / "inv.toml"
    p.write_text(text)
    with pytest.raises(InventoryError) as e:
        load(p)
    msg = str(e.value)
    assert secret not in msg
    # What pytest would print for it, with every local of every frame:
    shown = shown_by_pytest(e)
    assert secret not in shown
    assert_not_in_exception(e.value, secret)
    assert e.value.__cause__ is None and e.value.__context__ is None
    assert msg.startswith(f"{p}:{line}: "), (msg, line)
    for w in words + ["secrets are refused", "identity file", "SSH agent"]:
        assert w in msg, (w, msg)


def test_a_secret_beside_other_errors_is_still_not_shown(invdir):
    """An unknown key and a bad value in the same file: the secret is refused first, and no
    message about the file shows it."""
    text, secret, line, _ = plant("host field")
    p = invdir / "inv.toml"
    p.write_text(text.replace("gid_index = 3", 'gid_index = "x"\ncolour = "red"'))
    with pytest.raises(InventoryError) as e:
        load(p)
    assert "sudo_passwd" in str(e.value) and secret not in str(e.value)
    assert_not_in_exception(e.value, secret)
    # A TOML syntax error elsewhere: refused for that, the secret not shown either.
    p.write_text(text.replace('device = "rxe1"', "device = rxe1"))
    with pytest.raises(InventoryError, match="TOML syntax") as e:
        load(p)
    assert secret not in shown_by_pytest(e)
    assert e.value.__context__ is None
    assert_not_in_exception(e.value, secret)


def test_the_secret_rule_is_inputs_rule():
    """The rule (one home, rdmalab.machines.inventory; rdmalab.run.inputs asks it) on names a user writes."""
    from rdmalab.run import inputs
    secret = ["password", "passwd", "Passphrase", "pass", "PASS", "secret", "client_secret",
              "api_token", "tokens", "sudo_password", "ipmi_passwd"]
    plain = ["passive", "address", "user", "port", "identity", "host_key_alias", "on", "off",
             "cycle", "name", "control", "known_hosts", "agent_dir", "via", "switch", "bridge",
             "passage"]
    for name in secret:
        assert inputs.is_secret_name(name) and inventory.is_secret_name(name), name
    for name in plain:
        assert not inputs.is_secret_name(name), name


def test_inputs_refuses_without_showing_it(invdir):
    """rdmalab.run.inputs (every command and the plugin read inventories through it)."""
    from rdmalab.run import inputs
    text, secret, line, _ = plant("ssh inline")
    p = invdir / "inv.toml"
    p.write_text(text)
    for call in (lambda: inputs.inventory(str(p)), lambda: inputs.lab(f"inventory:{p}"),
                 lambda: inputs.labs(["model:roce", "inventory:inv.toml"], str(invdir))):
        with pytest.raises(inputs.BadInput) as e:
            call()
        assert str(e.value).startswith(f"{p}:{line}: ") and secret not in str(e.value)
        assert secret not in shown_by_pytest(e)
        assert_not_in_exception(e.value, secret)


# ---- whole runs: every output and every file ----------------------------------------------------

SCENARIOS = """\
def test_tiny(lab):
    assert lab.host("a") is not None


def test_other(lab):
    pass
"""


def files_holding(root: pathlib.Path, secret: str) -> list[str]:
    """Every file under root whose bytes hold the secret (names too)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            if secret in n:
                found.append(os.path.join(dirpath, n))
        for n in filenames:
            path = pathlib.Path(dirpath, n)
            try:
                if secret.encode() in path.read_bytes():
                    found.append(str(path))
            except OSError:
                pass
    return found


def run_env(tmp: pathlib.Path) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(BINDINGS), os.environ.get("PYTHONPATH")) if p))
    env["TMPDIR"] = str(tmp)  # a temporary file the run makes is walked too
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    return env


def plugin_run(out: pathlib.Path, lab: str, *extra: str) -> subprocess.CompletedProcess:
    """pytest with the plugin on two tiny scenarios, writing everything under out."""
    (out / "tmp").mkdir(parents=True, exist_ok=True)
    tests = out / "scenarios" / "test_tiny.py"
    tests.parent.mkdir(exist_ok=True)
    tests.write_text(SCENARIOS)
    argv = [sys.executable, "-m", "pytest", "-p", "rdmalab.run.pytest_plugin", str(tests),
            "--lab", lab, "--junitxml", str(out / "junit.xml"), "-o", "junit_logging=all",
            "--history-dir", str(out / "history"), "--evidence-dir", str(out / "evidence"),
            "--rootdir", str(out), "-o", f"cache_dir={out / 'cache'}", *extra]
    return subprocess.run(argv, cwd=out, env=run_env(out / "tmp"), capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL)


def check_run_output(out: pathlib.Path, r, secret: str) -> None:
    text = r.stdout + r.stderr
    assert secret not in text, text
    junit = out / "junit.xml"
    if junit.exists():  # a run that got that far: its report is one more output
        from rdmalab.report import html as html_report
        try:
            html_report.write(out, junit)
        except Exception as e:  # noqa: BLE001 - a page that cannot be built shows nothing
            print(f"report.html not built: {e}")
    assert files_holding(out, secret) == []


@pytest.mark.parametrize("traceback", [[], ["-l", "--tb=long"]], ids=["default", "showlocals"])
def test_pytest_run_with_a_secret_in_the_inventory(invdir, tmp_path, traceback):
    text, secret, line, words = plant("ssh inline")
    p = invdir / "that.toml"
    p.write_text(text)
    out = tmp_path / "out"
    r = plugin_run(out, f"inventory:{p}", *traceback)
    check_run_output(out, r, secret)
    assert r.returncode != 0
    assert f"{p}:{line}: host \"vm1\": field ssh.password: secrets are refused" in r.stderr, \
        r.stdout + r.stderr
    assert "ERROR at setup" not in r.stdout and "Traceback" not in r.stdout + r.stderr


@pytest.mark.parametrize("place", ["power command table", "lab table", "switch table",
                                   "a secret's table"])
def test_pytest_run_with_a_secret_elsewhere(invdir, tmp_path, place):
    text, secret, line, words = plant(place)
    p = invdir / "that.toml"
    p.write_text(text)
    out = tmp_path / "out"
    r = plugin_run(out, f"inventory:{p}", "-l")
    check_run_output(out, r, secret)
    assert r.returncode != 0 and f"{p}:{line}: {words[0]}" in r.stderr, r.stdout + r.stderr


def test_rdmalab_run_with_a_secret_in_the_inventory(invdir, tmp_path):
    """`rdmalab run` checks the lab before pytest starts (cli.py, rdmalab.run.inputs): exit 2,
    one line naming the file, the line and the field; nothing written shows the secret."""
    text, secret, line, _ = plant("ssh inline")
    p = invdir / "that.toml"
    p.write_text(text)
    out = tmp_path / "out"
    (out / "tmp").mkdir(parents=True)
    tests = tmp_path / "scenarios" / "test_tiny.py"
    tests.parent.mkdir()
    tests.write_text(SCENARIOS)
    r = subprocess.run([sys.executable, "-m", "rdmalab", "run", "--lab",
                        f"inventory:{os.path.relpath(p, tmp_path)}", "--out", "out",
                        str(tests)], cwd=tmp_path, env=run_env(out / "tmp"),
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    check_run_output(out, r, secret)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{p}:{line}: host \"vm1\": field ssh.password: secrets are refused" in r.stderr, \
        r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    assert not (out / "junit.xml").exists()  # nothing ran

