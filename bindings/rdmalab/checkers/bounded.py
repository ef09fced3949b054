"""Every wait bounded, every callback returned: a wait that hit its deadline, or a callback or
event handler that raised, is a failure.

The schedule executor writes a `hung` record (data {"what", "dump"}) when a wait it had to see
end (a destroy, a drain, a connection's outcome) hit its deadline; the lab writes
`python_error` (data {"where", "error"}) when a callback it ran raised (a wait_until
predicate, a harness thread, a timer, a verb hook); the Dispatcher writes `handler_error` and
the CM event pump `cm_handler_error` (data: the event's fields, "handler": the object whose
handler ran, "default" for the default handler, "error": the exception, "ValueError: boom")
when an event handler raised. Each is invalid, naming what was awaited and the first lines of
the dump, or the callback and its exception.
"""
from __future__ import annotations

from .base import Context, Result

NAME = "bounded"
DUMP_LINES = 6


def _handler_text(r: dict) -> str:
    """The problem: "handler of qp:5 raised on QP_FATAL: ValueError: boom" ("CM handler...")."""
    d = r["data"]
    handler = d.get("handler") or r["object"] or "?"
    cm = "CM " if r["kind"] == "cm_handler_error" else ""
    who = f"default {cm}handler" if handler == "default" else f"{cm}handler of {handler}"
    error = d.get("error", d.get("what", "?"))  # "what": histories written before 26
    return f"{who} raised on {d.get('event', '?')}: {error}"


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
            res.fail(f"python_error in {d.get('where', '?')}: {d.get('error', d)}", (r["seq"],),
                     host=r["host"], object=r["object"])
        elif k in ("handler_error", "cm_handler_error"):
            res.fail(_handler_text(r), (r["seq"],), host=r["host"], object=r["object"])
    res.checked = 1
    return res
