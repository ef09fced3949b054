"""Fault verbs of a lab (lab.faults). The model applies every fault; a backend that cannot
apply one raises FaultNotSupported naming it, never a silent pass.

Wire faults are rules: each matches packets (a predicate and/or fields) and acts on at most
`count` of them; the first matching rule decides. Examples:

    lab.faults.drop(cm="DREP")                             # lose every DREP
    dreqs = lab.faults.watch(cm="DREQ"); ...; dreqs.hits    # count without touching
    lab.faults.drop(opcode="ACKNOWLEDGE", src_host="b", count=3)
    lab.faults.drop(tcp_flags="FIN")                       # iWARP: lose the FINs
    lab.faults.delay(lambda p: p.dest_qpn == qpn, delay_ns=ms(5))
    lab.faults.reorder(opcode="SEND_ONLY", count=1)        # after the next packet of its QP
    lab.faults.on_verb(lambda call: ..., verb="ibv_destroy_qp")   # timing faults
    lab.faults.at(lab.now_ns + us(10), lambda: proc.kill())
"""

from __future__ import annotations

import random
from typing import Callable, Iterable, Optional

from . import _core
from .errors import FaultNotSupported, Hung, as_fault
from .names import parse

# IBTA CM MAD attribute IDs (semantics.md A).
CM_ATTR_ID = {"REQ": 0x10, "MRA": 0x11, "REJ": 0x12, "REP": 0x13, "RTU": 0x14, "DREQ": 0x15,
              "DREP": 0x16, "SIDR_REQ": 0x17, "SIDR_REP": 0x18, "LAP": 0x19, "APR": 0x1A}
_PACKET_FIELDS = ("src_host", "dst_host", "opcode", "dest_qpn", "src_qpn", "psn", "syndrome",
                  "mad_attr_id")
# The switch's keys that name no field of the model's packet but a header it stands for.
_SWITCH_KEYS = ("cm", "direction", "proto", "tcp_flags", "rdmap_opcode")

# TCP flags as the switch spells them (faults/frame.h tcp_flag).
TCP_FLAGS = {"FIN": 0x01, "SYN": 0x02, "RST": 0x04, "PSH": 0x08, "ACK": 0x10, "URG": 0x20,
             "ECE": 0x40, "CWR": 0x80}
# RDMAP opcodes (RFC 5040 4.2) as the switch names them; it takes the 4-bit value too.
RDMAP_OPCODES = {"RDMA_WRITE": 0x0, "RDMA_READ_REQUEST": 0x1, "RDMA_READ_RESPONSE": 0x2,
                 "SEND": 0x3, "SEND_WITH_INVALIDATE": 0x4, "SEND_WITH_SE": 0x5,
                 "SEND_WITH_SE_AND_INVALIDATE": 0x6, "TERMINATE": 0x7}
# The switch's reorder hold when a rule gives none (faults/rules.h).
REORDER_HOLD_NS = 100_000_000

_FIN, _RST, _ACK, _SYN = TCP_FLAGS["FIN"], TCP_FLAGS["RST"], TCP_FLAGS["ACK"], TCP_FLAGS["SYN"]
# The flags of the iWARP CM's TCP packets. A RST is RST|ACK (Linux tcp_send_active_reset);
# the model sends the handshake (TCP_SYN, TCP_SYN_ACK) only where rdma_connect does the TCP
# connect itself (caps.connect_is_synchronous: siw), else folds it into MPA_REQUEST; it sets no
# PSH, URG, ECE or CWR.
_CM_TCP_FLAGS = {"TCP_FIN": _FIN | _ACK, "TCP_RST": _RST | _ACK, "TCP_ACK": _ACK,
                 "TCP_SYN": _SYN, "TCP_SYN_ACK": _SYN | _ACK,
                 "MPA_REQUEST": _ACK, "MPA_REPLY": _ACK}
# opcode="TCP_SYN" is any segment with SYN set (faults/rules.cc), the SYN-ACK too.
_OPCODE_ALIASES = {"TCP_SYN": ("TCP_SYN", "TCP_SYN_ACK")}
# The model's iWARP data packets as the RDMAP messages they stand for; an immediate-data packet
# counts as the write or send it carries (RFC 7306 sends the immediate as a message of its own,
# which the model folds in).
_RDMAP_OF_OPCODE = {"RDMA_WRITE_ONLY": 0x0, "RDMA_WRITE_ONLY_WITH_IMMEDIATE": 0x0,
                    "RDMA_READ_REQUEST": 0x1, "RDMA_READ_RESPONSE_ONLY": 0x2,
                    "SEND_ONLY": 0x3, "SEND_ONLY_WITH_IMMEDIATE": 0x3}
