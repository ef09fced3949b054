"""Each cm_id's event sequence is legal under rdma_cm, and each IB CM / iWARP CM / rdma_cm state
record is a transition of its kernel state machine (issue 17, item 4).

Three tables, each rule with the kernel or rdma-core source that makes it:
  1. EVENT_RULES: the rdma_cm events of one RC id (RDMA_PS_TCP; UD's SIDR path is not
     modelled) as the user reads them (`cm_event` records, object "cm_id:N"), per transport
     (IB and RoCE share drivers/infiniband/core/cm.c, RoCE adds cma.c's neighbour watch; iWARP
     goes through iwcm.c). The phases are what the user has seen so far, not kernel states.
  2. IB_CM_TRANSITIONS: `cm_state` records of layer "ib_cm" (cm.c, enum ib_cm_state).
  3. IW_CM_TRANSITIONS and RDMA_CM_TRANSITIONS: layers "iw_cm" (iwcm.c) and "rdma_cm" (cma.c).
Sources: Linux 6.1.192 and 7.2 drivers/infiniband/core/{cma.c,cm.c,iwcm.c,ucma.c}, rdma-core
librdmacm/cma.c rdma_get_cm_event. The checker judges what happened, never completeness: an id
may stop anywhere (process killed, host rebooted or lost, history ended); "every id reaches a
terminal event" is another checker's rule. A `history_lost` record (an agent lab could not fetch
a dead agent's records) loses whole objects, never part of one: nothing to do for it.

Objects are keyed by (host, object, epoch): a host's epoch grows when it is back from a reboot
(host_up on the model, host_back on agent labs), and a create record (rdma_create_id's verb,
cm_create) starts its object anew. A passive rdma_cm id (cm_create with a listen_id) starts in
CONNECT, every other object in IDLE; a cm_state record's `from` must be its object's last `to`.

Scenarios call check_events(conn.events, transport=..., role=...), drive EventSequence, or
check a state path with check_transitions(layer, states).
"""
from __future__ import annotations

from typing import Iterable, Optional

from .base import Context, Result, UNKNOWN, VALID

NAME = "cm_sequence"

TRANSPORTS = ("IB", "RoCE", "iWARP")
ROLES = ("active", "passive", "listener")
_IB, _IW = frozenset({"IB", "RoCE"}), frozenset({"iWARP"})
_ALL = _IB | _IW

# rdma_cma.h enum rdma_cm_event_type (rdma-core; the kernel's include/rdma/rdma_cm.h).
EVENTS = ("ADDR_RESOLVED", "ADDR_ERROR", "ROUTE_RESOLVED", "ROUTE_ERROR", "CONNECT_REQUEST",
          "CONNECT_RESPONSE", "CONNECT_ERROR", "UNREACHABLE", "REJECTED", "ESTABLISHED",
          "DISCONNECTED", "DEVICE_REMOVAL", "MULTICAST_JOIN", "MULTICAST_ERROR", "ADDR_CHANGE",
          "TIMEWAIT_EXIT", "ADDRINFO_RESOLVED", "ADDRINFO_ERROR", "USER")

