"""The steps a swarm seed draws (rdmalab.schedules.swarm.draw): which fault kinds the seed
switches on and how often they act (Knobs; swarm testing: a kind that is off for a seed cannot
mask the others), the workload and faults (StepGen: connections, traffic, closes, wire rules, kills,
reboots, port faults, async events, held acks, faults at protocol moments) and the XRC steps
spliced in on the personalities with XRC. Every draw comes from the random.Random it is given.
"""
from __future__ import annotations

import dataclasses
import random

from .. import ms, sec
from .schedule import ASYNC_EVENTS, CM_MESSAGES

# Fault kinds a seed may switch on (each with probability 1/2, and a rate drawn per seed).
FAULT_KINDS = ("cm_drop", "cm_delay", "cm_duplicate", "loss", "reorder", "duplicate", "kill",
               "reboot", "port", "async_event", "moments", "acks")
# Workload weights: what a step is, when it is not a fault.
_WORK = (("post", 6), ("recv", 5), ("disconnect", 3), ("connect", 2), ("drain", 2),
         ("destroy", 2), ("wait", 2))
# Async events the model can raise on a QP (personality permitting; EOPNOTSUPP is a result).
_QP_EVENTS = ("QP_FATAL", "QP_REQ_ERR", "QP_ACCESS_ERR")
_STATES_AT_DISCONNECT = ("DREQ_SENT", "DREQ_RCVD", "TIMEWAIT", "CLOSING")
_PROCESSES = ("p0", "p1")
assert set(_QP_EVENTS) <= set(ASYNC_EVENTS)


@dataclasses.dataclass
class Knobs:
    """What one seed switched on: the fault kinds and their rates."""
    kinds: tuple[str, ...]
    rate: float            # probability of a wire rule acting on a packet it matches
    fault_share: float     # share of steps that are faults
    hosts: int
    steps: int

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def draw_knobs(rng: random.Random, steps: int = 30) -> Knobs:
    """Each fault kind on with probability 1/2, a rate, a fault share and 2 to 4 hosts."""
    kinds = tuple(k for k in FAULT_KINDS if rng.random() < 0.5)
    return Knobs(kinds=kinds, rate=rng.choice((0.05, 0.2, 0.5, 1.0)),
                 fault_share=rng.choice((0.1, 0.2, 0.35)), hosts=rng.randint(2, 4),
                 steps=steps)


# ---- XRC (seed 003) ---------------------------------------------------------------------------


