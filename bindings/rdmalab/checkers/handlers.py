"""No handler after destroy returns, destroy waits for running handlers, and one object's
events handled one at a time, in the order they were dispatched.

(a) after_destroy: a Dispatcher `handler_begin` for an object after that object's
    `destroy_end`, or a CM pump `cm_handler_begin` for a cm_id after its `cm_destroy_end`, is
    invalid: the object is gone (the seed-002 use-after-free; librdmacm's rdma_destroy_id
    contract).
(b) destroy_waits: when an object's `destroy_end` (`cm_destroy_end`) is recorded, no handler of
    it still runs (a handler that began before the destroy ended before it returned).
(c) serialized: two handlers of one object never overlap, on any thread: between an object's
    `handler_begin` and its `handler_end` (`cm_handler_begin` .. `cm_handler_end`) no other
    begin of the same object (seed 001's per-id queue, mlx5's ordered event workqueue).
(d) in_order: a Dispatcher object's handlers start in the order its events were dispatched
    (`event_dispatched` .. `handler_begin`, matched by data.seq; handlers whose dispatch is not
    in the history are not judged).

Objects are (host, object label); a label is never handed out twice in a model lab. A device's
labels start over after a reboot, so a host's reboot (or loss) ends what its objects did:
a destroy before it does not outlive it.

judge() gives one Result per rule (rdmalab.run.checks reads them one by one); check() joins them.
"""
from __future__ import annotations

from .base import INVALID, Context, Result

NAME = "handlers"
RULES = ("after_destroy", "destroy_waits", "serialized", "in_order")

_BEGIN = {"handler_begin": "destroy_end", "cm_handler_begin": "cm_destroy_end"}
_END = {"handler_end": "handler_begin", "cm_handler_end": "cm_handler_begin"}
_DESTROYED = {v: k for k, v in _BEGIN.items()}  # destroy kind -> its handlers' begin kind
_KINDS = frozenset(["handler_begin", "handler_end", "cm_handler_begin", "cm_handler_end",
                    "destroy_end", "cm_destroy_end", "event_dispatched", "fault", "host_lost"])


def _event_id(r: dict):
    """Dispatcher records name the event by its per-context sequence number (data.seq)."""
    return r["data"].get("seq", -1 - r["seq"])


class _State:
    """What one pass keeps, per (host, object[, kind])."""

    def __init__(self) -> None:
        self.res = {rule: Result(f"{NAME}.{rule}") for rule in RULES}
        self.destroyed: dict = {}   # (host, object, destroy kind) -> seq of the destroy's end
        self.running: dict = {}     # (host, object, begin kind) -> seq of the handler's begin
        self.begun: dict = {}       # (host, object, begin kind) -> handlers begun so far
        self.dispatched: dict = {}  # (host, object) -> Dispatcher event seqs, dispatch order
        self.began: dict = {}       # (host, object) -> Dispatcher event seqs, begin order

    def begin(self, r: dict, k: str) -> None:
        host, obj = r["host"], r["object"]
        gone = self.destroyed.get((host, obj, _BEGIN[k]))
        if gone is not None:
            self.res["after_destroy"].fail(
                f"{k} ({r['data'].get('event')}) after {_BEGIN[k]} at record {gone}: a handler "
                "ran for a destroyed object", (gone, r["seq"]), host=host, object=obj)
        key = (host, obj, k)
        other = self.running.get(key)
        if other is not None:
            self.res["serialized"].fail(
                f"{k} ({r['data'].get('event')}) while the handler that began at record {other} "
                "still ran: one object's events must be handled one at a time",
                (other, r["seq"]), host=host, object=obj)
        self.running[key] = r["seq"]
        self.begun[key] = self.begun.get(key, 0) + 1
        self.res["serialized"].checked += 1
        if k == "handler_begin":
            self.began.setdefault((host, obj), []).append(_event_id(r))

    def destroy_end(self, r: dict, k: str) -> None:
        host, obj = r["host"], r["object"]
        key = (host, obj, _DESTROYED[k])
        self.res["destroy_waits"].checked += self.begun.get(key, 0)
        other = self.running.get(key)
        if other is not None:
            self.res["destroy_waits"].fail(
                f"{k} while the handler that began at record {other} still ran: destroy must "
                "wait for the object's running handler", (other, r["seq"]), host=host,
                object=obj)
        if (host, obj, k) not in self.destroyed:
            self.destroyed[(host, obj, k)] = r["seq"]
            self.res["after_destroy"].checked += 1

    def order(self, keys) -> None:
        """Rule (d) for these objects; their lists are done with."""
        res = self.res["in_order"]
        for key in keys:
            began = self.began.pop(key, [])
            dispatched = self.dispatched.pop(key, [])
            seen, started = set(dispatched), set(began)
            ran = [s for s in began if s in seen]
            res.checked += len(ran)
            want = [s for s in dispatched if s in started]
            if ran != want:
                res.fail(f"handlers ran in order {ran}, dispatched {want}", host=key[0],
                         object=key[1])

    def host_gone(self, host: str) -> None:
        for d in (self.destroyed, self.running, self.begun):
            for key in [key for key in d if key[0] == host]:
                del d[key]
        self.order({key for d in (self.began, self.dispatched) for key in d if key[0] == host})


def judge(history: list) -> dict:
    """rule name -> Result, in one pass. checked: after_destroy, objects destroyed;
    destroy_waits, handlers begun before their object's destroy ended; serialized, handlers
    begun; in_order, Dispatcher handlers with their dispatch in the history."""
    st = _State()
    for r in history:
        k = r["kind"]
        if k not in _KINDS:
            continue
        if k in _BEGIN:
            st.begin(r, k)
        elif k in _END:
            st.running.pop((r["host"], r["object"], _END[k]), None)
        elif k == "event_dispatched":
            st.dispatched.setdefault((r["host"], r["object"]), []).append(_event_id(r))
        elif k == "fault" and r["data"].get("fault") != "reboot":
            continue
        elif k in ("fault", "host_lost"):
            st.host_gone(r["host"])
        else:
            st.destroy_end(r, k)
    st.order(set(st.began) | set(st.dispatched))
    return st.res


def check(history: list, ctx: Context) -> Result:
    res = Result(NAME)
    for rule, r in judge(history).items():
        res.problems.extend(r.problems)
        if r.verdict == INVALID:
            res.verdict = INVALID
        if rule == "serialized":
            res.checked = r.checked  # handlers begun
    return res