# ---------------------------------------------------------------- 1. rdma_cm events per id
# Phases: new (nothing seen, role unknown), incoming (a passive id before its CONNECT_REQUEST),
# idle (active: may resolve), addr_resolved, addrinfo_resolved, route_resolved, requested
# (passive: CONNECT_REQUEST seen), connected, failed, disconnected, closed, listening, removed.
_RESOLVING = ("new", "idle")
EVENT_RULES: tuple = (
    # (phases, event, next phase, transports)
    # cma.c addr_handler: ADDR_QUERY -> ADDR_RESOLVED (librdmacm ucma_process_addr_resolved may
    # report it as ADDR_ERROR); on error ADDR_RESOLVED -> ADDR_BOUND, where resolve_prepare_src
    # lets the user resolve again.
    (_RESOLVING, "ADDR_RESOLVED", "addr_resolved", _ALL),
    (_RESOLVING, "ADDR_ERROR", "idle", _ALL),
    # 7.x cma.c rdma_resolve_ib_service: ADDR_BOUND -> ADDRINFO_QUERY -> ADDRINFO_RESOLVED, or
    # back to ADDR_BOUND with ADDRINFO_ERROR (librdmacm rdma_resolve_addrinfo).
    (_RESOLVING, "ADDRINFO_RESOLVED", "addrinfo_resolved", _ALL),
    (_RESOLVING, "ADDRINFO_ERROR", "idle", _ALL),
    # cma_ib_req_handler / iw_conn_req_handler: CONNECT_REQUEST is the new id's first event.
    (("new", "incoming"), "CONNECT_REQUEST", "requested", _ALL),
    # cma_work_handler ROUTE_QUERY -> ROUTE_RESOLVED; cma_query_handler fail: ROUTE_QUERY ->
    # ADDR_RESOLVED with ROUTE_ERROR (7.2 also from ADDRINFO_RESOLVED), so route again.
    (("addr_resolved", "addrinfo_resolved"), "ROUTE_RESOLVED", "route_resolved", _ALL),
    (("addr_resolved", "addrinfo_resolved"), "ROUTE_ERROR", "addr_resolved", _ALL),
    # cma_ib_handler REP_RECEIVED: ESTABLISHED (QP) or CONNECT_ERROR (cma_rep_recv failed); no
    # QP: CONNECT_RESPONSE (librdmacm turns it into ESTABLISHED / CONNECT_ERROR when it owns
    # the QP). REJ_RECEIVED: REJECTED; REQ_ERROR / REP_ERROR: UNREACHABLE.
    # cma_iw_handler CONNECT_REPLY: 0 ESTABLISHED, -ECONNRESET/-ECONNREFUSED REJECTED,
    # -ETIMEDOUT UNREACHABLE, else CONNECT_ERROR; never CONNECT_RESPONSE.
    (("route_resolved",), "ESTABLISHED", "connected", _ALL),
    (("route_resolved",), "CONNECT_RESPONSE", "connected", _IB),
    (("route_resolved",), "CONNECT_ERROR", "failed", _ALL),
    (("route_resolved",), "REJECTED", "failed", _ALL),
    (("route_resolved",), "UNREACHABLE", "failed", _ALL),
    # Passive: RTU_RECEIVED / USER_ESTABLISHED (cma_ib_handler), IW_CM_EVENT_ESTABLISHED
    # (cma_iw_handler). On IB the id is in REP_SENT until then: cm_rej_handler gives REJECTED,
    # cm_process_send_error REP_ERROR gives UNREACHABLE, and cm_dreq_handler takes a DREQ in
    # REP_SENT (the RTU lost, the peer disconnecting): DISCONNECTED. iwcm.c cm_close_handler
    # BUG()s before ESTABLISHED, so iWARP has none of these.
    (("requested",), "ESTABLISHED", "connected", _ALL),
    (("requested",), "REJECTED", "failed", _IB),
    (("requested",), "UNREACHABLE", "failed", _IB),
    (("requested",), "DISCONNECTED", "disconnected", _IB),
    # cma_ib_handler: DREQ_RECEIVED / DREP_RECEIVED / DREQ_ERROR give DISCONNECTED only through
    # cma_comp_exch(CONNECT -> DISCONNECT), so once; then only TIMEWAIT_EXIT (state DISCONNECT).
    (("connected",), "DISCONNECTED", "disconnected", _IB),
    (("disconnected",), "TIMEWAIT_EXIT", "closed", _IB),
    # cm.c cm_rej_handler, ESTABLISHED with lap_state LAP_UNINIT (no LAP ever sent): timewait
    # and REJ_RECEIVED while rdma_cm is still in CONNECT, so REJECTED after ESTABLISHED; the
    # TIMEWAIT_EXIT that follows is dropped (rdma_cm not in DISCONNECT).
    (("connected",), "REJECTED", "failed", _IB),
    # iwcm.c cm_close_handler: CLOSE once (ESTABLISHED/CLOSING -> IDLE); cma_iw_handler maps it
    # to DISCONNECTED and has no TIMEWAIT_EXIT at all.
    (("connected",), "DISCONNECTED", "closed", _IW),
)
# RoCE only: an active id whose route cma_resolve_iboe_route resolved sits in cma.c's id_table;
# cma_netevent_callback queues UNREACHABLE(-ETIMEDOUT) for it (cma_netevent_work_handler) when
# the peer's neighbour entry changes MAC, in any state but DESTROYING/DEVICE_REMOVAL, as often
# as that happens, and nothing else changes. So on RoCE an active id's UNREACHABLE may come at
# any point after ROUTE_RESOLVED without ending anything (a REQ_ERROR one cannot be told apart).
_NETEVENT_PHASES = ("route_resolved", "connected", "disconnected", "closed", "failed")
_PHASES = ("new", "incoming", "idle", "addr_resolved", "addrinfo_resolved", "route_resolved",
           "requested", "connected", "failed", "disconnected", "closed", "listening", "removed")
