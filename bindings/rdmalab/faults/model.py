"""The model's fault verbs (ModelLab in model.h): the model applies every fault. Wire rules go
through the one front-end (rdmalab.faults.wire) to the model's fabric, which applies them in
C++ with the switch's own parser and matcher to the frame each packet stands for
(core/model/wire_rules.h), so a rule means the same on every backend and no packet calls into
Python. The first rule that takes a packet decides; a watch rule counts and passes.

    lab.faults.on_verb(lambda call: ..., verb="ibv_destroy_qp")   # timing faults
    lab.faults.at(lab.now_ns + us(10), lambda: proc.kill())
"""

from __future__ import annotations

import json
from typing import Callable, Optional

from .. import _core
from ..errors import FaultNotSupported, Hung, as_fault
from ..names import parse
from .common import host_name
from .wire import WireFaults

class WireRule:
    """A wire rule in the model's fabric, as the agent lab's SwitchRule: `hits` is the packets
    it took (a watch rule: the packets it counted), read from the engine; `remove()` takes it
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


class FabricSink:
    """The model's fabric as the sink of wire rules: every action but corrupt (the fabric
    carries packets, not bytes); it stands for the whole path, switch and hosts alike."""

    def __init__(self, faults: "Faults"):
        self._faults = faults

    def refusal(self, spec: dict) -> Optional[str]:
        if spec.get("action") == "corrupt":
            return ("the model's fabric carries packets, not bytes: it cannot corrupt a header "
                    "(inject_async_event models the effect)")
        return None

    def add(self, spec: dict) -> WireRule:
        f = self._faults
        rule = WireRule(f, spec, f._o.add_rule(json.dumps(spec)))
        f._rules.append(rule)
        return rule


class Faults(WireFaults):
    """The model lab's fault verbs: wire rules (rdmalab.faults.wire), timing, devices, hosts."""

    def __init__(self, lab):
        self._lab = lab
        self._rules: list[WireRule] = []
        self._verb_hooks: list[tuple[Optional[str], Callable]] = []
        self._sink = FabricSink(self)

    @property
    def _o(self):
        return self._lab._o

    def _wire_sink(self, at: Optional[str]) -> FabricSink:
        if at in ("bridge", "host"):
            raise FaultNotSupported("wire", f"at={at!r}: the model's hosts have no nftables; "
                                    "its fabric stands for the whole path (at=None)")
        return self._sink

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
                           host_name(host), t, number, driver_delay_ns)

    def port_down(self, host) -> None:
        as_fault("port_down", self._o.set_port_state, host_name(host), False)

    def port_up(self, host) -> None:
        as_fault("port_up", self._o.set_port_state, host_name(host), True)

    def neigh_flush(self, host) -> None:
        """Not in the model: its hosts resolve each other's addresses at once, it has no
        neighbour table to flush."""
        raise FaultNotSupported("neigh_flush", "the model has no neighbour table: its "
                                "addresses resolve at once")

    def device_fatal(self, host) -> None:
        as_fault("device_fatal", self._o.device_fatal, host_name(host))

    def rdma_link_delete(self, host) -> None:
        """`rdma link delete` (ib_uverbs_remove_one): with caps.disassociates every user
        context gets DEVICE_FATAL and the removal completes; without, nothing is raised and it
        stays pending until every context on the device is closed. Unlisted at once."""
        as_fault("rdma_link_delete", self._o.rdma_link_delete, host_name(host))

    def rdma_link_add(self, host, deadline_s: float = 30.0) -> None:
        """`rdma link add`, once the removal has finished: Hung if it still blocks after
        deadline_s (virtual) because a user context on the device is still open, as the agent
        lab's."""
        name = host_name(host)
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
        as_fault("reboot", self._o.reboot, host_name(host), down_ns)

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