# A responder error, an ACKNOWLEDGE with one of these on the model, is a TERMINATE on iWARP;
# its ACK and NAK_SEQ stand for TCP acknowledgements (no RDMAP message).
_TERMINATE_SYNDROMES = frozenset({"NAK_INV_REQ", "NAK_REM_ACCESS", "NAK_REM_OP",
                                  "NAK_INV_RD_REQ"})


def expand_cm(fields: dict) -> dict:
    """fields with cm="DREP" spelled out as the packet fields it means (opcode MAD and the
    attribute ID); a copy, so the caller's dict is untouched."""
    fields = dict(fields)
    if "cm" in fields:
        msg = fields.pop("cm")
        if msg not in CM_ATTR_ID:
            raise ValueError(f"unknown CM message {msg!r}; allowed: {', '.join(CM_ATTR_ID)}")
        fields.update(opcode="MAD", mad_attr_id=CM_ATTR_ID[msg])
    return fields


def _proto_of(p) -> str:
    """The model's packets by protocol, as the fault switch names them."""
    return "iwarp" if p.opcode.startswith(("TCP_", "MPA_")) else "roce"


def parse_tcp_flags(value) -> int:
    """tcp_flags="FIN" / "SYN|ACK" as the switch parses it: the bits a packet must have set."""
    allowed = ", ".join(TCP_FLAGS)
    if not isinstance(value, str):
        raise ValueError(f"tcp_flags={value!r}: flag names joined by '|'; allowed: {allowed}")
    bits = 0
    for name in value.split("|"):
        if name not in TCP_FLAGS:
            raise ValueError(f"tcp_flags={value!r}: unknown TCP flag {name!r}; allowed: "
                             f"{allowed} (joined by '|')")
        bits |= TCP_FLAGS[name]
    return bits


def parse_rdmap_opcode(value) -> int:
    """rdmap_opcode= as the switch parses it: a name or the 4-bit value."""
    if isinstance(value, int) and not isinstance(value, bool):
        if 0 <= value <= 15:
            return value
    elif isinstance(value, str) and value in RDMAP_OPCODES:
        return RDMAP_OPCODES[value]
    raise ValueError(f"rdmap_opcode={value!r}: unknown; allowed: {', '.join(RDMAP_OPCODES)} "
                     "or the 4-bit value 0..15")


def model_tcp_flags(p, iwarp: bool) -> Optional[int]:
    """The TCP flags the model's packet stands for; None when it is not on TCP (IB, RoCE).
    On an iWARP host every packet after the handshake carries ACK: the FPDUs, and the
    ACKNOWLEDGEs that stand for TCP's acknowledgements or a TERMINATE."""
    if p.opcode in _CM_TCP_FLAGS:
        return _CM_TCP_FLAGS[p.opcode]
    return _ACK if iwarp else None


def model_rdmap_opcode(p, iwarp: bool) -> Optional[int]:
    """The RDMAP opcode of the model's packet from an iWARP host; None for one that carries
    no RDMAP message (TCP and MPA, TCP acknowledgements, any packet of IB or RoCE)."""
    if not iwarp:
        return None
    if p.opcode == "ACKNOWLEDGE":
        return RDMAP_OPCODES["TERMINATE"] if p.syndrome in _TERMINATE_SYNDROMES else None
    return _RDMAP_OF_OPCODE.get(p.opcode)