# Any phase but removed: ADDR_CHANGE (cma_netdev_change via cma_work_handler), MULTICAST_JOIN/
# ERROR (UD multicast, not modelled: not judged beyond this); DEVICE_REMOVAL once
# (cma_send_device_removal_put skips DEVICE_REMOVAL and DESTROYING), and after it nothing: every
# handler (cma_ib_handler, cma_iw_handler, cma_work_handler) drops events in DEVICE_REMOVAL.
# USER: written by the user (librdmacm rdma_write_cm_event), any time.
_ANYTIME = ("ADDR_CHANGE", "MULTICAST_JOIN", "MULTICAST_ERROR")
# Status rules: cma.c sets these to 0 (addr_handler, cma_work_handler, cma_ib_handler,
# cma_iw_handler CONNECT_REPLY 0 / ESTABLISHED) and the errors to the failure's errno or the
# IB REJ reason (never 0: REJ reasons start at 1; iWARP -ECONNRESET / -ECONNREFUSED).
_ZERO_STATUS = frozenset({"ADDR_RESOLVED", "ROUTE_RESOLVED", "CONNECT_REQUEST", "ESTABLISHED",
                          "TIMEWAIT_EXIT"})
_NONZERO_STATUS = frozenset({"ADDR_ERROR", "ROUTE_ERROR", "CONNECT_ERROR", "UNREACHABLE",
                             "REJECTED", "ADDRINFO_ERROR"})
_WHY = {  # the rule an event breaks, named in the problem: (IB family, iWARP)
    "TIMEWAIT_EXIT": ("TIMEWAIT_EXIT comes once, after DISCONNECTED (cma_ib_handler: only in "
                      "RDMA_CM_DISCONNECT)",
                      "never on iWARP (cma_iw_handler has no TIMEWAIT_EXIT)"),
    "DISCONNECTED": ("DISCONNECTED comes once, after the connection was made (cma_ib_handler: "
                     "cma_comp_exch CONNECT->DISCONNECT)",
                     "DISCONNECTED comes once, after ESTABLISHED (iwcm.c cm_close_handler)"),
    "ESTABLISHED": ("ESTABLISHED comes once, after ROUTE_RESOLVED (active) or CONNECT_REQUEST "
                    "(passive)",) * 2,
    "CONNECT_REQUEST": ("CONNECT_REQUEST is only the first event of the id it creates "
                        "(cma_ib_req_handler, iw_conn_req_handler)",) * 2,
    "UNREACHABLE": ("UNREACHABLE ends a connect or accept (REQ_ERROR, REP_ERROR); on RoCE an "
                    "active id may also get it later from a neighbour change "
                    "(cma_netevent_callback)", "UNREACHABLE ends a connect (cma_iw_handler "
                    "CONNECT_REPLY -ETIMEDOUT)"),
    "CONNECT_RESPONSE": ("CONNECT_RESPONSE answers rdma_connect of an id without a QP "
                         "(cma_ib_handler REP_RECEIVED)",
                         "never on iWARP (cma_iw_handler has no CONNECT_RESPONSE)"),
}


def _build_event_tables() -> dict:
    tables = {}
    for transport in ("IB", "RoCE", "iWARP", ""):  # "": transport unknown, the union (IB first)
        t = {p: {} for p in _PHASES}
        for phases, event, nxt, transports in EVENT_RULES:
            if transport and transport not in transports:
                continue
            for p in phases:
                t[p].setdefault(event, nxt)
        if transport in ("RoCE", ""):
            for p in _NETEVENT_PHASES:
                t[p]["UNREACHABLE"] = p
        for p in _PHASES:
            if p != "removed":
                for event in _ANYTIME:
                    t[p][event] = p
                t[p]["DEVICE_REMOVAL"] = "removed"
            t[p]["USER"] = p
        tables[transport] = t
    return tables


_EVENT_TABLES = _build_event_tables()
_START = {None: "new", "active": "idle", "passive": "incoming", "listener": "listening"}


def _family(transport: str) -> str:
    if transport not in TRANSPORTS and transport != "":
        raise ValueError(f"transport {transport!r}: expected one of {', '.join(TRANSPORTS)}")
    return transport


