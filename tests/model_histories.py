"""The model suite's histories for one seed, as a manifest of digests: the behaviour check of a
restructuring (issue 28), which must change no byte of them.

    python3 tests/model_histories.py write MANIFEST [--seed N] [--keep DIR]
    python3 tests/model_histories.py compare MANIFEST [--seed N] [--keep DIR]

Both run `pytest tests/scenarios --lab model --seed N --history-dir DIR` (the model's clock is
virtual, so a seed gives the same records in every run) and hash each history file. `write`
stores {"seed", "histories": {file name: sha256}} as JSON; `compare` runs again and prints each
history that differs, is missing or is new, then exits 1 if any did (0 when all match, 2 when
the suite itself failed). --keep DIR keeps the histories there (to diff two runs' files).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run_suite(seed: int, out: pathlib.Path) -> int:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'bindings'}:{ROOT}")
    cmd = [sys.executable, "-m", "pytest", "-p", "rdmalab.run.pytest_plugin", "-q", "-p",
           "no:cacheprovider", str(ROOT / "tests" / "scenarios"), "--lab", "model",
           "--seed", str(seed), "--history-dir", str(out), "-n", "2"]
    return subprocess.run(cmd, cwd=ROOT, env=env, timeout=3600).returncode


def digests(out: pathlib.Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.iterdir()) if p.is_file() and p.suffix == ".jsonl"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["write", "compare"])
    ap.add_argument("manifest", type=pathlib.Path)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", type=pathlib.Path, default=None)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rdmalab-histories-") as tmp:
        out = a.keep or pathlib.Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        rc = run_suite(a.seed, out)
        if rc != 0:
            print(f"model_histories: the model suite failed (pytest rc {rc})", file=sys.stderr)
            return 2
        got = digests(out)
    if not got:
        print("model_histories: the suite wrote no history", file=sys.stderr)
        return 2
    if a.action == "write":
        a.manifest.write_text(json.dumps({"seed": a.seed, "histories": got}, indent=1,
                                         sort_keys=True) + "\n")
        print(f"model_histories: {len(got)} histories of seed {a.seed} in {a.manifest}")
        return 0
    want = json.loads(a.manifest.read_text())
    if want.get("seed") != a.seed:
        print(f"model_histories: {a.manifest} is of seed {want.get('seed')}, not {a.seed}",
              file=sys.stderr)
        return 2
    want = want["histories"]
    bad = ([f"differs: {n}" for n in sorted(want.keys() & got.keys()) if want[n] != got[n]]
           + [f"missing: {n}" for n in sorted(want.keys() - got.keys())]
           + [f"new: {n}" for n in sorted(got.keys() - want.keys())])
    for line in bad:
        print(line)
    print(f"model_histories: {len(got)} histories, {len(bad)} not as in {a.manifest}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
