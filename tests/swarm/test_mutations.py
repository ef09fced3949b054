"""Proof that the swarm finds bugs (issue 17, item 7): with each planted defect switched on
(rdmalab.MUTATIONS, FoundationDB's BUGGIFY kind of switch in the engine), the swarm fails a
seed within MAX_SEEDS, the shrinker cuts that seed's schedule to at most MAX_STEPS steps that
still fail the same way, and the same small schedule passes on the model without the defect
(so what the checkers caught is the defect, not the workload)."""
import pytest

from rdmalab.labs.engine import MUTATIONS
from rdmalab.schedules import shrink, swarm

MAX_SEEDS = 3000
MAX_STEPS = 5
PERSONALITIES = ["roce", "ib", "iwarp-siw"]


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_swarm_finds_and_shrinks(mutation):
    done, failures = swarm.run_seeds(PERSONALITIES, first=1, count=MAX_SEEDS, workers=2,
                                     mutations=(mutation,), stop_at_first=True)
    assert failures, f"{mutation}: no seed of {done} failed"
    bad = failures[0]
    schedule = swarm.draw(bad.seed, bad.personality)
    sig = set(bad.signature)

    def fails(s):
        return bool(sig & set(swarm.run_on_model(s, bad.personality, (mutation,)).signature))

    small, runs = shrink.shrink(schedule, fails)
    print(f"{mutation}: seed {bad.seed} ({bad.personality}) after {done} seeds, "
          f"{'/'.join(bad.signature)}; shrunk {len(schedule.steps)} -> {len(small.steps)} "
          f"steps in {runs} runs: {[s['op'] for s in small.steps]}")
    assert len(small.steps) <= MAX_STEPS, small.steps
    assert fails(small)
    clean = swarm.run_on_model(small, bad.personality)
    assert not clean.failed, clean.problems