class EventSequence:
    """The rdma_cm event automaton of one id. feed() returns a problem (str) or None."""

    def __init__(self, transport: str, role: Optional[str] = None):
        if role not in _START:
            raise ValueError(f"role {role!r}: expected one of {', '.join(ROLES)} or None")
        self.transport = _family(transport)
        self._table = _EVENT_TABLES[self.transport]
        self.phase = _START[role]
        self.last = ""  # the last event accepted
        self.passive = role == "passive"

    def expected(self) -> list[str]:
        """The events legal next."""
        return sorted(e for e, nxt in self._table[self.phase].items()
                      if not (self.passive and e == "UNREACHABLE" and nxt == self.phase))

    @property
    def ended(self) -> bool:
        """No connection event can come any more (closed, failed, removed)."""
        return self.phase in ("closed", "failed", "removed")

    def feed(self, event: str, status: Optional[int] = None) -> Optional[str]:
        event = event.removeprefix("RDMA_CM_EVENT_")
        if event not in EVENTS:
            return f"unknown rdma_cm event {event!r} (rdma_cma.h enum rdma_cm_event_type)"
        nxt = self._table[self.phase].get(event)
        on = self.transport or "an unknown transport"
        if nxt == self.phase and event == "UNREACHABLE" and self.passive:
            nxt = None  # the RoCE neighbour rule: passive ids are not in cma.c's id_table
        if nxt is None:
            after = f"after {self.last}" if self.last else f"as the first event ({self.phase})"
            why = _WHY.get(event, ("", ""))[self.transport == "iWARP"]
            if self.phase == "removed":
                why = "nothing comes after DEVICE_REMOVAL (cma_send_device_removal_put)"
            elif self.phase == "listening":
                why = "a listener gets only DEVICE_REMOVAL and ADDR_CHANGE; its requests " \
                      "come on new ids"
            return (f"rdma_cm {event} {after} is not legal on {on}"
                    + (f": {why}" if why else "") + f"; legal next: {', '.join(self.expected())}")
        if status is not None:
            if event in _ZERO_STATUS and status != 0:
                return f"rdma_cm {event} with status {status}: cma.c reports it with status 0"
            if event in _NONZERO_STATUS and status == 0:
                return f"rdma_cm {event} with status 0: cma.c reports the failure's errno " \
                       f"or REJ reason"
        self.phase, self.last = nxt, event
        self.passive = self.passive or event == "CONNECT_REQUEST"
        return None


def _event_of(e) -> tuple[str, Optional[int]]:
    if isinstance(e, str):
        return e, None
    if isinstance(e, dict):
        return str(e.get("event", e.get("name", ""))), e.get("status")
    if isinstance(e, tuple) and e:  # (name, status) or CmEventRecord (name, status, t_ns)
        return str(e[0]), (e[1] if len(e) > 1 else None)
    name = getattr(e, "event", None) or getattr(e, "name", None)
    if name is None:
        raise TypeError(f"not an rdma_cm event: {e!r} (a name, (name, status), a dict with "
                        f"'event', or an object with .event/.name)")
    return str(name), getattr(e, "status", None)


def check_events(events: Iterable, *, transport: str, role: Optional[str] = None) -> list[str]:
    """Problems of one id's rdma_cm event sequence (empty when legal). events: names, (name,
    status) tuples, dicts with 'event'/'status', CmEvent or conn.events records. transport:
    "IB", "RoCE" or "iWARP"; role: "active", "passive", "listener" or None (from the events).
    A sequence may stop anywhere; only what happened is judged. After the first illegal event
    the rest is not judged (its phase is unknown)."""
    seq = EventSequence(transport, role)
    for i, e in enumerate(events):
        name, status = _event_of(e)
        problem = seq.feed(name, status)
        if problem:
            return [f"event {i}: {problem}"]
    return []


