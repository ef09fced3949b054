"""The swarm (TigerBeetle's VOPR, FoundationDB's simulation): each seed draws a workload and a
fault mix, which fault kinds are on and how often they act (swarm testing: a kind that is off
for a seed cannot mask the others), runs it as a Schedule, and runs every history checker on
what happened. A failing seed prints its replay command; the shrinker (rdmalab.schedules.shrink)
cuts it to the fewest steps that still fail the same way.

    python3 -m rdmalab swarm --lab model:roce --seeds 1000
    python3 -m rdmalab swarm --lab model --minutes 1          # every personality in turn

Everything a seed does comes from random.Random(seed): `draw(seed, personality)` is the whole
schedule, so the same seed gives the same schedule, and on the model the same history.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Optional

from .. import ms, sec
from .runner import Runner
from .schedule import ASYNC_EVENTS, CM_MESSAGES, Schedule

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
    kinds = tuple(k for k in FAULT_KINDS if rng.random() < 0.5)
    return Knobs(kinds=kinds, rate=rng.choice((0.05, 0.2, 0.5, 1.0)),
                 fault_share=rng.choice((0.1, 0.2, 0.35)), hosts=rng.randint(2, 4),
                 steps=steps)


def draw(seed: int, personality: str = "roce", steps: int = 30) -> Schedule:
    """The schedule of one seed: about `steps` steps over 2 to 4 hosts."""
    rng = random.Random(seed)
    k = draw_knobs(rng, steps)
    hosts = ["a", "b", "c", "d"][:k.hosts]
    g = _Gen(rng, k, hosts)
    while len(g.steps) < k.steps:
        g.one()
    meta = {"knobs": k.as_dict()}
    steps = g.steps
    xr = random.Random(seed * 1_000_003 + 17)   # its own stream: other draws stay the same
    if personality in XRC_PERSONALITIES and xr.random() < 0.5:
        steps = _splice(xr, steps, _xrc_steps(xr, hosts))
        meta["xrc"] = True
    return Schedule(hosts=hosts, steps=mark_may_miss(steps, personality), seed=seed,
                    personality=personality, settle_ns=sec(5), meta=meta)


# ---- moments that may never come --------------------------------------------------------------
# A step whose moment never comes fails the run unless it says "may_miss": true. A drawn
# moment is left unmarked only where the steps before it make it certain on the model; every
# other one is marked. Certain needs a quiet run so far: no wire rule, kill, reboot or port
# fault before the step (each can keep a connection from forming or a message from going out),
# so every connect so far has established. Then:
#   after       always comes;
#   verb        ibv_destroy_qp on a side still live, when a later destroy of that side (with
#               no moment of its own) comes before any disruptive step: that destroy enters the
#               verb on the side's QP;
#   cm_msg      REQ or REP #1 (its conn's connect sent them), DREQ #1 when its conn was ended
#               before by a disconnect, or a destroy of a side not holding acks, of a live side
#               (the first such step sends a DREQ), on a personality whose CM speaks IB CM MADs
#               (the iWARP CM's messages are TCP and MPA: the watch never matches);
#   cm_state    never certain: the state a disconnect passes through may be gone before the
#               wait begins, or belong to the other transport's CM (CLOSING is iWARP's);
#   cm_event, qpn_reused   not drawn; marked.
# Only the moment's own connection counts as a source, so a device lab's copy, which drops the
# steps on hosts it does not have with every step of their connections (swarm_cli._fit_hosts),
# keeps each unmarked moment's reason. The shrinker marks a drawn schedule's candidates anew.
_DISRUPTIVE = ("rule", "kill", "reboot", "port_down")
_IB_CM: dict[str, bool] = {}


def speaks_ib_cm(personality: Optional[str]) -> bool:
    """Whether the personality's CM messages are IB CM MADs (IB, RoCE) that a cm_msg moment's
    watch rule counts; False for iWARP (and for a name the model does not know)."""
    p = personality or "roce"
    if p not in _IB_CM:
        from ..labs.engine import model_lab, personalities
        if p not in personalities():
            _IB_CM[p] = False
        else:
            with model_lab(seed=1, hosts=("a",), personality=p) as lab:
                _IB_CM[p] = lab.host("a").caps().transport in ("IB", "RoCE")
    return _IB_CM[p]


def mark_may_miss(steps: list[dict], personality: Optional[str]) -> list[dict]:
    """The steps, each with a moment that may never come marked "may_miss": true (and the
    mark taken off those that must come): see above."""
    ib_cm = speaks_ib_cm(personality)
    out: list[dict] = []
    quiet = True
    live: set[tuple] = set()       # (conn, side) established and not yet destroyed or dead
    holding: set[tuple] = set()    # (conn, side) holding its acks
    ended: set[str] = set()        # conns a disconnect or destroy has ended
    dreq: set[str] = set()         # conns whose ending step certainly sent a DREQ
    for i, st in enumerate(steps):
        st = {k: v for k, v in st.items() if k != "may_miss"}
        m = st.get("at")
        if m and m["moment"] != "after" and not (
                quiet and _certain(m, st, i, steps, live, dreq, ib_cm)):
            st["may_miss"] = True
        out.append(st)
        op, certain = st["op"], not st.get("may_miss")
        key = (st.get("conn"), st.get("side"))
        if op in _DISRUPTIVE:
            quiet = False
        elif op == "connect":
            live |= {(st["conn"], "client"), (st["conn"], "server")}
        elif op in ("disconnect", "destroy") and key in live:
            if key[0] not in ended:
                ended.add(key[0])
                if certain and (op == "disconnect" or key not in holding):
                    dreq.add(key[0])
            if op == "destroy":
                live.discard(key)
        elif op == "hold_acks":
            holding.add(key)
        elif op == "release_acks":
            holding.discard(key)
    return out


def _certain(m: dict, st: dict, i: int, steps: list[dict], live: set, dreq: set,
             ib_cm: bool) -> bool:
    kind = m["moment"]
    if kind == "cm_msg":
        if not ib_cm or m.get("src_host") or m.get("n", 1) != 1 or "conn" not in st:
            return False
        return m["msg"] in ("REQ", "REP") or (m["msg"] == "DREQ" and st["conn"] in dreq)
    if kind == "verb":
        key = (m["conn"], m["side"])
        if m["verb"] != "ibv_destroy_qp" or key not in live:
            return False
        for later in steps[i + 1:]:
            if later["op"] in _DISRUPTIVE:
                return False
            if (later["op"] == "destroy" and (later["conn"], later["side"]) == key and
                    later.get("at", {"moment": "after"})["moment"] == "after"):
                return True
        return False
    return False


# ---- XRC (seed 003) ---------------------------------------------------------------------------
# Drawn from a stream of its own on the personalities with XRC, on half their seeds: a domain
# on host a or b (the first two: a device lab keeps them), a sender on the other, receives and
# sends, often the creator killed mid-traffic, more sends, holders closing (the QP handle only
# or everything). Sends mostly stay within the receives posted (an empty SRQ ends in RNR).
XRC_PERSONALITIES = ("ib", "ib-legacy")


def _xrc_steps(xr: random.Random, hosts: list[str]) -> list[dict]:
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


def _splice(xr: random.Random, steps: list[dict], extra: list[dict]) -> list[dict]:
    """extra's steps in their order at random places among steps."""
    at = sorted(xr.randint(0, len(steps)) for _ in extra)
    out, j = [], 0
    for i, step in enumerate(steps):
        while j < len(extra) and at[j] == i:
            out.append(extra[j])
            j += 1
        out.append(step)
    return out + extra[j:]


