"""No handler after destroy returns, and one object's events handled one at a time.

(a) A Dispatcher `handler_begin` for an object after that object's `destroy_end`, or a CM
    pump `cm_handler_begin` for a cm_id after its `cm_destroy_end`, is invalid: the object is
    gone (the seed-002 use-after-free; librdmacm's rdma_destroy_id contract).
(b) Two handlers of one object never overlap, on any thread: between an object's
    `handler_begin` and its `handler_end` (`cm_handler_begin` .. `cm_handler_end`) no other
    begin of the same object (seed 001's per-id queue, mlx5's ordered event workqueue).

Objects are (host, object label); a label is never handed out twice in a model lab. A device's
labels start over after a reboot, so a host's reboot (or loss) ends what its objects did:
a destroy before it does not outlive it.
"""
from __future__ import annotations

from .base import Context, Result

NAME = "handlers"

_BEGIN = {"handler_begin": "destroy_end", "cm_handler_begin": "cm_destroy_end"}
_END = {"handler_end": "handler_begin", "cm_handler_end": "cm_handler_begin"}
_KINDS = frozenset(["handler_begin", "handler_end", "cm_handler_begin", "cm_handler_end",
                    "destroy_end", "cm_destroy_end", "fault", "host_lost"])


def check(history: list, ctx: Context) -> Result:
    res = Result(NAME)
    destroyed: dict = {}   # (host, object, destroy kind) -> seq of the destroy's end
    running: dict = {}     # (host, object, begin kind) -> seq of the handler's begin
    handlers = 0
    for r in history:
        k = r["kind"]
        if k not in _KINDS:
            continue
        host, obj = r["host"], r["object"]
        if k in _BEGIN:
            handlers += 1
            gone = destroyed.get((host, obj, _BEGIN[k]))
            if gone is not None:
                res.fail(f"{k} ({r['data'].get('event')}) after {_BEGIN[k]} at record {gone}: "
                         "a handler ran for a destroyed object", (gone, r["seq"]),
                         host=host, object=obj)
            key = (host, obj, k)
            other = running.get(key)
            if other is not None:
                res.fail(f"{k} ({r['data'].get('event')}) while the handler that began at "
                         f"record {other} still ran: one object's events must be handled "
                         "one at a time", (other, r["seq"]), host=host, object=obj)
            running[key] = r["seq"]
        elif k in _END:
            running.pop((host, obj, _END[k]), None)
        elif k == "fault" and r["data"].get("fault") != "reboot":
            continue
        elif k in ("fault", "host_lost"):
            for d in (destroyed, running):
                for key in [key for key in d if key[0] == host]:
                    del d[key]
        else:
            destroyed.setdefault((host, obj, k), r["seq"])
    res.checked = handlers
    return res
