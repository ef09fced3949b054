"""Every wait bounded: a wait that hit its deadline is a failure with its dump.

The schedule executor writes a `hung` record (data {"what", "dump"}) when a wait it had to see
end (a destroy, a drain, a connection's outcome) hit its deadline; the lab writes
`python_error` when a callback raised. Each is invalid, with what was awaited and the first
lines of the dump (the rest is in the record).
"""
from __future__ import annotations

from .base import Context, Result

NAME = "bounded"
DUMP_LINES = 6


def check(history: list, ctx: Context) -> Result:
    res = Result(NAME)
    for r in history:
        k = r["kind"]
        if k == "hung":
            d = r["data"]
            dump = "\n".join(str(d.get("dump", "")).splitlines()[:DUMP_LINES])
            res.fail(f"hung: {d.get('what', '?')}" + (f"\n{dump}" if dump else ""),
                     (r["seq"],), host=r["host"], object=r["object"])
        elif k == "python_error":
            d = r["data"]
            res.fail(f"python_error in {d.get('where', '?')}: {d.get('error', d)}", (r["seq"],), host=r["host"], object=r["object"])
    res.checked = 1
    return res