class _Gen:
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


# ---- running seeds ---------------------------------------------------------------------------

# The signature of a run in which a step's moment never came (Outcome.missed) and the step
# did not say may_miss.
MISSED = "missed_moment"


@dataclasses.dataclass
class SeedResult:
    seed: int
    personality: str
    steps: int
    failed: bool
    signature: tuple[str, ...]     # the checkers that said invalid, "bounded" (hung),
                                   # "missed_moment", "error", "runaway"
    problems: list[str]
    records: int = 0
    history: Optional[list] = None
    results: Optional[list] = None

    def as_dict(self) -> dict:
        return {"seed": self.seed, "personality": self.personality, "steps": self.steps,
                "failed": self.failed, "signature": list(self.signature),
                "problems": self.problems[:20], "records": self.records}


def run_on_model(schedule: Schedule, personality: Optional[str] = None,
                 mutations: tuple = (), keep_history: bool = False) -> SeedResult:
    """One schedule on a fresh model lab (seeded with the schedule's seed), checked."""
    from ..labs.engine import model_lab
    p = personality or schedule.personality or "roce"
    kw = {"mutations": tuple(mutations)} if mutations else {}
    lab = model_lab(seed=schedule.seed, hosts=tuple(schedule.hosts), personality=p, **kw)
    with lab:
        return check_run(lab, schedule, p, keep_history)


