"""The moments of a schedule (rdmalab.schedules.schedule MOMENTS) as the Runner
(rdmalab.schedules.runner) takes them from Moments: a wait for one that holds the schedule
(after, cm_event, cm_state, cm_msg; a moment the lab cannot see is taken at once and recorded
`approx`), a trigger armed for one that runs its step when it comes (verb, qpn_reused), and a
step whose moment never came (`missed`, or `skipped` with may_miss). They read the Runner's
connections (_side, conns) and record `schedule_moment` in its lab.
"""
from __future__ import annotations

from typing import Any

from ..errors import DeadlineExceeded, Error, FaultNotSupported, Hung
from ..protocol import CM_PROTOCOL_STATE
from .schedule import DEFAULT_WITHIN_NS


class Moments:
    """The Runner's moments; it gives lab, s, conns, triggers, msg_watch, _reused, _side,
    _step, _result and missed."""

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
