"""Fuzzing what users hand over (issue 26, item 6): random mutations of valid schedules,
inventories, wire rule specs and command lines, drawn from the swarm's own seeded generator
(random.Random(seed); the valid schedules are swarm.draw's). Each input must be accepted or
refused with the documented error; each command must end within its deadline with exit 0, 1
or 2 and never a traceback. A failing input is written under RDMALAB_SWARM_OUT/input-fuzz (or
the test's tmp folder) and named in the failure, so it replays by hand.

RDMALAB_FUZZ_SEED picks the run (default 1); RDMALAB_FUZZ_SCALE multiplies the counts."""
from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import random
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from rdmalab.run import cli, inputs
from rdmalab.errors import FaultNotSupported
from rdmalab.labs.engine import MUTATIONS, model_lab, personalities
from rdmalab.schedules import Schedule, ScheduleError, swarm

REPO = Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("RDMALAB_FUZZ_SEED", "1"))
SCALE = float(os.environ.get("RDMALAB_FUZZ_SCALE", "1"))
N_SCHEDULES, N_INVENTORIES, N_RULES, N_ARGV, N_PROCESSES = (
    int(n * SCALE) for n in (3000, 1000, 1000, 400, 12))
RUN_DEADLINE_S = 30      # one in-process command (a model replay of a short schedule)
PROCESS_DEADLINE_S = 120  # one command as a process (its interpreter start included)
SECRET = "fuzz-secret-7d1e4b"

# Values a mutation puts in place of another: other types, edges, near-miss names.
ODD_VALUES = [None, True, False, 0, -1, -(2 ** 63), 2 ** 64, 1.5, math.inf, "", " ", "x" * 300,
              [], {}, [1, "a"], {"k": 1}, "DREQ_SNET", "DISCONECTED", "ibv_destroy_qpx",
              "QP_FATAL", "TIMEWAIT", "DREQ", "SEND", "client", "server", "a", "b", "c0",
              "nosuch", "../../etc/passwd", "a\nb", "\x00", "é"]
EXTRA_KEYS = ["nosuch", "password", "at", "may_miss", "n", "ns", "within_ns", "moment"]


def out_dir(tmp_path) -> Path:
    base = os.environ.get("RDMALAB_SWARM_OUT")
    d = Path(base) / "input-fuzz" if base else tmp_path
    d.mkdir(parents=True, exist_ok=True)
    return d


# ---- the mutator -----------------------------------------------------------------------------

def _paths(value, path=()):
    """Every place in a JSON-like value: (path, value)."""
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, path + (i,))


def _get(value, path):
    for k in path:
        value = value[k]
    return value


def odd(rng: random.Random):
    return copy.deepcopy(rng.choice(ODD_VALUES))  # never one object in two places


def mutate(value, rng: random.Random):
    """One to three random changes to a JSON-like value (a deep copy is changed)."""
    value = json.loads(json.dumps(value))
    for _ in range(rng.randint(1, 3)):
        places = list(_paths(value))
        path, here = rng.choice(places)
        kind = rng.randrange(7)
        if not path:
            if isinstance(here, dict) and kind < 3:
                here[rng.choice(EXTRA_KEYS)] = odd(rng)
            continue
        parent, key = _get(value, path[:-1]), path[-1]
        if kind == 0 and isinstance(parent, dict):
            del parent[key]
        elif kind == 0 and isinstance(parent, list):
            parent.pop(key)
        elif kind == 1 and isinstance(here, int) and not isinstance(here, bool):
            parent[key] = rng.choice((-here, -1, here * 2 ** 40, 0))
        elif kind == 2 and isinstance(here, dict):
            here[rng.choice(EXTRA_KEYS)] = odd(rng)
        elif kind == 3 and isinstance(parent, list):
            parent.insert(key, json.loads(json.dumps(here)))
        elif kind == 4 and isinstance(here, str):
            parent[key] = here[:-1] if len(here) > 1 and rng.random() < 0.5 else here + "X"
        else:
            parent[key] = odd(rng)
    return value


