"""Every cm_id ends, and nothing is delivered for it once its destroy returned.

A cm_id is a (host, "cm_id:N") object, from its first record (rdma_create_id's verb record,
or cm_create for an id a CONNECT_REQUEST made). It ends with a terminal rdma_cm event
(rdma_cm(7): DISCONNECTED, REJECTED, UNREACHABLE, CONNECT_ERROR, ADDR_ERROR, ROUTE_ERROR,
DEVICE_REMOVAL, TIMEWAIT_EXIT) or a destroy (`cm_destroy_end`, rdma_destroy_id's verb record
without an "err", or `destroyed_by_close` when the lab closed it).

- An id neither ended nor destroyed when the run ended (the executor's `teardown` record:
  everything was closed) is invalid; with no teardown record the run may not be over, and
  after a `hung` record the teardown stopped early (the bounded checker reports the hang), so
  it is unknown.
- An id whose process was killed (`destroyed_by_kill`, a `fault` kill or `process_crash`
  naming its process) or whose host rebooted or was lost before it ended is unknown, with
  that reason: the kernel destroyed it, nobody was told.
- An event read, dispatched, acked or handled for an id (cm_event, cm_event_read,
  cm_event_dispatched, cm_event_ack, cm_handler_begin) after its destroy returned is invalid:
  rdma_destroy_id(3) waits until every event of the id is acked, and nothing comes after.

A device's labels start over after a reboot: a later `rdma_create_id` or `cm_create` with an
old label is a new id.
"""
from __future__ import annotations

from .base import INVALID, UNKNOWN, Context, Result

NAME = "cm_terminal"

TERMINAL = frozenset({"DISCONNECTED", "REJECTED", "UNREACHABLE", "CONNECT_ERROR", "ADDR_ERROR",
                      "ROUTE_ERROR", "DEVICE_REMOVAL", "TIMEWAIT_EXIT"})
_EVENT_KINDS = frozenset({"cm_event", "cm_event_read", "cm_event_dispatched"})
_AFTER_DESTROY = frozenset({"cm_event", "cm_event_read", "cm_event_dispatched", "cm_event_ack",
                            "cm_handler_begin"})
_HOST_KINDS = frozenset({"fault", "process_crash", "host_lost"})
# What this checker reads; an id's first record is one of them (its create's verb record or
# cm_create), so the many cm_state records are skipped unread.
_KINDS = _EVENT_KINDS | _AFTER_DESTROY | _HOST_KINDS | {
    "verb", "cm_create", "cm_destroy_end", "destroyed_by_kill", "destroyed_by_close",
    "teardown", "hung"}


class _Id:
    __slots__ = ("key", "first", "ended", "destroyed", "fate", "channel", "retired")

    def __init__(self, key: tuple, seq: int):
        self.key, self.first = key, seq
        self.ended = None       # seq of its terminal event
        self.destroyed = None   # seq of its destroy's return
        self.fate = None        # why it can end unseen: killed, rebooted, lost
        self.channel = ""
        self.retired = False    # its host rebooted or was lost: the label may come again


def check(history: list, ctx: Context) -> Result:
    res = Result(NAME)
    ids: dict = {}        # (host, label) -> _Id
    replaced: list = []   # ids whose label a rebooted device handed out again
    channels: dict = {}   # (host, channel label) -> process name
    teardown = hung = None
    for r in history:
        k = r["kind"]
        if k not in _KINDS:
            continue
        obj = r["object"]
        if not obj.startswith("cm_id:"):
            if k in _HOST_KINDS:
                _host_event(r, ids, channels)
            elif k == "teardown":
                teardown = r["seq"]
            elif k == "hung" and hung is None:
                hung = r["seq"]
            elif k == "verb" and obj.startswith("cm_channel:") and "process" in r["data"]:
                channels[(r["host"], obj)] = r["data"]["process"]
            continue
        key = (r["host"], obj)
        d = r["data"]
        i = ids.get(key)
        if i is None or (i.retired and (k == "cm_create" or d.get("verb") == "rdma_create_id")):
            if k in ("destroyed_by_kill", "destroyed_by_close", "cm_destroy_end"):
                continue          # the end of an id already retired (a reboot's cleanup)
            if i is not None:
                replaced.append(i)
            i = ids[key] = _Id(key, r["seq"])
        if i.destroyed is not None and k in _AFTER_DESTROY:
            res.fail(f"{k} {d.get('event', '')} after its destroy returned (record "
                     f"{i.destroyed})", (i.destroyed, r["seq"]), host=key[0], object=obj)
        if k in _EVENT_KINDS:
            if i.ended is None and d.get("event") in TERMINAL:
                i.ended = r["seq"]
        elif k == "verb":
            v = d.get("verb")
            if v == "rdma_create_id":
                i.channel = d.get("channel", "")
            elif v == "rdma_destroy_id" and i.destroyed is None and "err" not in d:
                i.destroyed = r["seq"]
        elif k == "cm_create" and "listen_id" in d:
            parent = ids.get((key[0], f"cm_id:{d['listen_id']}"))
            if parent is not None:
                i.channel = parent.channel
        elif k in ("cm_destroy_end", "destroyed_by_close"):
            if i.destroyed is None:
                i.destroyed = r["seq"]
        elif k == "destroyed_by_kill":
            if i.destroyed is None:
                i.destroyed = r["seq"]
            if i.ended is None and i.fate is None:
                i.fate = "its process was killed"
    res.checked = len(ids) + len(replaced)
    open_ids = []
    unknown = []
    for i in replaced + list(ids.values()):
        host, obj = i.key
        if i.ended is not None:
            continue
        if i.fate is not None:
            unknown.append(f"{host}/{obj} ({i.fate})")
        elif i.destroyed is None:
            open_ids.append((host, obj, i))
    if teardown is not None and hung is None:
        for host, obj, i in open_ids:
            res.fail("neither a terminal event nor a destroy by the teardown "
                     f"(record {teardown})", (i.first, teardown), host=host, object=obj)
    elif open_ids:
        why = "with no teardown record (the run may not be over)" if teardown is None else \
            f"after the run hung (record {hung}; its teardown stops at a hung wait)"
        unknown.insert(0, f"{len(open_ids)} open at the end {why}: " +
                       ", ".join(f"{h}/{o}" for h, o, _ in open_ids[:5]))
    if unknown:
        res.reason = "cm_ids with no end seen: " + "; ".join(unknown[:10]) + \
            (f" and {len(unknown) - 10} more" if len(unknown) > 10 else "")
        if res.verdict != INVALID:
            res.verdict = UNKNOWN
    return res


def _host_event(r: dict, ids: dict, channels: dict) -> None:
    """A process killed, a host rebooted or lost: its ids end without an event."""
    k, host, d = r["kind"], r["host"], r["data"]
    if k == "host_lost":
        fate, process = "its host was lost", None
    elif k == "process_crash":
        fate, process = "its process crashed", d.get("process")
    elif d.get("fault") == "reboot":
        fate, process = "its host rebooted", None
    elif d.get("fault") == "kill":
        fate, process = "its process was killed", d.get("process")
    else:
        return
    for (h, _), i in ids.items():
        if h != host:
            continue
        if process is None:
            i.retired = True
        if i.ended is not None or i.fate is not None:
            continue
        if i.destroyed is not None and i.destroyed < r["seq"]:
            continue
        if process is None or channels.get((h, i.channel)) == process:
            i.fate = fate
