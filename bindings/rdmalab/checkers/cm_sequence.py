"""Each cm_id's event sequence is legal under rdma_cm, and each IB CM / iWARP CM / rdma_cm state
record is a transition of its kernel state machine (issue 17, item 4), by the tables of
rdmalab.checkers.cm_tables (each rule with its kernel source): `cm_event` records (object
"cm_id:N") against EVENT_RULES, `cm_state` records of the layers "ib_cm", "iw_cm" and "rdma_cm"
against their transitions. The checker judges what happened, never completeness: an id
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
from .cm_tables import (ANYTIME, EVENT_RULES, EVENTS, LAYERS, NETEVENT_PHASES, NONZERO_STATUS,
                        PHASES, RESOLVING, ROLES, TRANSPORTS, WHY, ZERO_STATUS)

NAME = "cm_sequence"

# ---------------------------------------------------------------- rdma_cm events per id


def _build_event_tables() -> dict:
    tables = {}
    for transport in ("IB", "RoCE", "iWARP", ""):  # "": transport unknown, the union (IB first)
        t = {p: {} for p in PHASES}
        for phases, event, nxt, transports in EVENT_RULES:
            if transport and transport not in transports:
                continue
            for p in phases:
                t[p].setdefault(event, nxt)
        if transport in ("RoCE", ""):
            for p in NETEVENT_PHASES:
                t[p]["UNREACHABLE"] = p
        for p in PHASES:
            if p != "removed":
                for event in ANYTIME:
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
            why = WHY.get(event, ("", ""))[self.transport == "iWARP"]
            if self.phase == "removed":
                why = "nothing comes after DEVICE_REMOVAL (cma_send_device_removal_put)"
            elif self.phase == "listening":
                why = "a listener gets only DEVICE_REMOVAL and ADDR_CHANGE; its requests " \
                      "come on new ids"
            return (f"rdma_cm {event} {after} is not legal on {on}"
                    + (f": {why}" if why else "") + f"; legal next: {', '.join(self.expected())}")
        if status is not None:
            if event in ZERO_STATUS and status != 0:
                return f"rdma_cm {event} with status {status}: cma.c reports it with status 0"
            if event in NONZERO_STATUS and status == 0:
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


# ---------------------------------------------------------------- state transitions
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
        if entry[0] is not None and entry[0].phase in RESOLVING:
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
