"""The older checker API, kept for scenarios that use it: each function calls a rule of
rdmalab.checkers (the one home of each rule) and returns a CheckResult that is valid, invalid
(with the problems) or unknown (valid None: the history had nothing the rule could judge).

A history is a list of dicts as ``Lab.history()`` returns them:
``{"seq", "t_ns", "host", "object", "kind", "data"}``. records() and events_for() read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..checkers import handlers, holds
from ..checkers.base import Context, Result


@dataclass
class CheckResult:
    name: str
    valid: Optional[bool]  # None: unknown (the history cannot say)
    problems: list = field(default_factory=list)
    details: dict = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.valid is True

    def __str__(self) -> str:
        state = {True: "valid", False: "INVALID", None: "unknown"}[self.valid]
        text = f"{self.name}: {state}"
        for p in self.problems[:20]:
            text += f"\n  - {p}"
        if len(self.problems) > 20:
            text += f"\n  ... {len(self.problems) - 20} more"
        return text


def _result(name: str, results: list[Result], empty: str, detail: str) -> CheckResult:
    """Joins rule Results: invalid if one is, unknown if none judged anything."""
    problems = [str(p) for r in results for p in r.problems]
    checked = sum(r.checked for r in results)
    if problems:
        valid: Optional[bool] = False
    elif checked == 0:
        return CheckResult(name, None, [empty])
    else:
        valid = True
    return CheckResult(name, valid, problems, {detail: checked})


def no_handler_after_destroy(history: list) -> CheckResult:
    """No handler starts for an object after its destroy returned (seeds 001, 002)."""
    r = handlers.judge(history)["after_destroy"]
    return _result("no_handler_after_destroy", [r], "no destroy in the history", "destroyed")


def destroy_waits_for_handlers(history: list) -> CheckResult:
    """Every handler that began before its object's destroy returned ended before it."""
    r = handlers.judge(history)["destroy_waits"]
    return _result("destroy_waits_for_handlers", [r], "no handler overlapped a destroy",
                   "handlers")


def handlers_serialized(history: list) -> CheckResult:
    """Handlers for one object never overlap and run in dispatch order (seed 001's per-id queue)."""
    rules = handlers.judge(history)
    res = _result("handlers_serialized", [rules["serialized"], rules["in_order"]],
                  "no handler ran", "handlers")
    if res.valid is not None:
        res.details = {"handlers": rules["serialized"].checked}
    return res


def holds_released(history: list) -> CheckResult:
    """Every packet a wire rule held back was let go exactly once (checkers.holds)."""
    return _result("holds_released", [holds.check(history, Context())],
                   "no held packet in the history", "held")


def _of(history: list, *kinds: str, host: Optional[str] = None, obj: Optional[str] = None):
    return [r for r in history
            if r["kind"] in kinds and (host is None or r["host"] == host)
            and (obj is None or r["object"] == obj)]


def events_for(history: list, host: str, obj: str, kinds=("handler_begin",)) -> list:
    """The event type names that reached an object's handler, in order."""
    return [r["data"].get("event") for r in _of(history, *kinds, host=host, obj=obj)]


def records(history: list, kind: str, host: Optional[str] = None,
            obj: Optional[str] = None) -> list:
    return _of(history, kind, host=host, obj=obj)