def mutate_text(text: str, rng: random.Random) -> str:
    """A change to the bytes: a cut, a lost or doubled line, a stray character."""
    lines = text.splitlines(keepends=True)
    kind = rng.randrange(4)
    if kind == 0:
        return text[:rng.randrange(len(text) + 1)]
    if kind == 1 and lines:
        del lines[rng.randrange(len(lines))]
    elif kind == 2 and lines:
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
    else:
        i = rng.randrange(len(text) + 1)
        return text[:i] + rng.choice("{}[]\",=:#\n\\x0") + text[i:]
    return "".join(lines)


# ---- running one command in this process, with a deadline ------------------------------------

class Deadline(Exception):
    pass


def _alarm(signum, frame):
    raise Deadline()


def command(argv: list[str]) -> tuple[int, str]:
    """rdmalab's cli.main in this process: (exit status, everything it printed)."""
    buf = io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(RUN_DEADLINE_S)
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            try:
                rc = cli.main(argv)
            except SystemExit as e:  # argparse's refusals and --help
                rc = e.code if isinstance(e.code, int) else 2
    except Deadline:
        rc = None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return rc, buf.getvalue()


def judge(rc, printed: str, what: str, keep: Path) -> None:
    assert rc is not None, f"{what}: no end within {RUN_DEADLINE_S} s ({keep})"
    assert rc in (0, 1, 2), f"{what}: exit {rc} ({keep}):\n{printed[-2000:]}"
    assert "Traceback" not in printed, f"{what}: a traceback ({keep}):\n{printed[-3000:]}"


# ---- schedules -------------------------------------------------------------------------------

def test_mutated_schedules(tmp_path):
    """Mutated swarm schedules: Schedule.load accepts each or raises ScheduleError; replay ends
    in time with 0, 1 or 2 and no traceback, on the model."""
    rng, out = random.Random(SEED), out_dir(tmp_path)
    every = personalities()
    counts = {"refused": 0, "accepted": 0, "replayed": 0}
    for n in range(N_SCHEDULES):
        p = rng.choice(every)
        base = swarm.draw(rng.randrange(1, 10 ** 6), p, rng.randint(1, 10)).to_json()
        text = json.dumps(mutate(base, rng))
        if rng.random() < 0.1:
            text = mutate_text(text, rng)
        path = out / f"schedule-{n}.json"
        path.write_text(text)
        try:
            Schedule.load(path)
            counts["accepted"] += 1
        except ScheduleError as e:
            counts["refused"] += 1
            assert str(e).startswith(str(path)), f"{path}: the refusal names no file: {e}"
            if rng.random() > 0.02:  # a few refusals through the command too
                path.unlink()
                continue
        lab = f"model:{p}" if rng.random() < 0.9 else "model"
        argv = ["replay", str(path), "--lab", lab, "--out", str(out / "replay")]
        if rng.random() < 0.1:
            argv += ["--mutation", rng.choice(sorted(MUTATIONS))]
        rc, printed = command(argv)
        judge(rc, printed, f"replay {path}", path)
        counts["replayed"] += 1
        path.unlink()
    print(f"schedules: {counts}")
    assert counts["refused"] > N_SCHEDULES // 4 and counts["accepted"] > N_SCHEDULES // 10


# ---- inventories -----------------------------------------------------------------------------