# ---------------------------------------------------------------- 2. IB CM states (cm.c)
# (from, to): the function of drivers/infiniband/core/cm.c that makes the transition.
IB_CM_TRANSITIONS: dict = {
    ("IDLE", "LISTEN"): "ib_cm_listen / cm_init_listen",
    ("IDLE", "REQ_SENT"): "ib_send_cm_req",
    ("IDLE", "REQ_RCVD"): "cm_req_handler (the new id)",
    ("IDLE", "SIDR_REQ_SENT"): "ib_send_cm_sidr_req",
    ("IDLE", "SIDR_REQ_RCVD"): "cm_sidr_req_handler",
    ("LISTEN", "IDLE"): "cm_destroy_id",
    ("REQ_SENT", "MRA_REQ_RCVD"): "cm_mra_handler",
    ("REQ_SENT", "REP_RCVD"): "cm_rep_handler",
    ("REQ_SENT", "IDLE"): "cm_rej_handler / cm_process_send_error / cm_send_rej_locked",
    ("REQ_SENT", "TIMEWAIT"): "cm_rej_handler (REJ reason STALE_CONN)",
    ("MRA_REQ_RCVD", "REP_RCVD"): "cm_rep_handler",
    ("MRA_REQ_RCVD", "IDLE"): "cm_rej_handler / cm_process_send_error / cm_send_rej_locked",
    ("MRA_REQ_RCVD", "TIMEWAIT"): "cm_rej_handler (STALE_CONN)",
    ("REQ_RCVD", "MRA_REQ_SENT"): "ib_send_cm_mra",
    ("REQ_RCVD", "REP_SENT"): "ib_send_cm_rep",
    ("REQ_RCVD", "IDLE"): "cm_send_rej_locked / cm_rej_handler / cm_req_handler (no listener)"
                          " / cm_destroy_id(-ENOMEM)",
    ("REQ_RCVD", "TIMEWAIT"): "cm_rej_handler (STALE_CONN)",
    ("MRA_REQ_SENT", "REP_SENT"): "ib_send_cm_rep",
    ("MRA_REQ_SENT", "IDLE"): "cm_send_rej_locked / cm_rej_handler",
    ("MRA_REQ_SENT", "TIMEWAIT"): "cm_rej_handler (STALE_CONN)",
    ("REP_SENT", "MRA_REP_RCVD"): "cm_mra_handler",
    ("REP_SENT", "ESTABLISHED"): "cm_rtu_handler / cm_establish (COMM_EST)",
    ("REP_SENT", "DREQ_RCVD"): "cm_dreq_handler",
    ("REP_SENT", "IDLE"): "cm_rej_handler / cm_process_send_error (REP_ERROR)",
    ("REP_SENT", "TIMEWAIT"): "cm_send_rej_locked / cm_rej_handler (STALE_CONN)",
    ("MRA_REP_RCVD", "ESTABLISHED"): "cm_rtu_handler / cm_establish",
    ("MRA_REP_RCVD", "DREQ_RCVD"): "cm_dreq_handler",
    ("MRA_REP_RCVD", "IDLE"): "cm_rej_handler / cm_process_send_error (REP_ERROR)",
    ("MRA_REP_RCVD", "TIMEWAIT"): "cm_send_rej_locked / cm_rej_handler (STALE_CONN)",
    ("REP_RCVD", "MRA_REP_SENT"): "ib_send_cm_mra",
    ("REP_RCVD", "ESTABLISHED"): "ib_send_cm_rtu",
    ("REP_RCVD", "IDLE"): "cm_send_rej_locked",
    ("REP_RCVD", "TIMEWAIT"): "cm_rej_handler",
    ("MRA_REP_SENT", "ESTABLISHED"): "ib_send_cm_rtu",
    ("MRA_REP_SENT", "IDLE"): "cm_send_rej_locked",
    ("MRA_REP_SENT", "TIMEWAIT"): "cm_rej_handler",
    ("ESTABLISHED", "DREQ_SENT"): "cm_send_dreq_locked",
    ("ESTABLISHED", "DREQ_RCVD"): "cm_dreq_handler",
    ("ESTABLISHED", "TIMEWAIT"): "cm_rej_handler / cm_send_dreq_locked failing / 7.x "
                                 "cm_destroy_id (cm_issue_dreq)",
    ("ESTABLISHED", "IDLE"): "cm_destroy_id (XRC_TGT)",
    ("DREQ_SENT", "DREQ_RCVD"): "cm_dreq_handler (both sides disconnecting)",
    ("DREQ_SENT", "TIMEWAIT"): "cm_drep_handler / cm_process_send_error (DREQ_ERROR) / "
                               "cm_rej_handler / cm_destroy_id",
    ("DREQ_RCVD", "TIMEWAIT"): "cm_send_drep_locked / cm_drep_handler",
    ("TIMEWAIT", "IDLE"): "cm_timewait_handler / cm_destroy_id",
    ("SIDR_REQ_SENT", "IDLE"): "cm_sidr_rep_handler / cm_process_send_error / cm_destroy_id",
    ("SIDR_REQ_RCVD", "IDLE"): "cm_send_sidr_rep_locked / cm_destroy_id",
}
IB_CM_STATES = ("IDLE", "LISTEN", "REQ_SENT", "REQ_RCVD", "MRA_REQ_SENT", "MRA_REQ_RCVD",
                "REP_SENT", "REP_RCVD", "MRA_REP_SENT", "MRA_REP_RCVD", "ESTABLISHED",
                "DREQ_SENT", "DREQ_RCVD", "TIMEWAIT", "SIDR_REQ_SENT", "SIDR_REQ_RCVD")

