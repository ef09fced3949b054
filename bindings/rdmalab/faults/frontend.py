"""Fault verbs of a lab (lab.faults). The model applies every fault; a backend that cannot
apply one raises FaultNotSupported naming it, never a silent pass.

Wire faults are the fault switch's rules (faults/rules.h), one JSON object each: on the model
the fabric applies them in C++ with the switch's own parser and matcher to the frame each packet
stands for (core/model/wire_rules.h), so a rule means the same on every backend and no packet
calls into Python. The first rule that takes a packet decides; a watch rule counts and passes.
Examples:

    lab.faults.drop(cm="DREP")                             # lose every DREP
    dreqs = lab.faults.watch(cm="DREQ"); ...; dreqs.hits    # count without touching
    lab.faults.drop(opcode="ACKNOWLEDGE", src_host="b", count=3)
    lab.faults.drop(tcp_flags="FIN")                       # iWARP: lose the FINs
    lab.faults.delay(dest_qpn=qpn, delay_ns=ms(5), probability=0.5)
    lab.faults.reorder(opcode="SEND_ONLY", count=1)        # after the next packet of its QP
    lab.faults.rule({"action": "drop", "cm": "REP", "every": 2})   # the switch's object as is
    lab.faults.on_verb(lambda call: ..., verb="ibv_destroy_qp")   # timing faults
    lab.faults.at(lab.now_ns + us(10), lambda: proc.kill())
"""

from __future__ import annotations

import json
from typing import Callable, Optional

from .. import _core
from ..errors import FaultNotSupported, Hung, as_fault
from ..names import parse

# IBTA CM MAD attribute IDs (semantics.md A).
CM_ATTR_ID = {"REQ": 0x10, "MRA": 0x11, "REJ": 0x12, "REP": 0x13, "RTU": 0x14, "DREQ": 0x15,
              "DREP": 0x16, "SIDR_REQ": 0x17, "SIDR_REP": 0x18, "LAP": 0x19, "APR": 0x1A}


def expand_cm(fields: dict) -> dict:
    """fields with cm="DREP" spelled out as the packet fields it means (opcode MAD and the
    attribute ID); a copy, so the caller's dict is untouched (nftables rules use it)."""
    fields = dict(fields)
    if "cm" in fields:
        msg = fields.pop("cm")
        if msg not in CM_ATTR_ID:
            raise ValueError(f"unknown CM message {msg!r}; allowed: {', '.join(CM_ATTR_ID)}")
        fields.update(opcode="MAD", mad_attr_id=CM_ATTR_ID[msg])
    return fields


def rule_spec(action: str, match, fields: dict, **params) -> dict:
    """The switch's rule object for a fault verb's arguments: the action, the match keys, and
    the parameters given (None: not given). A Python predicate is refused: it would be a call
    into Python for every packet."""
    if match is not None:
        raise TypeError(f"lab.faults.{action}: a Python predicate would run for every packet; "
                        "wire rules are the fault switch's fields, applied in C++: give them "
                        "(cm=, opcode=, transport=, dest_qpn=, src_host=, tcp_flags=, ...)")
    return {"action": action, **{k: v for k, v in fields.items() if v is not None},
            **{k: v for k, v in params.items() if v is not None}}


class WireRule:
    """A wire rule in the model's fabric, as the VM lab's SwitchRule: `hits` is the packets it
    took (a watch rule: the packets it counted), read from the engine; `remove()` takes it
    out."""

    def __init__(self, faults: "Faults", rule: dict, rule_id: int):
        self.action, self.rule, self.id = rule["action"], rule, rule_id
        self._faults = faults
        self._final_hits: Optional[int] = None

    @property
    def hits(self) -> int:
        if self._final_hits is not None:
            return self._final_hits
        return self._faults._counters(self.id)["acted"]

    def remove(self) -> None:
        if self._final_hits is None:
            self._final_hits = self.hits
            self._faults._o.remove_rule(self.id)
            self._faults._rules.remove(self)

    def __repr__(self) -> str:
        return f"<WireRule {self.id} {self.rule}>"


