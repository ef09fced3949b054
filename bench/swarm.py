"""The swarm's rate on the model (issue 17, item 8): seeds per minute for ~30-step schedules
over 2 to 4 hosts, every personality in turn, every checker on every history, in 2 worker
processes, beside the same seeds run in one process (the reference measured in the same run:
the ratio is what the second core buys), and where one seed's time goes (lab set-up and
teardown, the runner, the checkers), measured on a sample in this process."""
from __future__ import annotations

import time

from .report import Figure

SECONDS = 30.0
GOAL_SEEDS_PER_MIN = 10_000


def _rate(workers: int, seconds: float, first: int) -> float:
    from rdmalab.labs import engine as lab
    from rdmalab.schedules import swarm
    t0 = time.monotonic()
    done, failures = swarm.run_seeds(lab.personalities(), first=first,
                                     deadline=t0 + seconds, workers=workers)
    wall = time.monotonic() - t0
    if failures:
        print(f"bench swarm: {len(failures)} seed(s) failed, e.g. seed {failures[0].seed} "
              f"({failures[0].personality}): {failures[0].signature}")
    return done / wall * 60


def _split(n: int = 60) -> dict:
    """Per seed: lab set-up and teardown, the runner, the checkers (ms)."""
    import rdmalab
    from rdmalab import checkers
    from rdmalab.schedules import Runner, swarm
    t = {"lab": 0.0, "runner": 0.0, "history": 0.0, "checkers": 0.0}
    pers = rdmalab.personalities()
    for seed in range(1, n + 1):
        s = swarm.draw(10_000 + seed, pers[seed % len(pers)])
        t0 = time.perf_counter()
        lab = rdmalab.model_lab(seed=s.seed, hosts=tuple(s.hosts), personality=s.personality)
        t1 = time.perf_counter()
        Runner(lab, s).run()
        t2 = time.perf_counter()
        hist = lab.history()
        t3 = time.perf_counter()
        checkers.check_all(hist, checkers.context_of(lab))
        t4 = time.perf_counter()
        lab.shutdown()
        t5 = time.perf_counter()
        t["lab"] += (t1 - t0) + (t5 - t4)
        t["runner"] += t2 - t1
        t["history"] += t3 - t2
        t["checkers"] += t4 - t3
    return {k: v / n * 1000 for k, v in t.items()}


def run(args) -> list[Figure]:
    seconds = 8.0 if args.quick else SECONDS
    two = _rate(2, seconds, 1)
    one = _rate(1, seconds / 2, 1_000_000)
    split = _split(20 if args.quick else 60)
    note = ("per seed: " + ", ".join(f"{k} {v:.1f} ms" for k, v in split.items()) +
            f"; goal {GOAL_SEEDS_PER_MIN} seeds/min on 2 cores")
    return [Figure("swarm", "seeds per minute, ~30-step schedules, 2 workers", two,
                   "seeds/min", "the same in 1 process", one, goal=1.0, note=note),
            Figure("swarm", "seeds per minute against the issue's 10,000", two, "seeds/min",
                   "10,000 seeds/min (the target, not measured)", GOAL_SEEDS_PER_MIN,
                   goal=1.0)]
