"""Shrinking a failing schedule (delta debugging, as QuickCheck and Jepsen do): take steps
away while the schedule still fails the same way (the same checkers say invalid), then make
what is left simpler (counts to 1, moments dropped, rule rates to 1). A connection goes with
every step that names it. The result is the smallest schedule found, not a minimum.

A step whose moment never comes fails the run (`missed_moment`) unless it says may_miss; a
step taken away can take with it the reason another step's moment had to come. So a schedule
the swarm drew (its meta has the swarm's "knobs") gets its may_miss marks anew for each
candidate (rdmalab.schedules.may_miss.mark_may_miss), and a moment missed only because a cut took its
cause away is no failure of the candidate. A hand-written schedule's marks stay as written.

A workload's frame (FRAME_OPS: its declaration, set-up, I/O, the wait for its working state,
the read-back and teardown) stays in every candidate: without it a campaign tests nothing.
Its faults and their heals are cut like any step.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Callable

from .may_miss import mark_may_miss
from .schedule import Schedule, ScheduleError

Fails = Callable[[Schedule], bool]
FRAME_OPS = ("workload", "workload_setup", "workload_start_io", "workload_wait_state",
             "workload_stop_io", "workload_verify", "workload_teardown")


def shrink(schedule: Schedule, fails: Fails, max_runs: int = 600,
           reseed: int = 4) -> tuple[Schedule, int]:
    """The smallest schedule found for which fails() holds, and how many runs it took.

    A failure that needs a particular interleaving (the model's scheduler draws from the
    schedule's seed) can vanish when a step goes only because the draws shift; so a candidate
    is also tried with the next `reseed` - 1 seeds, and the seed that fails is kept in it: a
    schedule file carries its seed, so the small one replays as it is."""
    runs = [0]

    def still(s: Schedule) -> Schedule | None:
        try:
            s.validate()
        except ScheduleError:
            return None
        s = remark(s)
        for k in range(reseed):
            if runs[0] >= max_runs:
                return None
            cand = s if k == 0 else dataclasses.replace(s, seed=s.seed + k)
            runs[0] += 1
            if fails(cand):
                return cand
        return None

    best = schedule
    progress = True
    while progress and runs[0] < max_runs:
        progress = False
        for cut in (_drop_conns, _drop_chunks, _simplify):
            smaller = cut(best, still)
            if smaller is not None:
                best, progress = smaller, True
    return best, runs[0]


def remark(s: Schedule) -> Schedule:
    """A drawn schedule with its may_miss marks made anew for its steps (see above)."""
    if "knobs" not in s.meta:
        return s
    return s.with_steps(mark_may_miss(s.steps, s.personality))


def _drop_conns(s: Schedule, still) -> Schedule | None:
    """Each connection with every step that names it."""
    for conn in [st["conn"] for st in s.steps if st["op"] == "connect"]:
        steps = [st for st in s.steps if not _names(st, conn)]
        got = still(s.with_steps(steps))
        if got is not None:
            return got
    return None


def _names(step: dict, conn: str) -> bool:
    return step.get("conn") == conn or (step.get("at") or {}).get("conn") == conn


def _free(s: Schedule) -> list[int]:
    """The positions of the steps a cut may take: all but a workload's frame."""
    return [k for k, st in enumerate(s.steps) if st["op"] not in FRAME_OPS]


def _drop_chunks(s: Schedule, still) -> Schedule | None:
    """ddmin's complement step: halves, quarters, ... down to single steps."""
    size = max(1, len(_free(s)) // 2)
    changed = None
    while size >= 1:
        i = 0
        while i < len(_free(s)):
            cut = set(_free(s)[i:i + size])
            steps = [st for k, st in enumerate(s.steps) if k not in cut]
            got = still(s.with_steps(steps)) if steps != s.steps else None
            if got is not None:
                s, changed = got, got
            else:
                i += size
        size //= 2
    return changed


def _simplify(s: Schedule, still) -> Schedule | None:
    changed = None
    for i in range(len(s.steps)):
        for edit in (_one, _no_moment, _certain):
            step = edit(s.steps[i])
            if step is None:
                continue
            steps = list(s.steps)
            steps[i] = step
            got = still(s.with_steps(steps))
            if got is not None:
                s, changed = got, got
    return changed


def _one(step: dict):
    if step.get("n", 1) > 1:
        return {**step, "n": 1}
    return None


def _no_moment(step: dict):
    if "at" in step:  # may_miss goes with it: a step without a moment cannot miss one
        return {k: v for k, v in step.items() if k not in ("at", "may_miss")}
    return None


def _certain(step: dict):
    rule = step.get("rule")
    if rule and rule.get("probability", 1) != 1:
        new = copy.deepcopy(step)
        new["rule"].pop("probability")
        return new
    return None
