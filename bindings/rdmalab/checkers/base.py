"""What every history checker returns and what it is given (Jepsen's checker contract).

A checker is a pure function `check(history, ctx) -> Result` over the history's records (the
dicts of lab.history(): seq, t_ns, host, object, kind, data). It returns "valid", "invalid"
(with a problem per broken rule, each naming the records it read) or "unknown" (the history
lacks what the rule needs: the reason says what). Checkers never touch a lab.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

VALID, INVALID, UNKNOWN = "valid", "invalid", "unknown"


@dataclasses.dataclass(frozen=True)
class Problem:
    rule: str                      # what was broken, in one line
    seqs: tuple[int, ...] = ()     # the records that show it
    host: str = ""
    object: str = ""

    def __str__(self) -> str:
        where = "/".join(x for x in (self.host, self.object) if x)
        return (f"{where}: " if where else "") + self.rule + \
            (f" (records {', '.join(map(str, self.seqs))})" if self.seqs else "")


@dataclasses.dataclass
class Result:
    checker: str
    verdict: str = VALID           # valid | invalid | unknown
    problems: list[Problem] = dataclasses.field(default_factory=list)
    reason: str = ""               # unknown: what the history lacks
    checked: int = 0               # how many objects/WRs/ids the checker judged

    @property
    def valid(self) -> bool:
        return self.verdict == VALID

    def fail(self, rule: str, seqs=(), host: str = "", object: str = "") -> None:
        self.verdict = INVALID
        self.problems.append(Problem(rule, tuple(seqs), host, object))

    def as_dict(self) -> dict:
        return {"checker": self.checker, "verdict": self.verdict, "checked": self.checked,
                "reason": self.reason, "problems": [str(p) for p in self.problems]}


@dataclasses.dataclass(frozen=True)
class Context:
    """What a checker may need beyond the records: each host's transport ("IB", "RoCE",
    "iWARP"), read from the lab by the caller (lab.host(h).caps().transport), and the lab's
    tolerance in time bounds."""
    transports: dict = dataclasses.field(default_factory=dict)   # host -> transport
    personality: Optional[str] = None                            # model labs
    # host -> caps.err_post ("flush", "refuse", "flush_at_once", "strand"): what its provider
    # does with a WR posted to a QP in ERR
    err_posts: dict = dataclasses.field(default_factory=dict)
    # slack a device gets in time bounds the model does not predict (Lab.tolerance_ns: 0 on
    # the model): a kernel's timers, a watcher's polling, the clocks of two hosts
    tolerance_ns: int = 0

    def transport(self, host: str) -> str:
        return self.transports.get(host, "")