def draw_inventory(rng: random.Random, d: Path) -> dict:
    """A valid inventory as plain dicts (rdmalab.machines.inventory.dumps writes it)."""
    (d / "known_hosts").touch()
    (d / "id").touch()
    hosts = []
    for i in range(rng.randint(1, 3)):
        h = {"name": f"h{i}", "ssh": {"address": f"192.0.2.{i + 1}", "user": "root",
                                     "identity": str(d / "id"), "port": rng.choice((22, 2222))},
             "device": rng.choice(("rxe0", "siw0", "mlx5_0")), "netdev": f"eth{i}",
             "data_address": f"10.0.0.{i + 1}"}
        if rng.random() < 0.5:
            h["gid_index"] = rng.randint(0, 3)
        if rng.random() < 0.3:
            h["power"] = {"cycle": "true"}
        hosts.append(h)
    return {"hosts": hosts, "lab": {"known_hosts": str(d / "known_hosts")}}


def test_mutated_inventories(tmp_path):
    """Mutated inventories (as data and as text): inputs.inventory accepts each or raises
    BadInput naming the file; a planted secret is never in the message."""
    from rdmalab.machines.inventory import dumps
    rng, out = random.Random(SEED + 1), out_dir(tmp_path)
    refused = 0
    for n in range(N_INVENTORIES):
        inv = draw_inventory(rng, tmp_path)
        data = mutate(inv, rng)
        hosts = data.get("hosts")
        if rng.random() < 0.2 and isinstance(hosts, list) and hosts:  # a planted secret
            host = hosts[0]
            if isinstance(host, dict):
                where = host.get("ssh") if isinstance(host.get("ssh"), dict) else host
                where[rng.choice(("password", "passphrase", "ssh_password", "token"))] = SECRET
        path = out / f"inventory-{n}.toml"
        try:
            text = dumps(hosts if isinstance(hosts, list) else [],
                         lab=data.get("lab") if isinstance(data.get("lab"), dict) else None)
        except Exception:  # noqa: BLE001 - dumps takes well-formed data only: mutate the text
            text = dumps(inv["hosts"], lab=inv["lab"])
        if rng.random() < 0.4:
            text = mutate_text(text, rng)
        path.write_text(text)
        try:
            inputs.inventory(str(path))
        except inputs.BadInput as e:
            refused += 1
            assert str(path) in str(e), f"{path}: the refusal names no file: {e}"
            assert SECRET not in str(e), f"{path}: the refusal shows the secret: {e}"
        else:
            assert SECRET not in path.read_text() or _secret_is_not_a_field(path), \
                f"{path}: a secret was accepted"
        path.unlink()
    print(f"inventories: {refused} of {N_INVENTORIES} refused")
    assert refused > N_INVENTORIES // 4


def _secret_is_not_a_field(path: Path) -> bool:
    """The planted secret may have landed inside another value (a cut text): not a field."""
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError:
        return True
    return not any(inputs.is_secret_name(str(k)) for p, _ in _paths(data) for k in p)


# ---- wire rule specs -------------------------------------------------------------------------

def test_mutated_rule_specs():
    """Mutated rule objects from the swarm's rule steps: lab.faults.rule installs each or
    raises ValueError (naming the key) or FaultNotSupported, nothing else."""
    rng = random.Random(SEED + 2)
    rules = []
    for seed in range(1, 400):
        rules += [st["rule"] for st in swarm.draw(seed, "roce").steps if st["op"] == "rule"]
    assert rules
    refused = 0
    with model_lab(seed=1, hosts=("a", "b"), personality="roce") as lab:
        for _ in range(N_RULES):
            spec = mutate(rng.choice(rules), rng)
            try:
                lab.faults.rule(spec).remove()
            except (ValueError, TypeError, FaultNotSupported) as e:
                refused += 1
                assert str(e), f"{spec}: an empty refusal"
    print(f"rules: {refused} of {N_RULES} refused")
    assert refused > N_RULES // 4


# ---- command lines ---------------------------------------------------------------------------

