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

from .. import ms
from ..api.stack import Dispatcher
from ..errors import DeadlineExceeded, Error, FaultNotSupported, HostLost, Hung
from .moments import Moments
from .ops import Conn, Ops, Side
from .schedule import DESTROY_NS, OUTCOME_NS, TRIGGERS, Schedule, ScheduleError
from .workload_ops import WorkloadOps
from .xrc import XrcOps

_BASE_PORT = 18000
HANDLER_NS = ms(1)
WR_PER_STEP = 1000  # wr_id = (step + 1) * 1000 + k; schedule.py bounds n below it


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


class Runner(Moments, Ops, XrcOps, WorkloadOps):
    """One schedule on one lab: the run and its results here, with the objects the steps use
    and the teardown; the moments from Moments (moments.py), the ops from Ops (ops.py),
    XrcOps (xrc.py) and WorkloadOps (workload_ops.py)."""

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
        self._workload_init()                # the workloads (workload_ops.py)

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
                  self.msg_watch, self.xrcs, self.xrc_senders, self.workloads):
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

    def _hang(self, i: int, step: dict, e: Exception) -> None:
        what = f"step {i} ({step['op']}): {getattr(e, 'what', None) or getattr(e, 'detail', '')}"
        self.hung = what
        self._result(i, step, "hung", detail=what[:300])
        self.lab.record("hung", object="schedule", what=what, dump=str(e)[:4000])

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
            self._workload_teardown()  # before the connections: a ULP's own cleanup first
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