# ---------------------------------------------------------------- 3. iWARP CM states (iwcm.c)
# destroy_cm_id BUG()s in CONN_SENT: it first waits (connect_wait) until the CONNECT_REPLY took
# the id to ESTABLISHED or IDLE, so CONN_SENT -> DESTROYING is not a transition.
IW_CM_TRANSITIONS: dict = {
    ("IDLE", "LISTEN"): "iw_cm_listen",
    ("IDLE", "CONN_SENT"): "iw_cm_connect",
    ("IDLE", "CONN_RECV"): "cm_conn_req_handler (the new id)",
    ("IDLE", "DESTROYING"): "destroy_cm_id",
    ("LISTEN", "IDLE"): "iw_cm_listen (the provider's listen failed)",
    ("LISTEN", "DESTROYING"): "destroy_cm_id",
    ("CONN_RECV", "ESTABLISHED"): "cm_conn_est_handler",
    ("CONN_RECV", "IDLE"): "iw_cm_reject / iw_cm_accept failing",
    ("CONN_RECV", "DESTROYING"): "destroy_cm_id (the provider rejects)",
    ("CONN_SENT", "ESTABLISHED"): "cm_conn_rep_handler (status 0)",
    ("CONN_SENT", "IDLE"): "cm_conn_rep_handler (status != 0) / iw_cm_connect failing",
    ("ESTABLISHED", "CLOSING"): "iw_cm_disconnect / cm_disconnect_handler",
    ("ESTABLISHED", "IDLE"): "cm_close_handler",
    ("ESTABLISHED", "DESTROYING"): "destroy_cm_id (abrupt close)",
    ("CLOSING", "IDLE"): "cm_close_handler",
    ("CLOSING", "DESTROYING"): "destroy_cm_id",
}
IW_CM_STATES = ("IDLE", "LISTEN", "CONN_RECV", "CONN_SENT", "ESTABLISHED", "CLOSING",
                "DESTROYING")

# ---------------------------------------------------------------- rdma_cm states (cma.c)
# A passive id is born in CONNECT (cma_ib_new_conn_id / iw_conn_req_handler set it before the
# id is seen): the history checker starts an id with a cm_create naming a listen_id there.
# Every state but DESTROYING may go to DESTROYING (destroy_id_handler_unlock) and, but for
# DEVICE_REMOVAL itself, to DEVICE_REMOVAL (cma_send_device_removal_put): added below.
RDMA_CM_TRANSITIONS: dict = {
    ("IDLE", "ADDR_BOUND"): "rdma_bind_addr_dst",
    # rdma_resolve_addr and rdma_listen bind an IDLE id first (IDLE -> ADDR_BOUND -> ...)
    # within the one call, under the id's lock: nobody sees ADDR_BOUND, the model records one.
    ("IDLE", "ADDR_QUERY"): "rdma_resolve_addr (resolve_prepare_src binds first)",
    ("IDLE", "LISTEN"): "rdma_listen (binds first)",
    ("ADDR_BOUND", "IDLE"): "rdma_bind_addr_dst failing",
    ("ADDR_BOUND", "ADDR_QUERY"): "resolve_prepare_src",
    ("ADDR_BOUND", "LISTEN"): "rdma_listen",
    ("ADDR_BOUND", "ADDRINFO_QUERY"): "7.x rdma_resolve_ib_service",
    ("ADDR_QUERY", "ADDR_RESOLVED"): "addr_handler / cma_work_handler",
    # addr_handler on error: ADDR_QUERY -> ADDR_RESOLVED -> ADDR_BOUND under handler_mutex;
    # rdma_resolve_addr's own error path goes straight back.
    ("ADDR_QUERY", "ADDR_BOUND"): "rdma_resolve_addr failing / addr_handler (ADDR_ERROR)",
    ("ADDR_RESOLVED", "ADDR_BOUND"): "addr_handler (ADDR_ERROR)",
    ("ADDR_RESOLVED", "ROUTE_QUERY"): "rdma_resolve_route",
    ("ADDR_RESOLVED", "ROUTE_RESOLVED"): "rdma_set_ib_path",
    ("ADDRINFO_QUERY", "ADDRINFO_RESOLVED"): "7.x cma_work_handler (ADDRINFO_RESOLVED)",
    ("ADDRINFO_QUERY", "ADDR_BOUND"): "7.x cma_work_handler (ADDRINFO_ERROR)",
    ("ADDRINFO_RESOLVED", "ROUTE_QUERY"): "7.x rdma_resolve_route",
    ("ROUTE_QUERY", "ROUTE_RESOLVED"): "cma_work_handler",
    ("ROUTE_QUERY", "ADDR_RESOLVED"): "cma_query_handler (ROUTE_ERROR) / rdma_resolve_route "
                                      "failing",
    ("ROUTE_QUERY", "ADDRINFO_RESOLVED"): "7.x rdma_resolve_route failing",
    ("ROUTE_RESOLVED", "CONNECT"): "rdma_connect_locked",
    ("ROUTE_RESOLVED", "ADDR_RESOLVED"): "rdma_set_ib_path failing",
    ("CONNECT", "ROUTE_RESOLVED"): "rdma_connect_locked failing",
    ("CONNECT", "DISCONNECT"): "cma_ib_handler (DREQ/DREP received, DREQ_ERROR)",
    ("LISTEN", "ADDR_BOUND"): "rdma_listen failing",
}
RDMA_CM_STATES = ("IDLE", "ADDR_QUERY", "ADDR_RESOLVED", "ROUTE_QUERY", "ROUTE_RESOLVED",
                  "CONNECT", "DISCONNECT", "ADDR_BOUND", "LISTEN", "DEVICE_REMOVAL", "DESTROYING",
                  "ADDRINFO_QUERY", "ADDRINFO_RESOLVED")
