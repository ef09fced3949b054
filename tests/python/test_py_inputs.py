"""rdmalab.run.inputs and the commands' bad-input path: every refusal is one line naming the value,
exit status 2, no traceback, and nothing run (issue 26)."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rdmalab.run import cli, inputs
from rdmalab.run.inputs import BadInput

BINDINGS = Path(__file__).resolve().parents[2] / "bindings"
SCHEDULES = BINDINGS.parent / "tests" / "swarm" / "schedules"


def main(argv, capsys) -> tuple[int, str, str]:
    """cli.main in this process: (status, stdout, stderr); argparse's own refusals exit 2."""
    try:
        rc = cli.main(argv)
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def refused(argv, capsys, *words) -> str:
    rc, out, err = main(argv, capsys)
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in out + err
    for w in words:
        assert w in err, (w, err)
    return err


def schedule_file(tmp_path, **change) -> Path:
    obj = {"rdmalab_schedule": 1, "hosts": ["a", "b"], "seed": 3, "steps": [
        {"op": "connect", "conn": "c0", "client": "a", "server": "b"},
        {"op": "disconnect", "conn": "c0", "side": "client"}]}
    obj.update(change)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(obj))
    return path


# ---- labs ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, words", [
    ("bogus", ["unknown lab 'bogus'"]),
    ("vm:", ["nothing after the colon"]),
    ("netns:", ["nothing after the colon"]),
    ("model:", ["nothing after the colon"]),
    ("inventory:", ["nothing after the colon"]),
    ("inventory", ["give the inventory file"]),
    ("model:nosuch", ["unknown personality nosuch"]),
    ("model:roce,,ib", ["empty name"]),
    ("vm:mlx5", ["unknown VM lab device mlx5"]),
    ("inventory:/nonexistent.toml", ["no inventory file /nonexistent.toml"]),
    ("", ["name a lab"]),
])
def test_lab_refusals_name_the_lab(text, words):
    with pytest.raises(BadInput) as e:
        inputs.lab(text)
    for w in words:
        assert w in str(e.value)


def test_labs_are_made_canonical(tmp_path):
    assert inputs.labs(None) == ["model"]
    assert inputs.labs(["vm", "vm"]) == ["vm"]
    assert inputs.lab("model:roce,ib") == "model:roce,ib"
    assert inputs.lab_parts("vm") == ("vm", ["rxe"])
    assert inputs.lab_parts("model")[1] == inputs.personalities()
    (tmp_path / "lab.toml").write_text("")
    kind, names = inputs.lab_parts("inventory:lab.toml", cwd=str(tmp_path))
    assert (kind, names) == ("inventory", [str(tmp_path / "lab.toml")])


def test_numbers_durations_mutations_kernels():
    assert inputs.count(3, "--seeds") == 3
    for bad in (0, -3, True, 2.5, "4"):
        with pytest.raises(BadInput, match="--seeds"):
            inputs.count(bad, "--seeds")
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(BadInput, match="--minutes"):
            inputs.duration(bad, "--minutes")
    assert inputs.mutations(["missing_disconnected"] * 2) == ["missing_disconnected"]
    with pytest.raises(BadInput, match="unknown mutation; known: .*missing_disconnected"):
        inputs.mutations(["nosuch"])
    assert inputs.kernel("sid") == "sid"
    assert inputs.kernel("6.12.117+deb13-amd64") == "6.12.117+deb13-amd64"
    with pytest.raises(BadInput, match="a Debian suite"):
        inputs.kernel("bookwurm")
    with pytest.raises(BadInput, match="HOST:PORT"):
        inputs.host_port("localhost", "--metrics-listen")


def test_secret_names():
    for name in ("password", "ssh_password", "Passphrase", "api_token", "pass", "secret"):
        assert inputs.is_secret_name(name)
    for name in ("passive", "address", "user", "port"):
        assert not inputs.is_secret_name(name)


