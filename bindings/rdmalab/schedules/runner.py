"""Runs a Schedule (rdmalab.schedules.schedule) on a lab through the Lab protocol only, records
what each step did in the history (`schedule_step`, `schedule_bind`, `schedule_moment`, `hung`,
`teardown`), tears everything down and returns an Outcome. Expected failures (a post on a dead
QP, a connection a fault kept from forming) are step results, not exceptions; a wait that must
end and does not (a destroy, a drain, a connection that never reaches an outcome) is `hung`
with the lab's diagnostic dump, and the rest of the schedule is skipped. A step whose moment
never comes (a wait that runs out, a trigger armed and never fired) is `missed`, a failure of
the run (Outcome.missed names it), unless the step says `"may_miss": true` (then `skipped`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from .. import ms, sec
from ..errors import DeadlineExceeded, Error, FaultNotSupported, HostLost, Hung
from ..protocol import CM_PROTOCOL_STATE
from .schedule import (DEFAULT_WITHIN_NS, DESTROY_NS, OUTCOME_NS, TRIGGERS, Schedule,
                       ScheduleError)
from .xrc import XrcOps

# rdma_cm events that end a connect attempt (rdma_cm(7)).
_CONNECT_ENDS = ("ESTABLISHED", "REJECTED", "UNREACHABLE", "CONNECT_ERROR", "DEVICE_REMOVAL",
                 "ADDR_ERROR", "ROUTE_ERROR", "DISCONNECTED")
_BASE_PORT = 18000
HANDLER_NS = ms(1)
WR_PER_STEP = 1000  # wr_id = (step + 1) * 1000 + k; schedule.py bounds n below it
# The registered finding a drain on an err_post "strand" provider runs into (findings.toml).
STRANDED_FINDING = "siw-user-posts-in-error-are-never-flushed"


@dataclasses.dataclass
class Side:
    conn: str
    role: str            # client | server
    host: str
    process: str
    cm_id: Any = None
    player: Any = None   # resources.CmSide once established
    holding: bool = False  # the application holds the acks of this id's events
    remote: tuple = (0, 0)  # the peer's MR (addr, rkey), exchanged once established
    closed: bool = False


@dataclasses.dataclass
class Conn:
    name: str
    client: Side
    server: Side
    port: int
    listener: Any = None
    state: str = "connecting"   # connecting | established | failed
    extra: list = dataclasses.field(default_factory=list)  # requests accepted before the last


@dataclasses.dataclass
class Outcome:
    schedule: Schedule
    results: list[dict]
    hung: Optional[str] = None
    history: list = dataclasses.field(default_factory=list)
    error: Optional[str] = None     # an exception the runner did not expect (a harness bug)
    # Steps whose moment never came and that did not say may_miss, one line each:
    # "step 4 (disconnect): moment cm_event DISCONNECTED (conn c0 server) never came within 30 s"
    missed: list[str] = dataclasses.field(default_factory=list)


class Runner(XrcOps):
    def __init__(self, lab, schedule: Schedule, *, outcome_ns: int = OUTCOME_NS,
                 destroy_ns: int = DESTROY_NS, settle_ns: Optional[int] = None):
        missing = [h for h in schedule.hosts if h not in lab.hosts]
        if missing:
            raise ScheduleError(f"schedule hosts {missing} are not in the lab (it has "
                                f"{sorted(lab.hosts)})")
        self.lab, self.s = lab, schedule
        self.outcome_ns, self.destroy_ns = outcome_ns, destroy_ns
        self.settle_ns = schedule.settle_ns if settle_ns is None else settle_ns
        self.results: list[dict] = []
        self.hung: Optional[str] = None
        self.missed: list[str] = []
        self.conns: dict[str, Conn] = {}
        self.rules: dict[str, Any] = {}
        self.procs: dict[tuple, Any] = {}      # (host, name) -> the live process
        self.every_proc: list[tuple] = []      # every process made, killed ones too
        self.step_i, self.step_k = 0, 0        # the step running, its WRs so far (_wr)
        self.channels: dict[tuple, Any] = {}
        self.dispatchers: dict[tuple, Any] = {}   # (host, process) -> async-event Dispatcher
        self.killable = {(st["host"], st["process"]) for st in schedule.steps
                         if st["op"] == "kill"}
        self.qpns: dict[str, set] = {}
        self.triggers: list[tuple[int, dict, dict]] = []   # (i, step, moment) armed
        self.msg_watch: dict[tuple, Any] = {}
        self.port = _BASE_PORT
        self._reused: dict[str, bool] = {}   # host -> a QPN was handed out again
        self._xrc_init()                     # XRC domains and senders (xrc.py)

    # -- the run
    def run(self) -> Outcome:
        self.lab.record("schedule_start", object="schedule", steps=len(self.s.steps),
                        seed=self.s.seed, hosts=self.s.hosts)
        if any(st["op"] == "reboot" or (st.get("at") or {}).get("moment") == "qpn_reused"
               for st in self.s.steps):
            # QPNs after a reboot meet the survivors' stale connections only if every host
            # counts them from its boot, as the model's do (a device lab reboots the hosts
            # earlier labs used; vm:rxe seed 8: REJ(stale) on the model only).
            self.lab.fresh_hosts(*self.s.hosts)
        self._watch_cm_messages()
        for i, step in enumerate(self.s.steps):
            if self.s.pace_ns and i:
                self.lab.sleep(self.s.pace_ns)
            if self.hung:
                self._result(i, step, "skipped", detail="after a hung wait")
                continue
            moment = step.get("at")
            if moment and moment["moment"] in TRIGGERS:
                self._arm(i, step, moment)
                continue
            if moment and not self._wait_moment(i, step, moment):
                continue
            self._step(i, step)
        for i, step, moment in self.triggers:  # armed, never fired: their moment never came
            if self.hung:
                self._result(i, step, "skipped", detail="after a hung wait")
            else:
                self._missed(i, step, moment, " before the schedule's end")
        self.triggers.clear()
        try:
            self._teardown()
        finally:
            self._release()
        return Outcome(self.s, self.results, self.hung, missed=list(self.missed))

    def _cleanup(self, fn, *args) -> bool:
        """One teardown call. A wait past its deadline is recorded as `hung` (False: the
        caller decides whether the rest of that teardown can go on); any other error is an
        object already gone with its process or host."""
        try:
            fn(*args)
        except (Hung, DeadlineExceeded) as e:
            self._hang(len(self.s.steps), {"op": "teardown"}, e)
            return False
        except (Error, EOFError):  # EOFError: its agent's channel closed with a reboot
            pass
        return True

    def _release(self) -> None:
        """Drops every object the run made. The engine holds the runner's callbacks (the
        dispatchers' handler, verb hooks) and the runner holds the lab: a cycle through C++
        that Python's collector cannot see, which kept every seed's objects alive (about
        650 KB a seed in the swarm)."""
        for d in (self.conns, self.channels, self.dispatchers, self.procs, self.rules,
                  self.msg_watch, self.xrcs, self.xrc_senders):
            d.clear()
        self.every_proc.clear()
        self.triggers.clear()
        self.lab = None

    def _step(self, i: int, step: dict) -> None:
        op = step["op"]
        outer = self.step_i, self.step_k  # a trigger's step runs inside another step
        self.step_i, self.step_k = i, 0
        try:
            detail = getattr(self, "_op_" + op)(step)
            self._result(i, step, "ok", detail=detail or "")
        except (Hung, DeadlineExceeded) as e:
            self._hang(i, step, e)
        except FaultNotSupported as e:
            self._result(i, step, "unsupported", detail=e.detail)
        except HostLost:
            raise
        except Error as e:
            self._result(i, step, "error", errno=getattr(e, "errno_name", ""),
                         detail=str(e)[:300])
        except ValueError as e:  # a rule the lab's parser refused: the schedule is wrong
            raise ScheduleError(f"step {i} ({op}): {e}") from None
        finally:
            self.step_i, self.step_k = outer
        self._fire_qpn_triggers()

    def _result(self, i: int, step: dict, result: str, **data) -> None:
        rec = {"i": i, "op": step["op"], "result": result, **data}
        self.results.append(rec)
        self.lab.record("schedule_step", object="schedule", **rec)

    def _missed(self, i: int, step: dict, m: dict, when: str) -> None:
        """A step whose moment never came: `skipped` if it says may_miss, else `missed`, a
        failure of the run (Outcome.missed)."""
        what = f"step {i} ({step['op']}): moment {moment_text(m)} never came{when}"
        may = bool(step.get("may_miss"))
        extra = {"verb": m["verb"]} if m["moment"] == "verb" else {}
        self.lab.record("schedule_moment", object="schedule", i=i, moment=m["moment"],
                        missed=True, may_miss=may, **extra)
        if may:
            self._result(i, step, "skipped", detail=f"{what} (may_miss)"[:300])
            return
        self.missed.append(what)
        self._result(i, step, "missed", detail=what[:300])

    def _hang(self, i: int, step: dict, e: Exception) -> None:
        what = f"step {i} ({step['op']}): {getattr(e, 'what', None) or getattr(e, 'detail', '')}"
        self.hung = what
        self._result(i, step, "hung", detail=what[:300])
        self.lab.record("hung", object="schedule", what=what, dump=str(e)[:4000])

    # -- moments
    def _watch_cm_messages(self) -> None:
        """cm_msg moments count from the start: a watch rule per (msg, src_host) up front."""
        for step in self.s.steps:
            m = step.get("at")
            if m and m["moment"] == "cm_msg":
                key = (m["msg"], m.get("src_host"))
                if key not in self.msg_watch:
                    spec = {"action": "watch", "cm": m["msg"]}
                    if m.get("src_host"):
                        spec["src_host"] = m["src_host"]
                    try:
                        self.msg_watch[key] = self.lab.faults.rule(spec)
                    except FaultNotSupported:
                        self.msg_watch[key] = None

    def _wait_moment(self, i: int, step: dict, m: dict) -> bool:
        """Holds the schedule until the moment comes (True), or records the step as missed
        (or skipped, may_miss) once within_ns ran out (False)."""
        kind = m["moment"]
        within = m.get("within_ns", DEFAULT_WITHIN_NS)
        if kind == "after":
            self.lab.sleep(m["ns"])
            return True
        pred, approx = self._moment_pred(m)
        if pred is False:  # what it names does not exist: it cannot come
            self._missed(i, step, m, f": {approx}")
            return False
        if pred is None:  # the lab cannot see it: take it now, and say so
            self.lab.record("schedule_moment", object="schedule", i=i, moment=kind,
                            approx=approx)
            return True
        try:
            self.lab.wait_until(pred, within, f"step {i}: moment {kind}")
        except (Hung, DeadlineExceeded):
            self._missed(i, step, m, f" within {within / 1e9:g} s")
            return False
        self.lab.record("schedule_moment", object="schedule", i=i, moment=kind)
        return True

    def _moment_pred(self, m: dict) -> tuple[Any, str]:
        """(predicate, ""), or (None, why) when the lab cannot see the moment (it is taken at
        once), or (False, why) when what it names does not exist (it can never come)."""
        kind = m["moment"]
        if kind == "cm_msg":
            rule = self.msg_watch.get((m["msg"], m.get("src_host")))
            if rule is None:
                return None, "no wire watch on this lab: taken at once"
            n = m.get("n", 1)
            return (lambda: rule.hits >= n), ""
        if m["conn"] not in self.conns:  # its connect step did not run (missed, skipped)
            return False, f"conn {m['conn']} was never connected (its connect step did not run)"
        side = self._side(m)
        if side.cm_id is None:  # the connect is over: no id comes any more
            return False, f"conn {m['conn']} has no {m['side']} cm_id (its connect failed)"
        cm_id = side.cm_id
        if kind == "cm_event":
            return (lambda: cm_id.count(m["event"]) > 0), ""
        if not self.lab.has(CM_PROTOCOL_STATE):
            return None, "the lab cannot read CM protocol states: taken at once"
        state = m["state"]
        return (lambda: _protocol_state(cm_id) == state), ""

    def _arm(self, i: int, step: dict, m: dict) -> None:
        if m["moment"] == "verb":
            # A conn whose connect step did not run has no QP: the trigger never fires.
            side = self._side(m) if m["conn"] in self.conns else None
            verb, fired = m["verb"], []

            def at_verb(call):
                # Only while armed: once the schedule's steps are over (the trigger is then
                # missed or skipped) a verb of the teardown must not run the step.
                if fired or side is None or not any(t[0] == i for t in self.triggers):
                    return
                if side.player is None and side.cm_id is None:
                    return
                qp = getattr(side.player, "qp", None) or getattr(side.cm_id, "qp", None)
                if qp is None or call.qp_num != qp.qp_num or call.host != side.host:
                    return
                fired.append(True)
                self.triggers[:] = [t for t in self.triggers if t[0] != i]
                self.lab.record("schedule_moment", object="schedule", i=i, moment="verb",
                                verb=verb)
                self._step(i, step)
            try:
                self.lab.faults.on_verb(at_verb, verb=verb)
            except FaultNotSupported as e:
                self._result(i, step, "unsupported", detail=f"moment verb: {e.detail}")
                return
        self.triggers.append((i, step, m))

    def _fire_qpn_triggers(self) -> None:
        for i, step, m in list(self.triggers):
            if m["moment"] == "qpn_reused" and self._reused.get(m["host"]):
                self.triggers.remove((i, step, m))
                self._reused[m["host"]] = False
                self.lab.record("schedule_moment", object="schedule", i=i, moment="qpn_reused")
                self._step(i, step)

    # -- the ops
    def _op_connect(self, st: dict) -> str:
        c = Conn(st["conn"], Side(st["conn"], "client", st["client"],
                                  st.get("client_process", "p0")),
                 Side(st["conn"], "server", st["server"], st.get("server_process", "p0")),
                 self.port)
        self.port += 1
        self.conns[c.name] = c
        srv_ch, cli_ch = self._channel(c.server), self._channel(c.client)
        c.listener = srv_ch.listen(c.port)
        c.client.cm_id = cli_ch.connect(c.server.host, c.port, timeout_ns=self.outcome_ns)
        self._bind(c.client)
        self._serve(c)
        if c.server.cm_id is None:
            c.state = "failed"
            return "no CONNECT_REQUEST: " + self._last_event(c.client)
        self.lab.wait_until(lambda: self._ended(c.server), self.outcome_ns,
                            f"connect {c.name}: the server side's outcome")
        if c.client.cm_id.count("ESTABLISHED") and c.server.cm_id.count("ESTABLISHED"):
            from ..api.resources import CmSide
            for side in (c.client, c.server):
                side.player = CmSide(self.lab, side.cm_id)
                self._dispatcher(side).watch(side.player.qp, self._handler)
            # The applications exchange their buffers' address and rkey once, as they would
            # in private data: an RDMA op after the peer's MR is gone uses the stale rkey.
            c.client.remote = (c.server.player.mr.addr, c.server.player.mr.rkey)
            c.server.remote = (c.client.player.mr.addr, c.client.player.mr.rkey)
            c.state = "established"
            return "established"
        c.state = "failed"
        return f"client {self._last_event(c.client)}, server {self._last_event(c.server)}"

    def _serve(self, c: Conn) -> None:
        """The server application: accepts every CONNECT_REQUEST on the listener until the
        client's attempt has an outcome (a REQ retried after a stale REJ is a new request);
        the last one accepted is the connection's server side."""
        listener, taken = c.listener, 0
        while True:
            self.lab.wait_until(lambda: listener.count("CONNECT_REQUEST") > taken or
                                self._ended(c.client), self.outcome_ns,
                                f"connect {c.name}: a CONNECT_REQUEST or the client's outcome")
            if listener.count("CONNECT_REQUEST") <= taken:
                return
            req = listener.wait_request(sec(1))
            taken += 1
            if c.server.cm_id is not None:
                c.extra.append(c.server.cm_id)
            c.server.cm_id = req
            req.accept()
            self._bind(c.server)

    @staticmethod
    def _ended(side: Side) -> bool:
        return any(r.name in _CONNECT_ENDS for r in side.cm_id.events)

    @staticmethod
    def _last_event(side: Side) -> str:
        events = side.cm_id.events if side.cm_id is not None else []
        return events[-1].name if events else "no event"

    def _each_wr(self, st: dict):
        """A step's n WRs, a pace apart in a paced run: each post is an agent call of ms on a
        device, where a peer's TERMINATE can come between two (vm:siw seed 8)."""
        for k in range(st.get("n", 1)):
            if k and self.s.pace_ns:
                self.lab.sleep(self.s.pace_ns)
            yield k

    def _op_recv(self, st: dict) -> str:
        p = self._player(st)
        for _ in self._each_wr(st):
            p.post_recv(wr_id=self._wr(st))
        return ""

    def _op_post(self, st: dict) -> str:
        p, opcode = self._player(st), st.get("opcode", "SEND")
        kw = {"signaled": st["signaled"]} if "signaled" in st else {}
        if opcode != "SEND":
            addr, rkey = self._side(st).remote
            kw.update(remote_addr=addr, rkey=rkey)
        for _ in self._each_wr(st):
            p.post_send(opcode=opcode, wr_id=self._wr(st), **kw)
        return ""

    def _op_hold_acks(self, st: dict) -> str:
        side = self._sideof(st)
        self._channel(side).hold_acks(self._cm_id(st))
        side.holding = True
        return ""

    def _op_release_acks(self, st: dict) -> str:
        side = self._sideof(st)
        n = self._channel(side).release_acks(self._cm_id(st))
        side.holding = False
        return f"{n} acked"

    def _op_disconnect(self, st: dict) -> str:
        self._cm_id(st).disconnect()
        return ""

    def _op_drain(self, st: dict) -> str:
        player = self._player(st)
        r = player.drain(self.destroy_ns)
        if not r.complete and player.qp.ctx.caps.err_post == "strand":
            # What the provider is known to do, not a hang of the lab: a WR posted to a user
            # siw QP in ERR never completes, so no drain waiting for it can finish.
            raise Error(f"drain of {st['conn']} {st['side']}: not complete, as the finding "
                        f"{STRANDED_FINDING} predicts: {r.detail}")
        if not r.complete:
            raise Hung(f"drain of {st['conn']} {st['side']}", f"drain did not complete: "
                       f"{r.detail}\n{self.lab.dump_state()}", "drain")
        return f"{r.method}: {r.succeeded} succeeded, {r.flushed} flushed, {r.errored} errored"

    def _op_destroy(self, st: dict) -> str:
        side = self._sideof(st)
        held = side.holding  # an event read and not acked: rdma_destroy_id may not return
        self._close(side, release_acks=False)
        return "destroyed with acks held" if held else ""

    def _op_async_event(self, st: dict) -> str:
        side = self._sideof(st)
        qp = side.player.qp if side.player is not None else getattr(side.cm_id, "qp", None)
        if qp is None:
            raise Error(f"async_event: {st['conn']} {st['side']} has no QP")
        self.lab.faults.inject_async_event(side.host, st["event"], qp.qp_num,
                                           st.get("driver_delay_ns", 0))
        return ""

    def _op_kill(self, st: dict) -> str:
        self._poll_all()  # what completed before: a device's CQ goes with the process
        proc = self.procs.pop((st["host"], st["process"]), None)
        if proc is None:
            return "no such process yet"
        proc.kill()  # a later connect in that name starts the application again
        for side in self._sides():
            if (side.host, side.process) == (st["host"], st["process"]):
                side.closed = True
        self.channels.pop((st["host"], st["process"]), None)
        self.dispatchers.pop((st["host"], st["process"]), None)
        self._xrc_dead(st["host"], st["process"])
        return ""

    def _op_reboot(self, st: dict) -> str:
        self._poll_all()  # what completed before: a device's CQs go with the host (rxe seed 8)
        self.lab.faults.reboot(st["host"], st["down_ns"])
        for key in [k for k in self.procs if k[0] == st["host"]]:
            self.procs.pop(key)
            self.channels.pop(key, None)
            self.dispatchers.pop(key, None)
        for side in self._sides():
            if side.host == st["host"]:
                side.closed = True
        self._xrc_dead(st["host"])
        # The schedule goes on once the host is back, on every lab: a device's reboot returns
        # only then (a VM boots in tens of seconds), the model's at once (back after down_ns).
        # Without this the model's next steps met a host still down (EHOSTDOWN) that the
        # device's had back (vm:siw seed 8).
        self.lab.sleep(st["down_ns"] + ms(1))
        return ""

    def _op_port_down(self, st: dict) -> str:
        self.lab.faults.port_down(st["host"])
        return ""

    def _op_port_up(self, st: dict) -> str:
        self.lab.faults.port_up(st["host"])
        return ""

    def _op_rule(self, st: dict) -> str:
        self.rules[st["name"]] = self.lab.faults.rule(dict(st["rule"]))
        return ""

    def _op_unrule(self, st: dict) -> str:
        rule = self.rules.pop(st["name"], None)
        if rule is not None:
            self.lab.faults.remove(rule)
        return ""

    def _op_wait(self, st: dict) -> str:
        self.lab.sleep(st["ns"])
        self._poll_all()
        return ""

    def _poll_all(self) -> None:
        """Reads every live side's completions: a device records a completion when it is
        polled (the model when it is made), so an application that polls is what makes the
        two histories comparable."""
        for side in self._sides():
            self._poll(side)
        self._xrc_poll_all()

    def _poll(self, side: Side) -> None:
        if side.closed or side.player is None:
            return
        try:
            while side.player.poll(32):
                pass
        except Error:
            pass

    # -- objects
    def _process(self, host: str, name: str):
        key = (host, name)
        if key not in self.procs:
            self.procs[key] = (self.lab.killable_process(host, name) if key in self.killable
                               else self.lab.host(host).process(name))
            self.every_proc.append((host, name, self.procs[key]))
        return self.procs[key]

    def _channel(self, side: Side):
        key = (side.host, side.process)
        if key not in self.channels:
            self.channels[key] = self._process(*key).event_channel()
        return self.channels[key]

    def _dispatcher(self, side: Side):
        """One async-event dispatcher per process (its device context), as an application
        has: every QP watched, destroy through it (seed 002)."""
        key = (side.host, side.process)
        if key not in self.dispatchers:
            from ..api.stack import Dispatcher
            self.dispatchers[key] = Dispatcher(self.lab, side.player.ctx).start()
        return self.dispatchers[key]

    def _handler(self, ev) -> None:
        """An application's handler: it takes HANDLER_NS, so a destroy can meet it running
        and a second event can queue behind it."""
        self.lab.sleep(HANDLER_NS)

    def _bind(self, side: Side) -> None:
        cm_id = side.cm_id
        qp = getattr(cm_id, "qp", None)
        qpn = qp.qp_num if qp is not None else 0
        seen = self.qpns.setdefault(side.host, set())
        if qpn and qpn in seen:
            self._reused[side.host] = True
        seen.add(qpn)
        self.lab.record("schedule_bind", object="schedule", host=side.host, conn=side.conn,
                        side=side.role, process=side.process, cm_id=cm_id.label, qp_num=qpn,
                        qp=qp.label if qp is not None else "")

    def _sides(self):
        for c in self.conns.values():
            yield c.client
            yield c.server

    def _side(self, ref: dict) -> Side:
        c = self.conns.get(ref["conn"])
        if c is None:
            raise Error(f"{ref['conn']}: not connected yet")
        return c.client if ref["side"] == "client" else c.server

    def _sideof(self, st: dict) -> Side:
        side = self._side(st)
        if side.closed:
            raise Error(f"{st['conn']} {st['side']}: already destroyed or dead")
        return side

    def _player(self, st: dict):
        side = self._sideof(st)
        if side.player is None:
            raise Error(f"{st['conn']} {st['side']}: not established")
        return side.player

    def _cm_id(self, st: dict):
        side = self._sideof(st)
        if side.cm_id is None:
            raise Error(f"{st['conn']} {st['side']}: no cm_id")
        return side.cm_id

    def _wr(self, st: dict) -> int:
        """Step i's k-th WR is (i + 1) * 1000 + k: the same ids on every lab whatever the steps
        before did (a step refused on one lab consumes no number another lab gives out)."""
        n = (self.step_i + 1) * WR_PER_STEP + self.step_k
        self.step_k += 1
        return n

    def _close(self, side: Side, release_acks: bool = True) -> None:
        """Destroys a side (through its dispatcher, then the id with its QP, CQ, MR and PD).
        Closed only once it is: a moment inside the destroy still sees a live side, and a
        destroy refused (EBUSY: acks held) is retried at teardown."""
        if side.closed:
            return
        self._poll(side)
        if side.holding and release_acks:
            self._channel(side).release_acks(side.cm_id)
            side.holding = False
        d = self.dispatchers.get((side.host, side.process))
        if d is not None and side.player is not None and not side.player.qp.destroyed:
            d.destroy(side.player.qp, self.destroy_ns)  # waits for a running handler
            # Paced runs: the id goes a pace after its QP, as on a device, where the calls
            # between take ms; iWARP's CLOSE for the QP's destroy then reaches the id on both
            # (vm:siw seed 7: DISCONNECTED on the device, dropped by the model's destroy).
            if self.s.pace_ns:
                self.lab.sleep(self.s.pace_ns)
        if side.player is not None:
            side.player.close(self.destroy_ns)
        elif side.cm_id is not None and not side.cm_id.destroyed:
            side.cm_id.destroy(self.destroy_ns)
        side.closed = True

    # -- the end
    def _teardown(self) -> None:
        """Every id destroyed, every channel closed, the protocol's timers let run out; then
        what the kernel still holds for each live process (the leftovers checker)."""
        try:
            if not self.hung:
                self.lab.sleep(self.settle_ns)
            self._poll_all()
            # What follows is the harness's cleanup, not the schedule: the differential stops
            # comparing here (a close "at once" races the peer's DREQ on a device).
            self.lab.record("teardown_begin", object="schedule")
            for side in self._sides():
                if not self._cleanup(self._close, side):
                    break
            for c in self.conns.values():
                for cm_id in c.extra:
                    if not cm_id.destroyed:
                        try:
                            cm_id.destroy(self.destroy_ns)
                        except Error:
                            pass
                if c.listener is not None and not c.listener.destroyed:
                    try:
                        c.listener.destroy(self.destroy_ns)
                    except Error:
                        pass
            for d in list(self.dispatchers.values()):
                self._cleanup(d.stop, self.destroy_ns)
            for ch in list(self.channels.values()):
                self._cleanup(ch.close, self.destroy_ns)
            self._xrc_teardown()
            objects = {}
            for host, name, proc in self.every_proc:
                try:
                    held = {k: v for k, v in proc.kernel_objects().items() if v}
                except (Error, EOFError):
                    # Dead, or made by an agent a reboot of its host closed (EOFError: the
                    # channel is gone, vm:siw seed 8): the kernel's cleanup is not asked here.
                    continue
                key = f"{host}/{name}"
                while key in objects:  # the same name started again after a kill
                    key += "'"
                objects[key] = held
            self.lab.record("teardown", object="lab", objects=objects)
        except HostLost:
            raise


def run(lab, schedule: Schedule, **kw) -> Outcome:
    """Runs the schedule on the lab (Runner(lab, schedule, **kw).run())."""
    return Runner(lab, schedule, **kw).run()


def moment_text(m: dict) -> str:
    """A moment as the failure names it: "cm_event DISCONNECTED (conn c0 server)"."""
    kind = m["moment"]
    where = f" (conn {m['conn']} {m['side']})" if "conn" in m else ""
    if kind == "after":
        return f"after {m['ns']} ns"
    if kind == "cm_state":
        return f"cm_state {m['state']}{where}"
    if kind == "cm_event":
        return f"cm_event {m['event']}{where}"
    if kind == "cm_msg":
        src = f" from {m['src_host']}" if m.get("src_host") else ""
        return f"cm_msg {m['msg']} #{m.get('n', 1)}{src}"
    if kind == "verb":
        return f"verb {m['verb']}{where}"
    if kind == "qpn_reused":
        return f"qpn_reused (host {m['host']})"
    return kind


def _protocol_state(cm_id) -> str:
    try:
        return cm_id.protocol_state
    except Error:
        return ""
