"""The one front-end of wire faults: every lab's lab.faults takes wire rules through these verbs.

A rule is the fault switch's JSON object (faults/rules.h), whatever applies it: each verb builds
it, the lab's sink for `at` says whether it can apply it (FaultNotSupported naming why not),
the switch's own parser checks it (rdmalab._core.check_wire_rule: one message for a bad key on
every backend), and the sink installs it and hands back a handle (`hits`, `remove()`).

Sinks: the model's fabric (rdmalab.faults.model), the fault switch and nftables in a host or a
bridge (rdmalab.labs.agent.sinks). `at` chooses among what the lab has: "switch", "bridge",
"host", or None for the lab's default.

    lab.faults.drop(cm="DREP")                             # lose every DREP
    dreqs = lab.faults.watch(cm="DREQ"); ...; dreqs.hits    # count without touching
    lab.faults.drop(opcode="ACKNOWLEDGE", src_host="b", count=3)
    lab.faults.drop(tcp_flags="FIN")                       # iWARP: lose the FINs
    lab.faults.delay(dest_qpn=qpn, delay_ns=ms(5), probability=0.5)
    lab.faults.reorder(opcode="SEND_ONLY", count=1)        # after the next packet of its QP
    lab.faults.rule({"action": "drop", "cm": "REP", "every": 2})   # the switch's object as is
    lab.faults.drop(cm="REP", src_host="b", at="host")     # nftables in b's output hook
"""

from __future__ import annotations

import json
from typing import Optional, Protocol

from .. import _core
from ..errors import FaultNotSupported

# IBTA CM MAD attribute IDs (semantics.md A).
CM_ATTR_ID = {"REQ": 0x10, "MRA": 0x11, "REJ": 0x12, "REP": 0x13, "RTU": 0x14, "DREQ": 0x15,
              "DREP": 0x16, "SIDR_REQ": 0x17, "SIDR_REP": 0x18, "LAP": 0x19, "APR": 0x1A}
# Where a rule may sit: the fault switch on the path, nftables in the bridge on the path, or
# nftables in the sending host's output hook.
AT = ("switch", "bridge", "host")


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


class WireRuleHandle(Protocol):
    """What a sink hands back for an installed rule."""
    action: str

    @property
    def hits(self) -> int: ...   # packets it acted on (a watch rule: counted)
    def remove(self) -> None: ...


class WireSink(Protocol):
    """Where a lab's rules go: the model's fabric, the fault switch, nftables."""

    def refusal(self, spec: dict) -> Optional[str]:
        """Why this sink cannot apply the rule, or None."""

    def add(self, spec: dict) -> WireRuleHandle: ...


class WireFaults:
    """The wire verbs of lab.faults; a lab's faults class supplies _wire_sink(at)."""

    def _wire_sink(self, at: Optional[str]) -> WireSink:
        raise NotImplementedError

    def rule(self, spec: dict, *, at: Optional[str] = None) -> WireRuleHandle:
        """A wire rule given as the fault switch's JSON object ({"action": "drop", "cm":
        "DREP", ...}). A bad rule raises ValueError naming the key ("rule.opcode: unknown
        opcode 'SEND_ONYL'"); a rule the chosen sink cannot apply raises FaultNotSupported."""
        if not isinstance(spec, dict):
            raise TypeError(f"rule: a dict (the switch's JSON rule object), got {spec!r}")
        if at is not None and at not in AT:
            raise ValueError(f"at={at!r}: 'switch' (the fault switch), 'bridge' (nftables in "
                             "the bridge on the path) or 'host' (nftables in the sending host)")
        sink = self._wire_sink(at)
        why = sink.refusal(spec)
        if why:
            raise FaultNotSupported(str(spec.get("action", "rule")), why)
        _core.check_wire_rule(json.dumps(spec))
        return sink.add(dict(spec))

    def drop(self, match=None, *, count: Optional[int] = None, every: Optional[int] = None,
             probability: Optional[float] = None, at: Optional[str] = None, **fields):
        return self.rule(rule_spec("drop", match, fields, count=count, every=every,
                                   probability=probability), at=at)

    def delay(self, match=None, *, delay_ns: int, count: Optional[int] = None,
              every: Optional[int] = None, probability: Optional[float] = None,
              at: Optional[str] = None, **fields):
        return self.rule(rule_spec("delay", match, fields, delay_ns=delay_ns, count=count,
                                   every=every, probability=probability), at=at)

    def duplicate(self, match=None, *, count: Optional[int] = None, every: Optional[int] = None,
                  probability: Optional[float] = None, at: Optional[str] = None, **fields):
        return self.rule(rule_spec("duplicate", match, fields, count=count, every=every,
                                   probability=probability), at=at)

    def reorder(self, match=None, *, hold_ns: Optional[int] = None, count: Optional[int] = None,
                every: Optional[int] = None, probability: Optional[float] = None,
                at: Optional[str] = None, **fields):
        """A matching packet is held until the next packet of its flow passes and arrives
        right after it, or hold_ns (default 100 ms, the switch's) after it would have. On the
        model a flow is one QP's packets from one host to another; the iWARP CM's TCP packets,
        which name no QP, are one flow per host pair, apart from the connection's FPDUs."""
        return self.rule(rule_spec("reorder", match, fields, hold_ns=hold_ns, count=count,
                                   every=every, probability=probability), at=at)

    def watch(self, match=None, *, at: Optional[str] = None, **fields):
        """Counts matching packets (rule.hits) and lets them pass; never decides a packet, so
        the rules after it still apply."""
        return self.rule(rule_spec("watch", match, fields), at=at)

    def corrupt(self, match=None, *, layer: Optional[str] = None, offset: Optional[int] = None,
                xor: int = 0xFF, count: Optional[int] = None, at: Optional[str] = None,
                **fields):
        """Flips bits at `offset` of `layer` ("bth", "mpa", "ddp", ...) and recomputes the
        checksums checked before that layer (IPv4, UDP/TCP, ICRC, MPA CRC), so the corruption
        reaches it. Only a sink that carries bytes can (the fault switch)."""
        return self.rule(rule_spec("corrupt", match, fields, layer=layer, offset=offset, xor=xor,
                                   count=count), at=at)

    def remove(self, rule: WireRuleHandle) -> None:
        rule.remove()

    def switch_history(self) -> list[dict]:
        """The fault switch's records of this lab's rules (none where no switch is used)."""
        return []