class PacketRule:
    """One wire fault: which packets, what to do, how often. The keys are the fault switch's
    (faults/rules.h): the packet fields, cm=, direction="a->b" / "a<->b", proto="roce" |
    "iwarp" | "tcp" | "any"; count (the first N it takes), every (every Kth match),
    probability (0..1, from a generator seeded per rule). A rule whose count is spent, or that
    skips a packet by every/probability, lets the next rule decide.

    tcp_flags ("FIN", "RST|ACK": those bits set, others free) and rdmap_opcode ("SEND",
    "TERMINATE", ... or 0..15) match the headers the model's packets stand for on an iWARP host
    (iwarp_hosts): TCP_FIN is FIN|ACK, TCP_RST RST|ACK, every other TCP/MPA packet and FPDU
    ACK; SEND_ONLY is SEND, RDMA_WRITE_ONLY RDMA_WRITE, RDMA_READ_RESPONSE_ONLY
    RDMA_READ_RESPONSE, an ACKNOWLEDGE with a responder error TERMINATE. What the model never
    sends matches nothing: SYN (the handshake is folded into MPA_REQUEST), PSH, URG, ECE, CWR,
    the solicited-event and invalidate sends, opcodes 8..15, and both keys on IB and RoCE."""

    def __init__(self, action: str, match: Optional[Callable], fields: dict, count: Optional[int],
                 delay_ns: int = 0, every: Optional[int] = None,
                 probability: Optional[float] = None, seed: int = 0,
                 hold_ns: int = REORDER_HOLD_NS, iwarp_hosts: Iterable[str] = ()):
        fields = dict(fields)
        self.direction = fields.pop("direction", None)
        self.proto = fields.pop("proto", None)
        self.tcp_flags = fields.pop("tcp_flags", None)
        self.rdmap_opcode = fields.pop("rdmap_opcode", None)
        if self.tcp_flags is not None:
            self._tcp_bits = parse_tcp_flags(self.tcp_flags)
        if self.rdmap_opcode is not None:
            self._rdmap = parse_rdmap_opcode(self.rdmap_opcode)
        self._iwarp_hosts = frozenset(iwarp_hosts)
        if isinstance(hold_ns, bool) or not isinstance(hold_ns, int) or hold_ns < 0:
            raise ValueError(f"hold_ns={hold_ns!r}: an integer >= 0 (ns)")
        self.hold_ns = hold_ns
        if self.direction is not None:
            sep = "<->" if "<->" in self.direction else "->"
            ends = self.direction.split(sep)
            if len(ends) != 2 or not all(ends):
                raise ValueError(f"direction {self.direction!r}: 'a->b' or 'a<->b'")
            self._ends, self._both = tuple(ends), sep == "<->"
        if self.proto not in (None, "roce", "iwarp", "tcp", "any"):
            raise ValueError(f"proto {self.proto!r}: roce, iwarp, tcp or any")
        if every is not None and (not isinstance(every, int) or every < 1):
            raise ValueError(f"every={every!r}: a positive integer")
        if probability is not None and not 0 <= probability <= 1:
            raise ValueError(f"probability={probability!r}: between 0 and 1")
        self.every, self.probability = every, probability
        self._seen = 0  # matches so far (every=)
        self._rng = random.Random(seed)
        unknown = set(fields) - set(_PACKET_FIELDS) - {"cm"}
        if unknown:
            raise TypeError(f"unknown packet field(s) {sorted(unknown)}; allowed: "
                            f"{', '.join(_PACKET_FIELDS + _SWITCH_KEYS)}")
        fields = expand_cm(fields)
        self.action = parse(_core.PacketAction, action, "packet action")
        self.match, self.fields, self.count, self.delay_ns = match, fields, count, delay_ns
        self.hits = 0  # packets this rule acted on
        self.observe = False  # a watch rule: counts, never decides

    def matches(self, p: _core.Packet) -> bool:
        if self.count is not None and self.hits >= self.count:
            return False
        if any(getattr(p, k) != v and not (k == "opcode" and getattr(p, k) in
                                           _OPCODE_ALIASES.get(v, ()))
               for k, v in self.fields.items()):
            return False
        if self.direction is not None:
            pair = (p.src_host, p.dst_host)
            if pair != self._ends and not (self._both and pair == self._ends[::-1]):
                return False
        if self.proto not in (None, "any"):
            if _proto_of(p) != ("iwarp" if self.proto == "tcp" else self.proto):
                return False
        if self.tcp_flags is not None:
            flags = model_tcp_flags(p, p.src_host in self._iwarp_hosts)
            if flags is None or flags & self._tcp_bits != self._tcp_bits:
                return False
        if self.rdmap_opcode is not None:
            if model_rdmap_opcode(p, p.src_host in self._iwarp_hosts) != self._rdmap:
                return False
        if self.match is not None and not self.match(p):
            return False
        # Matched: every= and probability= decide whether this rule takes it.
        self._seen += 1
        if self.every is not None and self._seen % self.every != 0:
            return False
        if self.probability is not None and self._rng.random() >= self.probability:
            return False
        return True

    def verdict(self) -> _core.PacketVerdict:
        self.hits += 1
        return _core.PacketVerdict(self.action, self.delay_ns, self.hold_ns)


