"""The swarm's workload campaigns (`python3 -m rdmalab swarm --workload nvme --lab vm:rxe`):
each seed's schedule is a workload frame around drawn faults. The workload is declared, set up
and writing; CM message faults go in (they act on the reconnects the faults cause); one to three
fault episodes follow, each at a drawn time offset (data frames lost for a while, a partition
for a while, a port down then up, `rdma link delete` then add, a reboot of the target, then
re-exported as its boot service would, or of the initiator); then the heal (the CM faults
taken out, the initiator connected again where its controller went), the wait for the working
state within the liveness bound, the I/O stopped and read back, and the teardown. The checkers
(rdmalab.checkers.check_all) judge the history.

Which fault kinds are on is drawn per seed (swarm testing: a kind that is off cannot mask the
others), and everything from random.Random(seed): the same seed is the same schedule.
"""
from __future__ import annotations

import random

from .. import _core, ms, sec
from ..api.cm_timing import IbCmTiming, IwMpaTiming, tcp_syn_give_up_range_ns
from ..checkers.workloads import CONNECT_BUDGET_S
from .may_miss import speaks_ib_cm
from .schedule import Schedule
from .workload_ops import KINDS

TARGET, INITIATOR = "a", "b"
NAME = "w0"
CM_KINDS = ("cm_drop", "cm_delay", "cm_duplicate")
EPISODES = ("loss", "partition", "port", "link", "reboot")
# The messages a connection's set-up and tear-down send: the IB CM's MADs, and on iWARP the TCP
# handshake's and close's segments and the MPA request and reply.
IB_CM = tuple({"cm": m} for m in ("REQ", "REP", "RTU", "DREQ", "DREP"))
IW_CM = ({"tcp_flags": "SYN"}, {"tcp_flags": "FIN"}, {"tcp_flags": "RST"},
         {"opcode": "MPA_REQUEST"}, {"opcode": "MPA_REPLY"})
OFFSETS_NS = (sec(1), sec(3), sec(10))      # from the step before to an episode's fault
SPANS_NS = (sec(2), sec(10), sec(30))       # how long a loss, partition, port or link fault lasts
SETTLES_NS = (sec(1), sec(5), sec(15))      # the heal's reconnects meet the CM faults this long
REBOOT_DOWN_NS = sec(2)
LINK_ADD_NS = sec(60)  # rdma link add waits this long for the removal (ib clients' remove_one)
BLOCKS = 512
TCP_SYN_RETRIES = 6   # net.ipv4.tcp_syn_retries' default
KERNEL_HZ = 250       # Debian's CONFIG_HZ (amd64)


def connect_give_up_ns(personality: str) -> int:
    """The longest a connect attempt under way at the heal may take to give up: the IB CM's REQ
    retried until its last timeout (the DREQ's arithmetic: the same active-side MAD retries);
    on iWARP the SYN's retransmits or the MPA reply's timer (the personality's)."""
    if speaks_ib_cm(personality):
        return IbCmTiming(kernel_hz=KERNEL_HZ).dreq_give_up_ns
    mpa = IwMpaTiming(*_core.iw_mpa_timeouts_ms(personality), kernel_hz=KERNEL_HZ)
    return max(tcp_syn_give_up_range_ns(TCP_SYN_RETRIES, KERNEL_HZ)[1],
               mpa.reply_timeout_range_ns[1])


def liveness_bound_ns(kind: str, options: dict, personality: str) -> int:
    """How long after the heal the workload must be working again: its retry delay, an attempt
    under way giving up, and one reconnect (the workloads checker's budget)."""
    rule = KINDS[kind].rules
    retry_s = options.get(rule.reconnect_delay) or rule.defaults.get(rule.reconnect_delay) or 0
    return sec(retry_s + CONNECT_BUDGET_S) + connect_give_up_ns(personality)


def draw_workload(seed: int, kind: str, personality: str) -> Schedule:
    """The campaign of one seed against a running workload of this kind (module docstring)."""
    rng = random.Random(seed)
    ib_cm = speaks_ib_cm(personality)
    cm_kinds = [k for k in CM_KINDS if rng.random() < 0.5]
    episodes = [k for k in EPISODES if rng.random() < 0.5] or [rng.choice(EPISODES)]
    rate = rng.choice((0.2, 0.5, 1.0))
    options = dict(KINDS[kind].swarm_options)
    g = _Campaign(rng, ib_cm)
    g.add({"op": "workload", "workload": NAME, "kind": kind, "target": TARGET,
           "initiator": INITIATOR, "options": options})
    g.add({"op": "workload_setup", "workload": NAME})
    g.add({"op": "workload_start_io", "workload": NAME, "blocks": BLOCKS})
    for k in cm_kinds:
        g.cm_rule(k, rate)
    for _ in range(rng.randint(1, 3)):
        g.episode(rng.choice(episodes))
    g.heal(kind, liveness_bound_ns(kind, options, personality))
    meta = {"workload": {"kind": kind, "cm_kinds": cm_kinds, "episodes": episodes,
                         "rate": rate}}
    return Schedule(hosts=[TARGET, INITIATOR], steps=g.steps, seed=seed,
                    personality=personality, settle_ns=sec(5), meta=meta)


