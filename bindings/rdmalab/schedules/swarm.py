"""The swarm (TigerBeetle's VOPR, FoundationDB's simulation): each seed draws a workload and a
fault mix, which fault kinds are on and how often they act (swarm testing: a kind that is off
for a seed cannot mask the others), runs it as a Schedule, and runs every history checker on
what happened. A failing seed prints its replay command; the shrinker (rdmalab.schedules.shrink)
cuts it to the fewest steps that still fail the same way.

    python3 -m rdmalab swarm --lab model:roce --seeds 1000
    python3 -m rdmalab swarm --lab model --minutes 1          # every personality in turn

Everything a seed does comes from random.Random(seed): `draw(seed, personality)` is the whole
schedule, so the same seed gives the same schedule, and on the model the same history. The
steps are drawn by rdmalab.schedules.swarm_steps, their moments marked by may_miss; this module
draws a seed's schedule and runs seeds.
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import random
import signal
import time
from typing import Optional

from .. import _core, checkers, sec
from ..labs.engine import model_lab
from .may_miss import mark_may_miss
from .runner import Runner
from .schedule import Schedule
from .swarm_steps import StepGen, draw_knobs, splice, xrc_steps

# The personalities with XRC (the engine's caps): on half their seeds the XRC steps (swarm_steps.xrc_steps) are
# drawn from a stream of their own and spliced in at random places.
XRC_PERSONALITIES = tuple(p for p in _core.personalities() if _core.personality_caps(p).xrc)


def draw(seed: int, personality: str = "roce", steps: int = 30) -> Schedule:
    """The schedule of one seed: about `steps` steps over 2 to 4 hosts."""
    rng = random.Random(seed)
    k = draw_knobs(rng, steps)
    hosts = ["a", "b", "c", "d"][:k.hosts]
    g = StepGen(rng, k, hosts)
    while len(g.steps) < k.steps:
        g.one()
    meta = {"knobs": k.as_dict()}
    steps = g.steps
    xr = random.Random(seed * 1_000_003 + 17)   # its own stream: other draws stay the same
    if personality in XRC_PERSONALITIES and xr.random() < 0.5:
        steps = splice(xr, steps, xrc_steps(xr, hosts))
        meta["xrc"] = True
    return Schedule(hosts=hosts, steps=mark_may_miss(steps, personality), seed=seed,
                    personality=personality, settle_ns=sec(5), meta=meta)


# ---- running seeds ---------------------------------------------------------------------------

# The signature of a run in which a step's moment never came (Outcome.missed) and the step
# did not say may_miss.
MISSED = "missed_moment"


@dataclasses.dataclass
class SeedResult:
    seed: int
    personality: str
    steps: int
    failed: bool
    signature: tuple[str, ...]     # the checkers that said invalid, "bounded" (hung),
                                   # "missed_moment", "error", "runaway"
    problems: list[str]
    records: int = 0
    history: Optional[list] = None
    results: Optional[list] = None

    def as_dict(self) -> dict:
        return {"seed": self.seed, "personality": self.personality, "steps": self.steps,
                "failed": self.failed, "signature": list(self.signature),
                "problems": self.problems[:20], "records": self.records}


def run_on_model(schedule: Schedule, personality: Optional[str] = None,
                 mutations: tuple = (), keep_history: bool = False) -> SeedResult:
    """One schedule on a fresh model lab (seeded with the schedule's seed), checked."""
    p = personality or schedule.personality or "roce"
    kw = {"mutations": tuple(mutations)} if mutations else {}
    lab = model_lab(seed=schedule.seed, hosts=tuple(schedule.hosts), personality=p, **kw)
    with lab:
        return check_run(lab, schedule, p, keep_history)


def check_run(lab, schedule: Schedule, personality: str, keep_history: bool = False) \
        -> SeedResult:
    """Runs the schedule on a lab it does not own and runs every checker on the history."""
    outcome = Runner(lab, schedule).run()
    history = lab.history()
    sig, problems = [], []
    for r in checkers.check_all(history, checkers.context_of(lab)):
        if r.verdict == "invalid":
            sig.append(r.checker)
            problems += [f"{r.checker}: {p}" for p in r.problems]
    if outcome.hung and "bounded" not in sig:
        sig.append("bounded")
        problems.append(f"bounded: {outcome.hung}")
    if outcome.missed:  # a step's moment never came and the step did not say may_miss
        sig.append(MISSED)
        problems += [f"{MISSED}: {m}" for m in outcome.missed]
    return SeedResult(schedule.seed, personality, len(schedule.steps), bool(sig),
                      tuple(sorted(set(sig))), problems, len(history),
                      history if keep_history else None, outcome.results)


# A seed that runs away (wall time) is a failure of its own, never a stalled swarm: the model
# is deterministic, so its replay command shows the same run.
SEED_WALL_S = 60


class Runaway(Exception):
    pass


def _alarm(signum, frame):
    raise Runaway(f"the seed ran past {SEED_WALL_S} s of wall time")


def _seed_job(job: tuple) -> SeedResult:
    seed, personality, steps, mutations = job
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(SEED_WALL_S)
    try:
        r = run_on_model(draw(seed, personality, steps), personality, mutations)
    except Runaway as e:
        return SeedResult(seed, personality, steps, True, ("runaway",), [f"runaway: {e}"])
    except Exception as e:  # a harness bug is a failure of the seed, never a lost run
        if "ran past" in str(e):  # the alarm parked in an engine callback and re-raised
            return SeedResult(seed, personality, steps, True, ("runaway",), [f"runaway: {e}"])
        return SeedResult(seed, personality, steps, True, ("error",), [f"error: {e!r}"])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    r.results = None
    return r


def jobs(personalities: list[str], first: int, count: Optional[int], steps: int,
         mutations: tuple):
    """(seed, personality, ...) for count seeds (None: without end), personalities in turn."""
    i = 0
    while count is None or i < count:
        yield (first + i, personalities[i % len(personalities)], steps, mutations)
        i += 1


def run_seeds(personalities: list[str], *, first: int = 1, count: Optional[int] = None,
              deadline: Optional[float] = None, steps: int = 30, workers: int = 2,
              mutations: tuple = (), stop_at_first: bool = False, on_result=None):
    """Runs seeds in `workers` forked processes; calls on_result(SeedResult) for each, in
    completion order. Stops at count, at the wall-clock deadline (time.monotonic()), or at the
    first failure with stop_at_first. Returns (seeds run, failures)."""
    done, failures = 0, []
    it = jobs(personalities, first, count, steps, tuple(mutations))
    if workers <= 1:
        results = map(_seed_job, it)
        pool = None
    else:
        pool = multiprocessing.get_context("fork").Pool(workers)
        results = pool.imap(_seed_job, it, chunksize=8)
    try:
        for r in results:
            done += 1
            if on_result:
                on_result(r)
            if r.failed:
                failures.append(r)
                if stop_at_first:
                    break
            if deadline is not None and time.monotonic() >= deadline:
                break
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    return done, failures