def check_run(lab, schedule: Schedule, personality: str, keep_history: bool = False) \
        -> SeedResult:
    """Runs the schedule on a lab it does not own and runs every checker on the history."""
    from .. import checkers
    outcome = Runner(lab, schedule).run()
    history = lab.history()
    sig, problems = [], []
    for r in checkers.check_all(history, checkers.context_of(lab)):
        if r.verdict == "invalid":
            sig.append(r.checker)
            problems += [f"{r.checker}: {p}" for p in r.problems]
    if outcome.hung and "bounded" not in sig:
        sig.append("bounded")
        problems.append(f"bounded: {outcome.hung}")
    if outcome.missed:  # a step's moment never came and the step did not say may_miss
        sig.append(MISSED)
        problems += [f"{MISSED}: {m}" for m in outcome.missed]
    return SeedResult(schedule.seed, personality, len(schedule.steps), bool(sig),
                      tuple(sorted(set(sig))), problems, len(history),
                      history if keep_history else None, outcome.results)


# A seed that runs away (wall time) is a failure of its own, never a stalled swarm: the model
# is deterministic, so its replay command shows the same run.
SEED_WALL_S = 60


class Runaway(Exception):
    pass


def _alarm(signum, frame):
    raise Runaway(f"the seed ran past {SEED_WALL_S} s of wall time")


def _seed_job(job: tuple) -> SeedResult:
    import signal
    seed, personality, steps, mutations = job
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(SEED_WALL_S)
    try:
        r = run_on_model(draw(seed, personality, steps), personality, mutations)
    except Runaway as e:
        return SeedResult(seed, personality, steps, True, ("runaway",), [f"runaway: {e}"])
    except Exception as e:  # a harness bug is a failure of the seed, never a lost run
        if "ran past" in str(e):  # the alarm parked in an engine callback and re-raised
            return SeedResult(seed, personality, steps, True, ("runaway",), [f"runaway: {e}"])
        return SeedResult(seed, personality, steps, True, ("error",), [f"error: {e!r}"])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    r.results = None
    return r


def jobs(personalities: list[str], first: int, count: Optional[int], steps: int,
         mutations: tuple):
    """(seed, personality, ...) for count seeds (None: without end), personalities in turn."""
    i = 0
    while count is None or i < count:
        yield (first + i, personalities[i % len(personalities)], steps, mutations)
        i += 1


def run_seeds(personalities: list[str], *, first: int = 1, count: Optional[int] = None,
              deadline: Optional[float] = None, steps: int = 30, workers: int = 2,
              mutations: tuple = (), stop_at_first: bool = False, on_result=None):
    """Runs seeds in `workers` forked processes; calls on_result(SeedResult) for each, in
    completion order. Stops at count, at the wall-clock deadline (time.monotonic()), or at the
    first failure with stop_at_first. Returns (seeds run, failures)."""
    import multiprocessing
    import time
    done, failures = 0, []
    it = jobs(personalities, first, count, steps, tuple(mutations))
    if workers <= 1:
        results = map(_seed_job, it)
        pool = None
    else:
        pool = multiprocessing.get_context("fork").Pool(workers)
        results = pool.imap(_seed_job, it, chunksize=8)
    try:
        for r in results:
            done += 1
            if on_result:
                on_result(r)
            if r.failed:
                failures.append(r)
                if stop_at_first:
                    break
            if deadline is not None and time.monotonic() >= deadline:
                break
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    return done, failures