for _s in RDMA_CM_STATES:
    if _s != "DESTROYING":
        RDMA_CM_TRANSITIONS[(_s, "DESTROYING")] = "rdma_destroy_id / destroy_id_handler_unlock"
    if _s not in ("DESTROYING", "DEVICE_REMOVAL"):
        RDMA_CM_TRANSITIONS[(_s, "DEVICE_REMOVAL")] = "cma_send_device_removal_put"

LAYERS = {  # layer -> (states, transitions, source file)
    "rdma_cm": (RDMA_CM_STATES, RDMA_CM_TRANSITIONS, "cma.c (cma_priv.h enum rdma_cm_state)"),
    "ib_cm": (IB_CM_STATES, IB_CM_TRANSITIONS, "cm.c (ib_cm.h enum ib_cm_state)"),
    "iw_cm": (IW_CM_STATES, IW_CM_TRANSITIONS, "iwcm.c (iwcm.h enum iw_cm_state)"),
}
_NEXT = {layer: {s: sorted(t for f, t in tr if f == s) for s in states}
         for layer, (states, tr, _) in LAYERS.items()}


def transition_problem(layer: str, frm: str, to: str) -> Optional[str]:
    """Why frm -> to is not a transition of the layer's state machine, or None."""
    if layer not in LAYERS:
        raise ValueError(f"layer {layer!r}: expected one of {', '.join(LAYERS)}")
    states, transitions, source = LAYERS[layer]
    for s in (frm, to):
        if s not in states:
            return f"{layer}: unknown state {s!r} ({source} has {', '.join(states)})"
    if (frm, to) in transitions:
        return None
    legal = ", ".join(_NEXT[layer][frm]) or "none"
    return f"{layer}: {frm} -> {to} is not a transition of {source}; from {frm}: {legal}"


def check_transitions(layer: str, states: Iterable[str], *, initial: str = "IDLE") -> list[str]:
    """Problems of a state path (empty when legal): initial -> states[0] -> states[1] ..."""
    problems, cur = [], initial
    for i, s in enumerate(states):
        p = transition_problem(layer, cur, s)
        if p:
            problems.append(f"step {i}: {p}")
        cur = s
    return problems


# ---------------------------------------------------------------- the history checker


def _inferred_transports(history: list) -> dict:
    """host -> "iWARP" / "IB" from the CM layers its records show (IB and RoCE judge alike)."""
    out: dict = {}
    for r in history:
        if r.get("kind") in ("cm_create", "cm_state"):
            layer = (r.get("data") or {}).get("layer")
            if layer == "iw_cm":
                out[r.get("host", "")] = "iWARP"
            elif layer == "ib_cm":
                out.setdefault(r.get("host", ""), "IB")
    return out


