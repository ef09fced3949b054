"""python3 -m bench [--only SECTION ...] [--out out/bench]: runs the benchmark sections and
prints every figure beside its same-run reference (bench/report.py)."""
from __future__ import annotations

import argparse
import importlib
import pathlib
import sys
import traceback

from .report import Figure, table, write_json

# Each section is a module bench/<name>.py with run(args) -> list[Figure].
SECTIONS = ["traffic", "model", "labs", "switch", "swarm", "ulp"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench", description=__doc__)
    p.add_argument("--only", action="append", choices=SECTIONS,
                   help="run only this section (repeatable)")
    p.add_argument("--out", default="out/bench", help="folder for bench.json and logs")
    p.add_argument("--build", default="build", help="the CMake build folder")
    p.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    args = p.parse_args(argv)
    args.out = pathlib.Path(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    figures: list[Figure] = []
    failed = []
    for name in args.only or SECTIONS:
        print(f"== bench {name}", flush=True)
        try:
            mod = importlib.import_module(f"bench.{name}")
            got = mod.run(args)
        except Exception as e:  # a section that cannot run says why; the others still run
            traceback.print_exc()
            failed.append(f"{name}: {type(e).__name__}: {e}")
            continue
        figures.extend(got)
        print(table(got), flush=True)
    write_json(figures, args.out / "bench.json")
    print("\n== rdmalab bench: every figure beside its same-run reference")
    print(table(figures))
    for f in failed:
        print(f"bench section failed: {f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
