"""Checkers over histories (Jepsen style), one rule each, one place each.

    from rdmalab import checkers
    for r in checkers.check_all(lab.history(), checkers.context_of(lab)):
        assert r.verdict != "invalid", r.problems

Each module in ALL has NAME and check(history, ctx) -> Result (base.py): completions,
handlers, acks, holds, cm_terminal, cm_sequence, leftovers, bounded, xrc, workloads (kernel
ULP workloads: safety, I/O errors only where a timeout allows, liveness, teardown). check_all
runs them in that order; names= picks some by NAME. rdmalab.run.checks is the older API over
the same rules.
"""
from __future__ import annotations

import importlib
from typing import Iterable, Optional

from ..protocol import VIRTUAL_TIME
from .base import INVALID, UNKNOWN, VALID, Context, Problem, Result

_ORDER = ("completions", "handlers", "acks", "holds", "cm_terminal", "cm_sequence",
          "leftovers", "bounded", "xrc", "workloads")


def _load() -> list:
    mods = []
    for name in _ORDER:
        try:
            mods.append(importlib.import_module(f"{__name__}.{name}"))
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":   # the module exists and imports something missing
                raise
    return mods


ALL = _load()


def names() -> list[str]:
    return [m.NAME for m in ALL]


def check_all(history: list, ctx: Optional[Context] = None,
              names: Optional[Iterable[str]] = None) -> list[Result]:
    """Every checker (or those named) on one history. A checker that raises (a record it
    cannot read) gives an invalid Result naming the exception, so one bad record never hides
    the other checkers' verdicts."""
    ctx = ctx if ctx is not None else Context()
    mods = ALL
    if names is not None:
        wanted = list(names)
        known = {m.NAME: m for m in ALL}
        bad = [n for n in wanted if n not in known]
        if bad:
            raise ValueError(f"unknown checker(s) {', '.join(bad)}; known: "
                             f"{', '.join(known)}")
        mods = [known[n] for n in wanted]
    out = []
    for m in mods:
        try:
            out.append(m.check(history, ctx))
        except Exception as e:  # noqa: BLE001 - reported as the checker's verdict
            r = Result(m.NAME)
            r.fail(f"checker raised {type(e).__name__}: {e}")
            out.append(r)
    return out


def context_of(lab) -> Context:
    """The Context a lab gives its checkers: each host's transport, the lab's tolerance_ns, and
    on a lab with virtual time (the model) the personality (hosts of several personalities:
    their names joined by ","). Elsewhere caps.personality is a driver's name, not one of the
    model's rule sets, and the rules it selects (completions' flush grace) are bounds in
    virtual time."""
    transports, personalities, err_posts = {}, set(), {}
    for name in lab.hosts:
        try:
            caps = lab.host(name).caps()
        except Exception:  # noqa: BLE001 - a host with no device (a switch) has no transport
            continue
        transports[name] = caps.transport
        err_posts[name] = caps.err_post
        personalities.add(caps.personality)
    virtual = lab.has(VIRTUAL_TIME)
    return Context(transports=transports, err_posts=err_posts,
                   personality=",".join(sorted(personalities)) if virtual and personalities
                   else None, tolerance_ns=lab.tolerance_ns)


__all__ = ["ALL", "Context", "INVALID", "Problem", "Result", "UNKNOWN", "VALID", "check_all",
           "context_of", "names"]
