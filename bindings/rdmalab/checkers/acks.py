"""rdma_destroy_id returns only once every event of the id is acked.

rdma_destroy_id(3): "Users must ... ack all related events before calling this routine";
librdmacm's rdma_destroy_id (rdma-core librdmacm/cma.c) waits on the id's condition variable
until events_completed reaches the events_reported the kernel returned from
RDMA_USER_CM_CMD_DESTROY_ID, so it cannot return while an event it handed out is unacked.
The pump (core/stack/connection.cc) records each event it reads (`cm_event_read`, data seq)
and each ack (`cm_event_ack`); the destroy's end is `cm_destroy_end`. An id whose destroy
ended while one of its read events had no ack breaks the rule.
"""
from __future__ import annotations

from .base import Context, Result

NAME = "acks"


def check(history: list, ctx: Context) -> Result:
    r = Result(NAME)
    unacked: dict[tuple, dict[int, int]] = {}   # (host, object) -> {event seq: record seq}
    for rec in history:
        kind = rec["kind"]
        if kind not in ("cm_event_read", "cm_event_ack", "cm_destroy_end"):
            continue
        key = (rec["host"], rec["object"])
        if kind == "cm_event_read":
            unacked.setdefault(key, {})[rec["data"].get("seq")] = rec["seq"]
        elif kind == "cm_event_ack":
            unacked.get(key, {}).pop(rec["data"].get("seq"), None)
        else:
            r.checked += 1
            left = unacked.pop(key, {})
            if left:
                r.fail(f"rdma_destroy_id returned with {len(left)} event(s) read and not "
                       f"acked (event seq {', '.join(map(str, sorted(left)))}): "
                       "rdma_destroy_id(3) waits for every ack",
                       seqs=(*sorted(left.values()), rec["seq"]), host=rec["host"],
                       object=rec["object"])
    return r
