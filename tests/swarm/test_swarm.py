"""A bounded swarm on the model (make test's ~60 s one): every personality in turn, every
seed's history judged by every checker. A failing seed fails this test with its replay
command (the CLI prints it and writes the schedule and its shrunk form)."""
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_bounded_swarm_on_every_personality(tmp_path):
    minutes = os.environ.get("RDMALAB_SWARM_MINUTES", "1")
    out = pathlib.Path(os.environ.get("RDMALAB_SWARM_OUT", tmp_path / "swarm"))
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'bindings'}:{REPO}")
    p = subprocess.run([sys.executable, "-m", "rdmalab", "swarm", "--lab", "model",
                        "--minutes", minutes, "--out", str(out)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=float(minutes) * 60 + 600)
    print(p.stdout[-4000:], p.stderr[-2000:])
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert "0 failed" in p.stdout