class Faults:
    """The model lab's fault verbs (ModelLab in model.h)."""

    def __init__(self, lab):
        self._lab = lab
        self._rules: list[WireRule] = []
        self._verb_hooks: list[tuple[Optional[str], Callable]] = []

    @property
    def _o(self):
        return self._lab._o

    # -- wire: the fault switch's rules (faults/rules.h), keys as it takes them
    def rule(self, spec: dict) -> WireRule:
        """A wire rule given as the fault switch's JSON object ({"action": "drop", "cm":
        "DREP", ...}), as the VM lab's lab.faults.rule takes it. A bad rule raises ValueError
        naming the key ("rule.opcode: unknown opcode 'SEND_ONYL'"); corrupt raises
        FaultNotSupported (the model's fabric carries no bytes)."""
        if not isinstance(spec, dict):
            raise TypeError(f"rule: a dict (the switch's JSON rule object), got {spec!r}")
        if spec.get("action") == "corrupt":
            raise FaultNotSupported("corrupt", "the model's fabric carries packets, not bytes: "
                                    "it cannot corrupt a header (inject_async_event models the "
                                    "effect)")
        rid = self._o.add_rule(json.dumps(spec))
        rule = WireRule(self, dict(spec), rid)
        self._rules.append(rule)
        return rule

    def drop(self, match=None, *, count: Optional[int] = None, every: Optional[int] = None,
             probability: Optional[float] = None, **fields) -> WireRule:
        return self.rule(rule_spec("drop", match, fields, count=count, every=every,
                                   probability=probability))

    def delay(self, match=None, *, delay_ns: int, count: Optional[int] = None,
              every: Optional[int] = None, probability: Optional[float] = None,
              **fields) -> WireRule:
        return self.rule(rule_spec("delay", match, fields, delay_ns=delay_ns, count=count,
                                   every=every, probability=probability))

    def duplicate(self, match=None, *, count: Optional[int] = None, every: Optional[int] = None,
                  probability: Optional[float] = None, **fields) -> WireRule:
        return self.rule(rule_spec("duplicate", match, fields, count=count, every=every,
                                   probability=probability))

    def reorder(self, match=None, *, hold_ns: Optional[int] = None, count: Optional[int] = None,
                every: Optional[int] = None, probability: Optional[float] = None,
                **fields) -> WireRule:
        """The switch's reorder: a matching packet is held until the next packet of its flow
        passes and arrives right after it, or hold_ns (default 100 ms, the switch's) after it
        would have. A flow on the model is one QP's packets from one host to another; the
        iWARP CM's TCP packets, which name no QP, are one flow per host pair, apart from the
        connection's FPDUs (the model's packets carry no TCP ports)."""
        return self.rule(rule_spec("reorder", match, fields, hold_ns=hold_ns, count=count,
                                   every=every, probability=probability))

    def watch(self, match=None, **fields) -> WireRule:
        """Counts matching packets (rule.hits) and lets them pass; never decides a packet, so
        the rules after it still apply."""
        return self.rule(rule_spec("watch", match, fields))

    def corrupt(self, match=None, **kw) -> WireRule:
        raise FaultNotSupported("corrupt", "the model's fabric carries packets, not bytes: it "
                                "cannot corrupt a header (inject_async_event models the effect)")

    def remove(self, rule: WireRule) -> None:
        rule.remove()

    def rules(self) -> list[dict]:
        """The engine's rules with their counters: [{id, rule, matched, acted}]."""
        return json.loads(self._o.rules())

    def _counters(self, rule_id: int) -> dict:
        for r in self.rules():
            if r["id"] == rule_id:
                return r
        raise KeyError(f"no wire rule {rule_id} in the lab")

    def fabric(self, *, latency_ns: Optional[int] = None, jitter_ns: Optional[int] = None,
               loss_ppm: Optional[int] = None) -> None:
        """Fabric-wide latency, jitter and random loss (parts per million)."""
        opts = _core.FabricOptions()
        for key, value in (("latency_ns", latency_ns), ("jitter_ns", jitter_ns),
                           ("loss_ppm", loss_ppm)):
            if value is not None:
                setattr(opts, key, value)
        self._o.set_fabric(opts)

    # -- timing
    def at(self, t_ns: int, fn: Callable[[], None]) -> None:
        """Runs fn at virtual time t_ns (absolute)."""
        self._o.at(t_ns, fn)

    def after(self, delay_ns: int, fn: Callable[[], None]) -> None:
        self._o.at(self._lab.now_ns + delay_ns, fn)

    def on_verb(self, fn: Callable, verb: Optional[str] = None) -> None:
        """fn(call) at the entry of every verb (or of `verb`), before it acts."""
        self._verb_hooks.append((verb, fn))
        self._install_verb_hook()

    # -- device and process
    def inject_async_event(self, host, event_type, number: int, driver_delay_ns: int = 0) -> None:
        """The device raises event_type on object `number` (QPN, SRQN, CQ id or port); the
        driver handles it after driver_delay_ns."""
        t = parse(_core.AsyncEventType, event_type, "async event type")
        as_fault(f"inject_async_event({t.name})", self._o.inject_async_event,
                           _host_name(host), t, number, driver_delay_ns)

    def port_down(self, host) -> None:
        as_fault("port_down", self._o.set_port_state, _host_name(host), False)

    def port_up(self, host) -> None:
        as_fault("port_up", self._o.set_port_state, _host_name(host), True)

    def neigh_flush(self, host) -> None:
        """Not in the model: its hosts resolve each other's addresses at once, it has no
        neighbour table to flush."""
        raise FaultNotSupported("neigh_flush", "the model has no neighbour table: its "
                                "addresses resolve at once")

    def device_fatal(self, host) -> None:
        as_fault("device_fatal", self._o.device_fatal, _host_name(host))

    def rdma_link_delete(self, host) -> None:
        """`rdma link delete` (ib_uverbs_remove_one): with caps.disassociates every user
        context gets DEVICE_FATAL and the removal completes; without, nothing is raised and it
        stays pending until every context on the device is closed. Unlisted at once."""
        as_fault("rdma_link_delete", self._o.rdma_link_delete, _host_name(host))

    def rdma_link_add(self, host, deadline_s: float = 30.0) -> None:
        """`rdma link add`, once the removal has finished: Hung if it still blocks after
        deadline_s (virtual) because a user context on the device is still open, as the agent
        lab's."""
        name = _host_name(host)
        if self._o.rdma_link_removal_pending(name):
            try:
                self._lab.wait_until(lambda: not self._o.rdma_link_removal_pending(name),
                                     int(deadline_s * 1e9), f"rdma link delete on {name}")
            except Hung as e:
                raise Hung(f"{name}: rdma link delete", f"rdma link delete on {name} still "
                           f"blocks after {deadline_s} s: a user context on it is still "
                           "open") from e
        self._o.rdma_link_add(name)

    def reboot(self, host, down_ns: int) -> None:
        """The host loses all state at once (processes, QPs, CM state, timers) and is back
        after down_ns with the same node GUID and first QPN; packets to it meanwhile are
        lost, and its processes and objects from before are dead (EBADF / ESRCH)."""
        as_fault("reboot", self._o.reboot, _host_name(host), down_ns)

    def kill(self, process) -> None:
        """SIGKILL a process (same as process.kill())."""
        process.kill()

    def counts(self) -> dict[str, int]:
        """Faults applied so far, by kind ("drop", "delay", "async_event", "kill", ...)."""
        return dict(self._o.fault_counts())

    def clear(self) -> None:
        """Removes every wire rule and verb hook."""
        if self._rules:
            acted = {r["id"]: r["acted"] for r in self.rules()}
            for rule in self._rules:  # their hits stay readable
                rule._final_hits = acted.get(rule.id, 0)
            self._rules.clear()
        self._o.clear_rules()
        self._verb_hooks.clear()
        self._o.set_verb_hook(None)

    # -- internals
    def _install_verb_hook(self) -> None:
        hooks = self._verb_hooks

        def hook(call):
            for verb, fn in hooks:
                if verb is None or verb == call.verb:
                    fn(call)

        self._o.set_verb_hook(hook if hooks else None)


class NoFaults:
    """Fault verbs of a backend that applies none of them (yet): each raises FaultNotSupported."""

    def __init__(self, lab):
        self._lab = lab

    def kill(self, process) -> None:
        process.kill()

    def clear(self) -> None:
        pass

    def __getattr__(self, fault: str):
        if fault.startswith("_"):
            raise AttributeError(fault)
        reason = self._unsupported_reason(fault)

        def unsupported(*args, **kwargs):
            raise FaultNotSupported(fault, reason)

        return unsupported

    def _unsupported_reason(self, fault: str) -> str:
        return f"{self._lab.description or self._lab.backend} cannot apply this fault"


def _host_name(host) -> str:
    return host if isinstance(host, str) else host.name