def draw_argv(rng: random.Random, d: Path) -> list[str]:
    """A command line of every command that runs nothing on a device: each option absent, a
    valid value or an odd one."""
    sched = swarm.draw(rng.randrange(1, 1000), "roce", 4).dump(d / "s.json")
    bad_inv = d / "bad.toml"
    bad_inv.write_text('[[host]]\nname = "h1"\nssh = { password = "%s" }\n' % SECRET)
    odd = ["", "-1", "0", "1e9", "nan", "x", "--", "--lab", "model:", "vm:", "bogus",
           f"inventory:{bad_inv}", "inventory:/nonexistent.toml", "model:nosuch"]

    def pick(*good):
        return rng.choice(good) if rng.random() < 0.7 else rng.choice(odd)
    cmd = rng.choice(("swarm", "replay", "report", "findings", "matrix", "help"))
    if cmd == "swarm":
        argv = ["swarm", "--lab", pick("model:roce", "model:ib", "model:iwarp-siw"),
                "--seeds", pick("1", "2"), "--steps", pick("3", "8"), "--out", str(d / "sw"),
                "--workers", pick("1")]
        if rng.random() < 0.3:
            argv += ["--minutes", pick("0.001")]
        if rng.random() < 0.3:
            argv += ["--mutation", pick(*sorted(MUTATIONS))]
        argv += ["--no-shrink"]
    elif cmd == "replay":
        argv = ["replay", pick(str(sched), str(d / "nosuch.json")), "--lab",
                pick("model:roce", "model"), "--out", str(d / "rp")]
        if rng.random() < 0.3:
            argv += ["--mutation", pick(*sorted(MUTATIONS))]
    elif cmd == "report":
        argv = ["report", pick(str(d / "nosuch"), str(d))]
    elif cmd == "findings":
        argv = ["findings", "--registry", pick(str(REPO / "bindings/rdmalab/findings/findings.toml"),
                                               str(bad_inv))]
    elif cmd == "matrix":  # as it is: a lost --table-only would run the VM lab
        return ["matrix", "--table-only", "--out", pick(str(d / "m")),
                "--kernel", pick("bookworm", "sid")]
    else:  # as it is: without its --help, `run` would run the whole scenario suite
        return [rng.choice(("--help", "run", "nosuch", "swarm", "replay", "")), "--help"]
    for _ in range(rng.randint(0, 2)):  # a token lost, doubled or replaced
        i = rng.randrange(len(argv))
        k = rng.randrange(3)
        if k == 0 and len(argv) > 1:
            del argv[i]
        elif k == 1:
            argv.insert(i, argv[i])
        else:
            argv[i] = rng.choice(odd)
    return argv


def test_mutated_command_lines(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative or empty --out lands here, never in the checkout
    rng, d = random.Random(SEED + 3), tmp_path
    statuses = {}
    for _ in range(N_ARGV):
        argv = draw_argv(rng, d)
        rc, printed = command(argv)
        judge(rc, printed, f"rdmalab {' '.join(argv)}", d)
        assert SECRET not in printed, f"rdmalab {' '.join(argv)}: printed the secret"
        statuses[rc] = statuses.get(rc, 0) + 1
    print(f"command lines: exit statuses {statuses}")
    assert statuses.get(2, 0) > N_ARGV // 10 and statuses.get(0, 0) > N_ARGV // 20


def test_mutated_command_lines_as_processes(tmp_path):
    """A few as real processes: the interpreter's own exit path, with a deadline."""
    rng = random.Random(SEED + 4)
    env = dict(os.environ, PYTHONPATH=str(REPO / "bindings"))
    for _ in range(N_PROCESSES):
        argv = draw_argv(rng, tmp_path)
        try:
            r = subprocess.run([sys.executable, "-m", "rdmalab", *argv], env=env, cwd=tmp_path,
                               capture_output=True, text=True, timeout=PROCESS_DEADLINE_S,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            pytest.fail(f"rdmalab {' '.join(argv)}: no end within {PROCESS_DEADLINE_S} s")
        printed = r.stdout + r.stderr
        assert r.returncode in (0, 1, 2), (argv, r.returncode, printed[-2000:])
        assert "Traceback" not in printed and SECRET not in printed, (argv, printed[-3000:])