class Faults:
    """The model lab's fault verbs (ModelLab in model.h)."""

    def __init__(self, lab):
        self._lab = lab
        self._rules: list[PacketRule] = []
        self._rules_made = 0
        self._verb_hooks: list[tuple[Optional[str], Callable]] = []
        self._iwarp: Optional[frozenset] = None

    @property
    def _o(self):
        return self._lab._o

    # -- wire
    def drop(self, match: Optional[Callable] = None, *, count: Optional[int] = None,
             every: Optional[int] = None, probability: Optional[float] = None,
             **fields) -> PacketRule:
        return self._add(PacketRule("DROP", match, fields, count, every=every,
                                    probability=probability, seed=self._rule_seed(),
                                    iwarp_hosts=self._iwarp_hosts()))

    def delay(self, match: Optional[Callable] = None, *, delay_ns: int, count: Optional[int] = None,
              every: Optional[int] = None, probability: Optional[float] = None,
              **fields) -> PacketRule:
        return self._add(PacketRule("DELAY", match, fields, count, delay_ns, every=every,
                                    probability=probability, seed=self._rule_seed(),
                                    iwarp_hosts=self._iwarp_hosts()))

    def duplicate(self, match: Optional[Callable] = None, *, count: Optional[int] = None,
                  every: Optional[int] = None, probability: Optional[float] = None,
                  **fields) -> PacketRule:
        return self._add(PacketRule("DUPLICATE", match, fields, count, every=every,
                                    probability=probability, seed=self._rule_seed(),
                                    iwarp_hosts=self._iwarp_hosts()))

    def reorder(self, match: Optional[Callable] = None, *, hold_ns: Optional[int] = None,
                count: Optional[int] = None, every: Optional[int] = None,
                probability: Optional[float] = None, **fields) -> PacketRule:
        """The switch's reorder: a matching packet is held until the next packet of its flow
        passes and arrives right after it, or hold_ns (default 100 ms, the switch's) after it
        would have. A flow on the model is one QP's packets from one host to another; the
        iWARP CM's TCP packets, which name no QP, are one flow per host pair, apart from the
        connection's FPDUs (the model's packets carry no TCP ports)."""
        return self._add(PacketRule("REORDER", match, fields, count, every=every,
                                    probability=probability, seed=self._rule_seed(),
                                    hold_ns=REORDER_HOLD_NS if hold_ns is None else hold_ns,
                                    iwarp_hosts=self._iwarp_hosts()))

    def _rule_seed(self) -> int:
        """One stream per rule, from the lab's seed: a seed replays the same choices."""
        self._rules_made += 1
        return (self._lab.seed << 16) ^ self._rules_made

    def _iwarp_hosts(self) -> frozenset:
        """The hosts whose packets stand for TCP segments (tcp_flags=, rdmap_opcode=); read
        here, never from inside the packet hook."""
        if self._iwarp is None:
            self._iwarp = frozenset(name for name, host in self._lab.hosts.items()
                                    if host.caps().transport == "iWARP")
        return self._iwarp

    def watch(self, match: Optional[Callable] = None, **fields) -> PacketRule:
        """Counts matching packets (rule.hits) and lets them pass; never decides a packet, so
        the rules after it still apply."""
        rule = PacketRule("DELIVER", match, fields, None, iwarp_hosts=self._iwarp_hosts())
        rule.observe = True
        return self._add(rule)

    def corrupt(self, match: Optional[Callable] = None, **kw) -> PacketRule:
        raise FaultNotSupported("corrupt", "the model's fabric carries packets, not bytes: it "
                                "cannot corrupt a header (inject_async_event models the effect)")

    def remove(self, rule: PacketRule) -> None:
        self._rules.remove(rule)
        self._install_packet_hook()

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
        """Removes every packet rule and verb hook."""
        self._rules.clear()
        self._verb_hooks.clear()
        self._o.set_packet_hook(None)
        self._o.set_verb_hook(None)

    # -- internals
    def _add(self, rule: PacketRule) -> PacketRule:
        self._rules.append(rule)
        self._install_packet_hook()
        return rule

    def _install_packet_hook(self) -> None:
        rules = self._rules

        def hook(packet):
            for rule in rules:
                if rule.matches(packet):
                    if rule.observe:  # watch: count and go on
                        rule.hits += 1
                        continue
                    return rule.verdict()
            return None  # DELIVER

        self._o.set_packet_hook(hook if rules else None)

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
