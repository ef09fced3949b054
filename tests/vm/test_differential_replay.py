"""make test's differential replay on rxe (issue 17): one schedule (tests/swarm/schedules/)
replayed by `python3 -m rdmalab replay` on the rxe guests of the inventory and on the model's
roce personality, which must predict every user-visible outcome: each side's rdma_cm events
and statuses, each work request's completion status, the async events and each step's result.
A difference fails the test and is left in OUT/candidates/ with both histories."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCHEDULE = ROOT / "tests" / "swarm" / "schedules" / "rxe-send-write-read-close.json"


def test_the_model_predicts_rxe_for_one_schedule(inventory, tmp_path):
    out = pathlib.Path(os.environ.get("RDMALAB_REPLAY_OUT", tmp_path / "replay"))
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'bindings'}:{ROOT}")
    p = subprocess.run([sys.executable, "-m", "rdmalab", "replay", str(SCHEDULE),
                        "--lab", "model:roce", "--lab", f"inventory:{inventory}",
                        "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=900, stdin=subprocess.DEVNULL)
    print(p.stdout, p.stderr)
    assert "model:roce: 15 steps" in p.stdout and "every checker valid" in p.stdout
    assert "device valid; model:roce valid; 0 difference(s)" in p.stdout, p.stdout + p.stderr
    assert p.returncode == 0, p.stdout + p.stderr