# ---- commands --------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, words", [
    (["swarm", "--lab", "model:roce", "--seeds", "0"], ["--seeds 0: must be 1 or more"]),
    (["swarm", "--lab", "model:roce", "--seeds", "-3"], ["--seeds -3"]),
    (["swarm", "--lab", "model:roce", "--minutes", "-1"], ["--minutes -1"]),
    (["swarm", "--lab", "model:roce", "--minutes", "0"], ["--minutes 0: must be more than 0"]),
    (["swarm", "--lab", "model:roce", "--mutation", "nosuch"], ["unknown mutation"]),
    (["swarm", "--lab", "bogus"], ["unknown lab 'bogus'"]),
    (["swarm", "--lab", "inventory:/nonexistent.toml"], ["no inventory file"]),
    (["swarm", "--lab", "vm:"], ["nothing after the colon"]),
    (["swarm", "--lab", "model:nosuch"], ["unknown personality nosuch"]),
    (["swarm", "--lab", "model", "--workers", "0"], ["--workers 0"]),
    (["swarm", "--lab", "model", "--steps", "0"], ["--steps 0"]),
    (["swarm", "--lab", "model", "--kernel", "nosuch"], ["--kernel 'nosuch'"]),
    (["run", "--lab", "bogus"], ["unknown lab"]),
    (["run", "--lab", "vm:"], ["nothing after the colon"]),
    (["run", "--vm-hosts", "0"], ["--vm-hosts 0"]),
    (["run", "--seed", "-1"], ["--seed -1"]),
    (["run", "--timeout", "0"], ["--timeout 0"]),
    (["run", "--metrics-listen", "nowhere"], ["HOST:PORT"]),
    (["run", "/nonexistent/tests"], ["no such file or directory"]),
    (["run", "--out", ""], ["--out '': name a folder"]),
    (["swarm", "--lab", "model", "--out", "/etc/hostname"], ["not a directory"]),
    (["report", "/nonexistent/out"], []),
    (["findings", "--registry", "/nonexistent.toml"], ["cannot read the findings registry"]),
    (["matrix", "--kernel", "bookwurm", "--table-only"], ["--kernel 'bookwurm'"]),
    (["matrix", "--table-only", "--out", "/nonexistent/m"], ["no junit.xml"]),
    (["replay", "/nonexistent.json", "--lab", "model:roce"], ["cannot read"]),
])
def test_commands_refuse_bad_input_with_status_2(argv, words, capsys, tmp_path):
    refused(argv, capsys, *words)


def test_replay_refuses_a_mutation_and_a_malformed_schedule(tmp_path, capsys):
    good = schedule_file(tmp_path)
    refused(["replay", str(good), "--lab", "model:roce", "--mutation", "nosuch"], capsys,
            "unknown mutation")
    bad = schedule_file(tmp_path, settle_ns=-1)
    refused(["replay", str(bad), "--lab", "model:roce"], capsys, "settle_ns")


def test_argparse_refusals_are_status_2(capsys):
    rc, out, err = main(["swarm", "--lab", "model", "--seeds", "many"], capsys)
    assert rc == 2 and "invalid int value" in err
    rc, out, err = main(["nosuch"], capsys)
    assert rc == 2


def test_every_help_names_the_exit_statuses(capsys):
    for argv in (["--help"], ["run", "--help"], ["report", "--help"], ["findings", "--help"],
                 ["swarm", "--help"], ["replay", "--help"], ["matrix", "--help"]):
        rc, out, _ = main(argv, capsys)
        assert rc == 0, argv
        flat = " ".join(out.split())
        assert "0 passed" in flat and "2 bad input" in flat, (argv, out[-400:])


def test_a_harness_bug_is_named_as_one(capsys):
    def boom():
        raise KeyError("x")
    assert inputs.guard("run", boom) == 3
    err = capsys.readouterr().err
    assert "internal error (a bug in rdmalab" in err


def test_relative_inventory_path_is_the_callers(tmp_path):
    """The README's example uses a relative path: it is taken from the caller's directory, not
    the checkout's (cli.py runs pytest from the checkout)."""
    (tmp_path / "rel.toml").write_text("[[host]]\nname = \"h1\"\nnosuch = 1\n")
    env = {"PYTHONPATH": str(BINDINGS), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "rdmalab", "run", "--lab", "inventory:rel.toml",
                        "--out", "o"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{tmp_path}/rel.toml:" in r.stderr, r.stderr
    assert "nosuch" in r.stderr and "Traceback" not in r.stdout + r.stderr
    assert not (tmp_path / "o" / "junit.xml").exists()  # nothing ran


def test_a_bad_lab_never_reaches_pytest(tmp_path):
    """`swarm --lab inventory:/nonexistent.toml` used to go to a pytest subprocess that said
    "no result" and exited 1."""
    env = {"PYTHONPATH": str(BINDINGS), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "rdmalab", "swarm", "--lab",
                        "inventory:/nonexistent.toml", "--out", str(tmp_path / "o")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert not (tmp_path / "o" / "device").exists()


def test_a_run_selecting_nothing_is_bad_input(tmp_path, capsys):
    scen = tmp_path / "scen"
    scen.mkdir()
    (scen / "test_one.py").write_text(textwrap.dedent("""
        def test_one(lab):
            pass
    """))
    env = {"PYTHONPATH": str(BINDINGS), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "rdmalab", "run", "--lab", "model:roce",
                        "-k", "nothing_matches", "--out", "o", "scen"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no scenario selected" in r.stderr, r.stdout + r.stderr