class _Run:
    """One pass over a history: per-object automata keyed by (host, object[, layer], epoch)."""

    def __init__(self, history: list, ctx: Context):
        self.history, self.ctx = history, ctx
        self.res = Result(NAME)
        self.reasons: dict = {}  # reason -> None (ordered set)
        self.transport: dict = {}
        self.inferred: Optional[dict] = None
        self.epoch: dict = {}    # host -> reboots it came back from (host_up, host_back)
        self.seqs: dict = {}     # key -> [EventSequence or None (broken), last seq]
        self.states: dict = {}   # key -> [state or None (broken), last seq]
        self.passive: set = set()
        self.judged = 0          # objects judged

    def transport_of(self, host: str) -> str:
        t = self.transport.get(host)
        if t is None:
            t = self.ctx.transport(host) if self.ctx is not None else ""
            if t and t not in TRANSPORTS:
                self.reasons[f"ctx.transports[{host!r}] is {t!r}, not one of "
                             f"{', '.join(TRANSPORTS)}: judged as unknown"] = None
                t = ""
            if not t:
                if self.inferred is None:
                    self.inferred = _inferred_transports(self.history)
                t = self.inferred.get(host, "")
            if not t:
                self.reasons[f"transport of host {host!r} unknown (no ctx.transports entry, no "
                             f"ib_cm/iw_cm records): its events judged by the rules common to "
                             f"IB and iWARP"] = None
            self.transport[host] = t
        return t

    def new_sequence(self, host: str) -> list:
        self.judged += 1
        return [EventSequence(self.transport_of(host)), None]

    def created(self, host: str, obj: str, layer, passive: bool) -> None:
        """A create record: the object starts anew (a label may come again after a reboot)."""
        ep = self.epoch.get(host, 0)
        self.states.pop((host, obj, layer, ep), None)
        if layer == "rdma_cm":
            self.seqs.pop((host, obj, ep), None)
            (self.passive.add if passive else self.passive.discard)((host, obj, ep))

    def listening(self, host: str, obj: str) -> None:
        key = (host, obj, self.epoch.get(host, 0))
        entry = self.seqs.get(key)
        if entry is None:
            entry = self.seqs[key] = self.new_sequence(host)
        if entry[0] is not None and entry[0].phase in _RESOLVING:
            entry[0].phase = "listening"

    def on_event(self, r: dict, host: str, obj: str, data: dict) -> None:
        if not obj.startswith("cm_id:"):
            return  # an event the channel could not match to an id (device labs)
        key = (host, obj, self.epoch.get(host, 0))
        entry = self.seqs.get(key)
        if entry is None:
            entry = self.seqs[key] = self.new_sequence(host)
        seq = entry[0]
        if seq is None:
            return
        event, status = data.get("event"), data.get("status")
        if not isinstance(event, str):
            entry[0] = None
            return self.res.fail(f"cm_event record without an event name: {data!r}",
                                 (r.get("seq"),), host, obj)
        problem = seq.feed(event, status if isinstance(status, int) else None)
        if problem:
            entry[0] = None  # its phase is unknown from here: not judged further
            prev = () if entry[1] is None else (entry[1],)
            return self.res.fail(problem, prev + (r.get("seq"),), host, obj)
        entry[1] = r.get("seq")

    def on_state(self, r: dict, host: str, obj: str, data: dict) -> None:
        layer = data.get("layer")
        if layer not in LAYERS:
            self.reasons[f"cm_state layer {layer!r} unknown (known: {', '.join(LAYERS)}): "
                         f"not judged"] = None
            return
        ep = self.epoch.get(host, 0)
        key = (host, obj, layer, ep)
        entry = self.states.get(key)
        if entry is None:
            start = "CONNECT" if layer == "rdma_cm" and (host, obj, ep) in self.passive \
                else "IDLE"
            entry = self.states[key] = [start, None]
            self.judged += 1
        cur = entry[0]
        if cur is None:
            return
        frm, to = data.get("from"), data.get("to")
        if not isinstance(frm, str) or not isinstance(to, str):
            entry[0] = None
            return self.res.fail(f"{layer}: cm_state record without from/to: {data!r}",
                                 (r.get("seq"),), host, obj)
        seqs = () if entry[1] is None else (entry[1],)
        if frm != cur:
            was = f"its last transition went to {cur}" if entry[1] is not None else \
                f"a new id starts in {cur}"
            self.res.fail(f"{layer}: transition from {frm} but {was} (a jump)",
                          seqs + (r.get("seq"),), host, obj)
        else:
            problem = transition_problem(layer, frm, to)
            if problem:
                self.res.fail(problem, seqs + (r.get("seq"),), host, obj)
        if to in LAYERS[layer][0]:
            entry[0], entry[1] = to, r.get("seq")
        else:
            entry[0] = None

    def run(self) -> Result:
        for i, r in enumerate(self.history):
            if not isinstance(r, dict):
                self.res.fail(f"history entry {i} is not a record (a dict): {r!r}")
                continue
            kind = r.get("kind")
            if kind not in ("cm_event", "cm_state", "cm_create", "verb", "host_up", "host_back"):
                continue
            host = r.get("host", "")
            data = r.get("data")
            if not isinstance(data, dict):
                self.res.fail(f"{kind} record whose data is not an object: {data!r}",
                              (r.get("seq"),), host, r.get("object", ""))
                continue
            obj = r.get("object", "")
            if kind == "cm_event":
                self.on_event(r, host, obj, data)
            elif kind == "cm_state":
                self.on_state(r, host, obj, data)
            elif kind == "cm_create":
                layer = data.get("layer")
                self.created(host, obj, layer, layer == "rdma_cm" and bool(data.get("listen_id")))
            elif kind == "verb":
                verb = data.get("verb")
                if verb == "rdma_create_id":
                    self.created(host, obj, "rdma_cm", False)
                elif verb == "rdma_listen":
                    self.listening(host, obj)
            else:
                self.epoch[host] = self.epoch.get(host, 0) + 1
        res = self.res
        res.checked = self.judged
        if self.reasons:
            res.reason = "; ".join(self.reasons)
            if res.verdict == VALID:
                res.verdict = UNKNOWN
        return res


def check(history: list[dict], ctx: Optional[Context] = None) -> Result:
    """Every cm_id's rdma_cm events (cm_event) and every cm_state record of the layers rdma_cm,
    ib_cm and iw_cm, per object and host epoch (a host back from a reboot has new objects)."""
    return _Run(history, ctx if ctx is not None else Context()).run()
