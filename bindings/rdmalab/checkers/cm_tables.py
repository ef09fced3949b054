"""The kernel's rdma_cm state machines as data, each rule with the kernel or rdma-core source
that makes it (issue 17, item 4); rdmalab.checkers.cm_sequence judges histories by them.

  1. EVENT_RULES: the rdma_cm events of one RC id (RDMA_PS_TCP; UD's SIDR path is not
     modelled) as the user reads them, per transport (IB and RoCE share
     drivers/infiniband/core/cm.c, RoCE adds cma.c's neighbour watch; iWARP goes through
     iwcm.c). The phases are what the user has seen so far, not kernel states.
  2. IB_CM_TRANSITIONS: the states of layer "ib_cm" (cm.c, enum ib_cm_state).
  3. IW_CM_TRANSITIONS and RDMA_CM_TRANSITIONS: layers "iw_cm" (iwcm.c) and "rdma_cm" (cma.c).
Sources: Linux 6.1.192 and 7.2 drivers/infiniband/core/{cma.c,cm.c,iwcm.c,ucma.c}, rdma-core
librdmacm/cma.c rdma_get_cm_event.
"""
from __future__ import annotations

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
RESOLVING = ("new", "idle")
EVENT_RULES: tuple = (
    # (phases, event, next phase, transports)
    # cma.c addr_handler: ADDR_QUERY -> ADDR_RESOLVED (librdmacm ucma_process_addr_resolved may
    # report it as ADDR_ERROR); on error ADDR_RESOLVED -> ADDR_BOUND, where resolve_prepare_src
    # lets the user resolve again.
    (RESOLVING, "ADDR_RESOLVED", "addr_resolved", _ALL),
    (RESOLVING, "ADDR_ERROR", "idle", _ALL),
    # 7.x cma.c rdma_resolve_ib_service: ADDR_BOUND -> ADDRINFO_QUERY -> ADDRINFO_RESOLVED, or
    # back to ADDR_BOUND with ADDRINFO_ERROR (librdmacm rdma_resolve_addrinfo).
    (RESOLVING, "ADDRINFO_RESOLVED", "addrinfo_resolved", _ALL),
    (RESOLVING, "ADDRINFO_ERROR", "idle", _ALL),
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
NETEVENT_PHASES = ("route_resolved", "connected", "disconnected", "closed", "failed")
PHASES = ("new", "incoming", "idle", "addr_resolved", "addrinfo_resolved", "route_resolved",
           "requested", "connected", "failed", "disconnected", "closed", "listening", "removed")
# Any phase but removed: ADDR_CHANGE (cma_netdev_change via cma_work_handler), MULTICAST_JOIN/
# ERROR (UD multicast, not modelled: not judged beyond this); DEVICE_REMOVAL once
# (cma_send_device_removal_put skips DEVICE_REMOVAL and DESTROYING), and after it nothing: every
# handler (cma_ib_handler, cma_iw_handler, cma_work_handler) drops events in DEVICE_REMOVAL.
# USER: written by the user (librdmacm rdma_write_cm_event), any time.
ANYTIME = ("ADDR_CHANGE", "MULTICAST_JOIN", "MULTICAST_ERROR")
# Status rules: cma.c sets these to 0 (addr_handler, cma_work_handler, cma_ib_handler,
# cma_iw_handler CONNECT_REPLY 0 / ESTABLISHED) and the errors to the failure's errno or the
# IB REJ reason (never 0: REJ reasons start at 1; iWARP -ECONNRESET / -ECONNREFUSED).
ZERO_STATUS = frozenset({"ADDR_RESOLVED", "ROUTE_RESOLVED", "CONNECT_REQUEST", "ESTABLISHED",
                          "TIMEWAIT_EXIT"})
NONZERO_STATUS = frozenset({"ADDR_ERROR", "ROUTE_ERROR", "CONNECT_ERROR", "UNREACHABLE",
                             "REJECTED", "ADDRINFO_ERROR"})
WHY = {  # the rule an event breaks, named in the problem: (IB family, iWARP)
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