def xrc_steps(xr: random.Random, hosts: list[str]) -> list[dict]:
    """A domain on host a or b (the first two: a device lab keeps them), a sender on the other,
    receives and sends, often the creator killed mid-traffic, more sends, holders closing (the
    QP handle only or everything). Sends mostly stay within the receives posted (an empty SRQ
    ends in RNR)."""
    host, other = xr.sample(hosts[:2], 2)
    creator = xr.choice(("xc", "xc", "p0"))
    holders = xr.sample(("xw0", "xw1", "p1"), xr.randint(1, 2))
    n_srq = xr.randint(1, 2)
    srqs = n_srq * len(holders)
    posted = [0] * srqs
    out = [{"op": "xrc_open", "xrc": "x0", "host": host, "creator": creator,
            "holders": holders, "n_srq": n_srq},
           {"op": "xrc_connect", "xrc": "x0", "sender": "s0", "host": other,
            "process": xr.choice(("xs", "p0"))}]

    closed: set[str] = set()   # holders that closed everything: their SRQs are gone

    def traffic(rounds: int) -> None:
        for _ in range(rounds):
            live = [i for i in range(srqs) if holders[i // n_srq] not in closed]
            i = xr.choice(live) if live and xr.random() < 0.9 else xr.randrange(srqs)
            if posted[i] < 2 or xr.random() < 0.4:
                n = xr.randint(2, 6)
                posted[i] += n
                out.append({"op": "xrc_recv", "xrc": "x0", "srq": i, "n": n})
            n = xr.randint(1, 3) if xr.random() < 0.9 else posted[i] + 1  # RNR, sometimes
            posted[i] = max(0, posted[i] - n)
            out.append({"op": "xrc_send", "sender": "s0", "srq": i, "n": n})
    traffic(xr.randint(1, 3))
    if xr.random() < 0.7:
        out.append({"op": "kill", "host": host, "process": creator})
        traffic(xr.randint(1, 3))
    for h in holders:
        if xr.random() < 0.5:
            what = xr.choice(("qp", "all"))
            out.append({"op": "xrc_close", "xrc": "x0", "process": h, "what": what})
            if what == "all":
                closed.add(h)
            traffic(xr.randint(0, 2))
    if xr.random() < 0.5:
        out.append({"op": "wait", "ns": xr.choice((ms(1), ms(100)))})
    return out


def splice(xr: random.Random, steps: list[dict], extra: list[dict]) -> list[dict]:
    """extra's steps in their order at random places among steps."""
    at = sorted(xr.randint(0, len(steps)) for _ in extra)
    out, j = [], 0
    for i, step in enumerate(steps):
        while j < len(extra) and at[j] == i:
            out.append(extra[j])
            j += 1
        out.append(step)
    return out + extra[j:]


class StepGen:
    """A seed's workload and faults, one step (or a few that belong together) per one()."""

    def __init__(self, rng: random.Random, k: Knobs, hosts: list[str]):
        self.rng, self.k, self.hosts = rng, k, hosts
        self.steps: list[dict] = []
        self.conns: list[str] = []
        self.dead: set[tuple[str, str]] = set()
        self.rules = 0

    def one(self) -> None:
        rng = self.rng
        live = len(self.conns) * 2 - len(self.dead)
        if not self.conns or live < 2 or (len(self.conns) < 6 and rng.random() < 0.08):
            return self._connect()
        if self.k.kinds and rng.random() < self.k.fault_share:
            return self._fault(rng.choice(self.k.kinds))
        op = rng.choices([w[0] for w in _WORK], [w[1] for w in _WORK])[0]
        if op == "connect":
            return self._connect()
        if op == "wait":
            return self._add({"op": "wait", "ns": rng.choice((ms(1), ms(50), sec(1), sec(10)))})
        c, side = self._live()
        step = {"op": op, "conn": c, "side": side}
        if op == "post":
            step["opcode"] = rng.choice(("SEND", "SEND", "RDMA_WRITE", "RDMA_READ"))
            step["n"] = rng.randint(1, 3)
        elif op == "recv":
            step["n"] = rng.randint(1, 3)
        elif op == "disconnect" and rng.random() < 0.3:  # both at once
            self._add(step)
            step = {"op": op, "conn": c, "side": "server" if side == "client" else "client"}
        self._add(step)

    def _live(self) -> tuple[str, str]:
        """A side not yet destroyed, killed or rebooted, mostly (one time in ten any side:
        a verb on a dead object is a case too)."""
        live = [(c, side) for c in self.conns for side in ("client", "server")
                if (c, side) not in self.dead]
        if not live or self.rng.random() < 0.1:
            return self.rng.choice(self.conns), self.rng.choice(("client", "server"))
        return self.rng.choice(live)

    def _connect(self) -> None:
        client, server = self.rng.sample(self.hosts, 2)
        name = f"c{len(self.conns)}"
        self.conns.append(name)
        self._add({"op": "connect", "conn": name, "client": client, "server": server,
                   "client_process": self.rng.choice(_PROCESSES),
                   "server_process": self.rng.choice(_PROCESSES)})

    def _fault(self, kind: str) -> None:
        rng, rate = self.rng, self.k.rate
        if kind in ("cm_drop", "cm_delay", "cm_duplicate"):
            rule = {"action": kind[3:], "cm": rng.choice(CM_MESSAGES), "probability": rate}
            if kind == "cm_delay":
                rule["delay_ns"] = rng.choice((ms(1), ms(100), sec(2)))
            return self._rule(rule)
        if kind == "loss":
            return self._rule({"action": "drop", "probability": min(rate, 0.2)})
        if kind in ("reorder", "duplicate"):
            return self._rule({"action": kind, "probability": rate})
        if kind == "kill":
            return self._add({"op": "kill", "host": rng.choice(self.hosts),
                              "process": rng.choice(_PROCESSES)})
        if kind == "reboot":
            return self._add({"op": "reboot", "host": rng.choice(self.hosts),
                              "down_ns": rng.choice((ms(100), sec(2)))})
        if kind == "port":
            host = rng.choice(self.hosts)
            self._add({"op": "port_down", "host": host})
            return self._add({"op": "port_up", "host": host,
                              "at": {"moment": "after", "ns": rng.choice((ms(10), sec(1)))}})
        if kind == "async_event":  # one or two, sometimes with the QP destroyed right after
            c, side = self._live()
            delay = rng.choice((0, ms(1)))
            for _ in range(rng.randint(1, 2)):
                self._add({"op": "async_event", "conn": c, "side": side,
                           "event": rng.choice(_QP_EVENTS), "driver_delay_ns": delay})
            if rng.random() < 0.5:  # destroy as the driver hands the event over, or at once
                if delay and rng.random() < 0.7:
                    self._add({"op": "wait", "ns": delay})
                self._add({"op": "destroy", "conn": c, "side": side})
            return None
        if kind == "acks":  # the application holds an id's acks, then closes or lets go
            c, side = self._live()
            self._add({"op": "hold_acks", "conn": c, "side": side})
            if rng.random() < 0.8:  # the peer closes: this side's DISCONNECTED is held
                self._add({"op": "disconnect", "conn": c,
                           "side": "server" if side == "client" else "client"})
                self._add({"op": "wait", "ns": ms(1)})
            self._add({"op": rng.choice(("destroy", "release_acks")), "conn": c,
                       "side": side})
            return None
        return self._moment()

    def _moment(self) -> None:
        """A fault at a protocol moment: mid-disconnect, mid-destroy, after the nth CM msg."""
        rng, c = self.rng, self.rng.choice(self.conns)
        side = rng.choice(("client", "server"))
        other = "server" if side == "client" else "client"
        pick = rng.randrange(3)
        if pick == 0:   # the peer dies while this side is in DREQ_SENT (or the like)
            self._add({"op": "disconnect", "conn": c, "side": side})
            self._add({"op": "kill", "host": self._host_of(c, other),
                       "process": self._proc_of(c, other),
                       "at": {"moment": "cm_state", "conn": c, "side": side,
                              "state": rng.choice(_STATES_AT_DISCONNECT),
                              "within_ns": sec(5)}})
        elif pick == 1:  # an async event while the QP is being destroyed
            self._add({"op": "async_event", "conn": c, "side": side,
                       "event": rng.choice(_QP_EVENTS), "driver_delay_ns": ms(1),
                       "at": {"moment": "verb", "verb": "ibv_destroy_qp", "conn": c,
                              "side": side}})
            self._add({"op": "destroy", "conn": c, "side": side})
        else:            # something after the nth copy of a CM message
            msg = rng.choice(("DREQ", "DREP", "REQ", "REP"))
            self._add({"op": rng.choice(("disconnect", "destroy")), "conn": c,
                       "side": other, "at": {"moment": "cm_msg", "msg": msg,
                                             "n": rng.randint(1, 3), "within_ns": sec(20)}})

    def _host_of(self, conn: str, side: str) -> str:
        st = next(s for s in self.steps if s["op"] == "connect" and s["conn"] == conn)
        return st[side]

    def _proc_of(self, conn: str, side: str) -> str:
        st = next(s for s in self.steps if s["op"] == "connect" and s["conn"] == conn)
        return st[f"{side}_process"]

    def _rule(self, rule: dict) -> None:
        name = f"r{self.rules}"
        self.rules += 1
        self._add({"op": "rule", "name": name, "rule": rule})

    def _add(self, step: dict) -> None:
        self.steps.append(step)
        op = step["op"]
        if op == "destroy":
            self.dead.add((step["conn"], step["side"]))
        elif op in ("kill", "reboot"):
            for st in self.steps:
                if st["op"] != "connect":
                    continue
                for side in ("client", "server"):
                    if st[side] == step["host"] and (
                            op == "reboot" or st[f"{side}_process"] == step["process"]):
                        self.dead.add((st["conn"], side))