class _Campaign:
    """A campaign's steps as they are drawn, and what the heal must undo."""

    def __init__(self, rng: random.Random, ib_cm: bool):
        self.rng, self.ib_cm = rng, ib_cm
        self.steps: list[dict] = []
        self.rules: list[str] = []          # installed and not taken out
        self.reconnect = False               # the initiator's controller went
        self.restart_io = False              # its ledger went with it (a reboot)

    def add(self, step: dict, after_ns: int = 0) -> None:
        if after_ns:
            step["at"] = {"moment": "after", "ns": after_ns}
        self.steps.append(step)

    def offset(self) -> int:
        return self.rng.choice(OFFSETS_NS)

    def rule(self, rule: dict, after_ns: int) -> str:
        name = f"r{len(self.steps)}"
        self.add({"op": "rule", "name": name, "rule": rule}, after_ns)
        self.rules.append(name)
        return name

    def unrule(self, name: str, after_ns: int = 0) -> None:
        self.add({"op": "unrule", "name": name}, after_ns)
        self.rules.remove(name)

    def cm_rule(self, kind: str, rate: float) -> None:
        rng = self.rng
        rule = {"action": kind[3:], **rng.choice(IB_CM if self.ib_cm else IW_CM)}
        if rate < 1:
            rule["probability"] = rate
        if rng.random() < 0.5:
            rule["src_host"] = rng.choice((TARGET, INITIATOR))
        if kind == "cm_delay":
            rule["delay_ns"] = rng.choice((ms(100), sec(2)))
        self.rule(rule, self.offset())

    def episode(self, kind: str) -> None:
        rng, span = self.rng, self.rng.choice(SPANS_NS)
        host = rng.choice((TARGET, INITIATOR))
        if kind == "loss":  # data frames: RoCE's RC packets, iWARP's MPA frames and FPDUs
            frames = {"proto": "roce", "transport": "RC"} if self.ib_cm else {"proto": "iwarp"}
            p = rng.choice((0.05, 0.2, 1.0))
            rule = {"action": "drop", **frames, **({"probability": p} if p < 1 else {})}
            self.unrule(self.rule(rule, self.offset()), span)
        elif kind == "partition":
            self.unrule(self.rule({"action": "drop", "direction": f"{TARGET}<->{INITIATOR}"},
                                  self.offset()), span)
        elif kind == "port":
            self.add({"op": "port_down", "host": host}, self.offset())
            self.add({"op": "port_up", "host": host}, span)
        elif kind == "link":  # the initiator's nvme-rdma deletes its controllers with it
            self.add({"op": "rdma_link_delete", "host": host}, self.offset())
            self.add({"op": "rdma_link_add", "host": host, "deadline_ns": LINK_ADD_NS}, span)
            self.reconnect |= host == INITIATOR
        else:
            self.add({"op": "reboot", "host": host, "down_ns": REBOOT_DOWN_NS}, self.offset())
            if host == TARGET:  # back with nothing exported: what its boot service does
                self.add({"op": "workload_export", "workload": NAME})
            else:
                self.reconnect = self.restart_io = True

    def heal(self, kind: str, bound_ns: int) -> None:
        """The CM faults out after the reconnects met them, the initiator connected again where
        its controller went, the working state within the bound, the I/O read back, down."""
        self.add({"op": "wait", "ns": self.rng.choice(SETTLES_NS)})
        for name in list(self.rules):
            self.unrule(name)
        if self.reconnect:
            self.add({"op": "workload_connect", "workload": NAME})
        if self.restart_io:
            self.add({"op": "workload_start_io", "workload": NAME, "blocks": BLOCKS})
        self.add({"op": "workload_wait_state", "workload": NAME, "state": KINDS[kind].rules.live,
                  "within_ns": bound_ns})
        self.add({"op": "wait", "ns": sec(2)})  # writes acknowledged after the recovery too
        for op in ("workload_stop_io", "workload_verify", "workload_teardown"):
            self.add({"op": op, "workload": NAME})
