"""No kernel object left after teardown.

The schedule executor ends a run with one `teardown` record (host "", object "lab") whose
data is {"objects": {"<host>/<process>": {"qp": n, "cq": n, "mr": n, "pd": n, "cm_id": n,
...}}}: what the kernel still held for each live process (process.kernel_objects(), `rdma
res show` on a device) after it closed every id, QP and channel. Any nonzero count is
invalid, naming host, process, kind and count; a process killed during the run is not judged
(what the kernel frees for the dead is the process-kill scenarios' question). No teardown
record, or a `hung` one (the executor's teardown stops at a hung wait; the bounded checker
reports the hang): unknown.

Not judged: `ctx`. librdmacm opens a verbs context per device for a process's rdma_cm ids
and keeps it until the process exits (the model's ModelProcess::cm_context, "opened on first
use"), so a live process that made an id holds one whatever the run closed.
"""
from __future__ import annotations

from .base import UNKNOWN, Context, Result

NAME = "leftovers"
NOT_JUDGED = frozenset({"ctx"})


def check(history: list, ctx: Context) -> Result:
    res = Result(NAME)
    teardown = hung = None
    dead = set()          # "host/process" killed or crashed
    for r in history:
        k = r["kind"]
        if k == "teardown":
            teardown = r
        elif k == "hung" and hung is None:
            hung = r["seq"]
        elif k == "process_crash" or (k == "fault" and r["data"].get("fault") == "kill"):
            dead.add(f"{r['host']}/{r['data'].get('process', '')}")
    if teardown is None:
        res.verdict, res.reason = UNKNOWN, "no teardown record"
        return res
    if hung is not None:
        res.verdict = UNKNOWN
        res.reason = f"the run hung (record {hung}): its teardown stops at a hung wait"
        return res
    objects = teardown["data"].get("objects")
    if not isinstance(objects, dict):
        res.verdict = UNKNOWN
        res.reason = f"teardown record {teardown['seq']} has no objects map"
        return res
    for who, held in sorted(objects.items()):
        if who in dead:
            continue
        res.checked += 1
        if not isinstance(held, dict):
            res.fail(f"{who}: objects is {type(held).__name__}, not a kind -> count map",
                     (teardown["seq"],))
            continue
        for kind, n in sorted(held.items()):
            if n and kind not in NOT_JUDGED:
                host, _, process = who.partition("/")
                res.fail(f"process {process} still holds {n} {kind} after teardown",
                         (teardown["seq"],), host=host, object=kind)
    return res
