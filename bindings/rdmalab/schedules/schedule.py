"""Fault schedules as data (JSON): connections, traffic, workloads and faults, each step at
once, after a delay or at a named protocol moment. Hand-written scenarios may run one; the
swarm (rdmalab.schedules.swarm, swarm_workload) draws them; `python3 -m rdmalab replay FILE
--lab ...` replays one on any lab.

    {"rdmalab_schedule": 1, "hosts": ["a", "b"], "seed": 7, "personality": "roce",
     "steps": [
       {"op": "connect", "conn": "c0", "client": "a", "server": "b"},
       {"op": "rule", "name": "r0", "rule": {"action": "drop", "cm": "DREP"}},
       {"op": "recv", "conn": "c0", "side": "server", "n": 2},
       {"op": "post", "conn": "c0", "side": "client", "opcode": "SEND", "n": 2},
       {"op": "disconnect", "conn": "c0", "side": "client"},
       {"op": "kill", "host": "b", "process": "p0",
        "at": {"moment": "cm_msg", "msg": "DREQ", "n": 3}}]}

The step vocabulary (OPS below) and the moments (MOMENTS) are documented in README "Fault
schedules". The runner speaks only the Lab protocol, so one schedule runs on the model, the VM
lab and real hosts; a moment a lab cannot observe is taken at the nearest point it can, and
the history says so (`schedule_moment` with `approx`). A step whose moment never comes fails
the run (`missed`) unless the step says `"may_miss": true`.

Validation names the step and the field of the first thing wrong. Every name with a closed set
of values is checked against the table the lab itself reads: cm_event `event` against the
rdma_cm events (_core.CmEventType), cm_state `state` against the IB CM and iWARP CM states
(rdmalab.checkers.cm_tables), verb `verb` against VERB_MOMENTS, `personality` against the
model's (rdmalab.labs.engine.personalities), a rule against the fault switch's parser
(_core.check_wire_rule); those tables are read when a schedule is validated, so importing this
module needs none of them.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import pathlib
from typing import Any, Optional

from .. import sec
from ..errors import Error, FaultNotSupported, Hung

SCHEMA = 1
SIDES = ("client", "server")
OPCODES = ("SEND", "RDMA_WRITE", "RDMA_READ")
ASYNC_EVENTS = ("QP_FATAL", "QP_REQ_ERR", "QP_ACCESS_ERR", "COMM_EST", "SQ_DRAINED",
                "PATH_MIG", "PATH_MIG_ERR", "QP_LAST_WQE_REACHED")
CM_MESSAGES = ("REQ", "MRA", "REJ", "REP", "RTU", "DREQ", "DREP")
# How long the runner waits for what the stack must do on its own (a connection's outcome, a
# destroy, a drain): past the IB CM's give-up (16 REQs 4.6-6.4 s apart; an MRA stretches it).
OUTCOME_NS = sec(400)
DESTROY_NS = sec(10)

# op -> {field: type}; "conn"/"side"/"host"/"process" are checked against the schedule.
_C, _S, _H, _W = "conn", "side", "host", "workload"
OPS: dict[str, dict[str, Any]] = {
    "connect": {"conn": str, "client": str, "server": str, "client_process": str,
                "server_process": str},
    "recv": {_C: str, _S: str, "n": int},
    "post": {_C: str, _S: str, "opcode": str, "n": int, "signaled": bool},
    "disconnect": {_C: str, _S: str},
    "hold_acks": {_C: str, _S: str},
    "release_acks": {_C: str, _S: str},
    "drain": {_C: str, _S: str},
    "destroy": {_C: str, _S: str},
    "async_event": {_C: str, _S: str, "event": str, "driver_delay_ns": int},
    "kill": {_H: str, "process": str},
    "reboot": {_H: str, "down_ns": int},
    "port_down": {_H: str},
    "port_up": {_H: str},
    "rule": {"name": str, "rule": dict},
    "unrule": {"name": str},
    "wait": {"ns": int},
    # XRC (seed 003): a domain on one host shared by processes, a sender on another host.
    "xrc_open": {"xrc": str, _H: str, "creator": str, "holders": list, "n_srq": int},
    "xrc_connect": {"xrc": str, "sender": str, _H: str, "process": str},
    "xrc_recv": {"xrc": str, "srq": int, "n": int},
    "xrc_send": {"sender": str, "srq": int, "n": int},
    "xrc_close": {"xrc": str, "process": str, "what": str},
    "rdma_link_delete": {_H: str},
    "rdma_link_add": {_H: str, "deadline_ns": int},
    # Workloads (kernel ULPs): one declared by name and kind, then its steps (workload_ops.py).
    "workload": {_W: str, "kind": str, "target": str, "initiator": str, "options": dict},
    "workload_setup": {_W: str, "deadline_ns": int},
    "workload_export": {_W: str},
    "workload_connect": {_W: str, "deadline_ns": int},
    "workload_start_io": {_W: str, "blocks": int},
    "workload_wait_state": {_W: str, "state": str, "within_ns": int},
    "workload_stop_io": {_W: str, "deadline_ns": int},
    "workload_verify": {_W: str},
    "workload_teardown": {_W: str, "deadline_ns": int},
}
_REQUIRED = {
    "connect": ("conn", "client", "server"), "recv": (_C, _S), "post": (_C, _S),
    "disconnect": (_C, _S), "drain": (_C, _S), "destroy": (_C, _S),
    "hold_acks": (_C, _S), "release_acks": (_C, _S),
    "async_event": (_C, _S, "event"), "kill": (_H, "process"), "reboot": (_H, "down_ns"),
    "port_down": (_H,), "port_up": (_H,), "rule": ("name", "rule"), "unrule": ("name",),
    "wait": ("ns",),
    "xrc_open": ("xrc", _H, "creator"), "xrc_connect": ("xrc", "sender", _H),
    "xrc_recv": ("xrc", "srq"), "xrc_send": ("sender", "srq"), "xrc_close": ("xrc", "process"),
    "rdma_link_delete": (_H,), "rdma_link_add": (_H,),
    "workload": (_W, "kind", "target", "initiator"), "workload_wait_state": (_W, "state"),
    **{op: (_W,) for op in OPS if op.startswith("workload_") and op != "workload_wait_state"},
}
XRC_CLOSE = ("all", "qp")   # xrc_close: every object of the process's part, or its QP handle
XRC_MAX_SRQ = 8
# Moments: "wait" ones block the schedule until they happen (bounded by within_ns); "trigger"
# ones arm the step and go on: it runs when the moment comes during a later step.
MOMENTS: dict[str, dict[str, Any]] = {
    "after": {"ns": int},                                            # wait: a delay
    "cm_state": {_C: str, _S: str, "state": str, "within_ns": int},  # wait: IB/iWARP CM state
    "cm_event": {_C: str, _S: str, "event": str, "within_ns": int},  # wait: an rdma_cm event
    "cm_msg": {"msg": str, "n": int, "src_host": str, "within_ns": int},  # wait: nth CM msg
    "verb": {"verb": str, _C: str, _S: str},                         # trigger: verb in flight
    "qpn_reused": {_H: str},                                         # trigger: a QPN again
}
_MOMENT_REQUIRED = {"after": ("ns",), "cm_state": (_C, _S, "state"),
                    "cm_event": (_C, _S, "event"), "cm_msg": ("msg",),
                    "verb": ("verb", _C, _S), "qpn_reused": (_H,)}
TRIGGERS = ("verb", "qpn_reused")
DEFAULT_WITHIN_NS = sec(30)
# A `verb` moment matches its side's QP by number (Runner._arm), so it can see only the verbs
# at whose entry the model's hook (lab.faults.on_verb) is handed a QP number: the enter(verb,
# qpn) calls of core/model/qp.cc. Every other verb reaches the hook with qp_num 0 and would
# never fire. (A copy of a C++ fact _core does not expose; test_py_schedule pins it to the
# source.)
VERB_MOMENTS = ("ibv_modify_qp", "ibv_post_send", "ibv_post_recv", "ibv_destroy_qp")
# Bounds of a schedule's numbers: a duration (ns) at most a day of the lab's clock (the engine
# counts time in int64 ns from the lab's start), a seed a uint64 (the model's LabOptions.seed).
MAX_NS = sec(24 * 3600)
MAX_SEED = 2**64 - 1
# Step fields every op takes besides its own: the moment, and whether the run may go on
# without it (a step whose moment never comes fails the run unless it says may_miss).
STEP_FIELDS = ("op", "at", "may_miss")


class ScheduleError(ValueError):
    """A malformed schedule: the message names the step and the field."""


# The closed sets a schedule's names are checked against, each read from its one home when a
# schedule is validated (this module stays importable as pure data).
def cm_events() -> tuple[str, ...]:
    """rdma_cm event names (_core.CmEventType, as rdmalab.api.cm.CM_EVENTS lists them): what
    CmId.count() takes in a cm_event moment."""
    from ..api.cm_values import CM_EVENTS  # deferred: read at validation
    return tuple(CM_EVENTS)


def cm_protocol_states() -> tuple[str, ...]:
    """The CM protocol states a cm_state moment compares CmId.protocol_state with: the IB CM's
    (cm.c enum ib_cm_state) and the iWARP CM's (iwcm.c enum iw_cm_state), the tables of
    rdmalab.checkers.cm_tables (cm_sequence judges the model's `cm_state` records by them)."""
    from ..checkers.cm_tables import IB_CM_STATES, IW_CM_STATES  # deferred: read at validation
    return tuple(dict.fromkeys(IB_CM_STATES + IW_CM_STATES))


def personalities() -> list[str]:
    """The model's personalities (rdmalab.labs.engine.personalities)."""
    from ..labs.engine import personalities as every  # deferred: read at validation
    return every()


def check_workload(step: dict, declared: dict, hosts: list, at: str) -> None:
    """A workload step's own checks against its kinds' table (workload_ops.check_step)."""
    from .workload_ops import check_step  # deferred: the workload classes, read at validation
    check_step(step, declared, hosts, at)


def check_wire_rule(rule: dict) -> None:
    """The fault switch's own parser (_core.check_wire_rule: what the model's add_rule and the
    agent labs' rule() apply); ValueError naming the key."""
    from .. import _core  # deferred: read at validation
    _core.check_wire_rule(json.dumps(rule))


@dataclasses.dataclass
class Schedule:
    hosts: list[str]
    steps: list[dict]
    seed: int = 1
    personality: Optional[str] = None
    settle_ns: int = sec(5)
    pace_ns: int = 0      # at least this long between steps (0: at once)
    meta: dict = dataclasses.field(default_factory=dict)   # what drew it (swarm knobs)

    # -- files
    @classmethod
    def from_json(cls, obj: Any, where: str = "schedule") -> "Schedule":
        if not isinstance(obj, dict):
            raise ScheduleError(f"{where}: a JSON object expected, got {type(obj).__name__}")
        if obj.get("rdmalab_schedule") != SCHEMA:
            raise ScheduleError(f"{where}: \"rdmalab_schedule\": {SCHEMA} expected "
                                f"(got {obj.get('rdmalab_schedule')!r})")
        unknown = set(obj) - {"rdmalab_schedule", "hosts", "steps", "seed", "personality",
                              "settle_ns", "pace_ns", "meta"}
        if unknown:
            raise ScheduleError(f"{where}: unknown key(s) {sorted(unknown)}")
        hosts, steps = obj.get("hosts"), obj.get("steps")
        if not isinstance(hosts, list) or not hosts or not all(
                isinstance(h, str) and h for h in hosts) or len(set(hosts)) != len(hosts):
            raise ScheduleError(f"{where}: \"hosts\": a list of distinct host names")
        if not isinstance(steps, list):
            raise ScheduleError(f"{where}: \"steps\": a list of step objects")
        personality, meta = obj.get("personality"), obj.get("meta", {})
        if personality is not None and not isinstance(personality, str):
            raise ScheduleError(f"{where}: personality={personality!r}: str expected")
        if not isinstance(meta, dict):
            raise ScheduleError(f"{where}: meta={meta!r}: a JSON object expected")
        s = cls(hosts=list(hosts), steps=copy.deepcopy(steps),
                seed=_int(obj.get("seed", 1), f"{where}: seed"),
                personality=personality,
                settle_ns=_int(obj.get("settle_ns", sec(5)), f"{where}: settle_ns"),
                pace_ns=_int(obj.get("pace_ns", 0), f"{where}: pace_ns"),
                meta=dict(meta))
        s.validate(where)
        return s

    @classmethod
    def load(cls, path) -> "Schedule":
        path = pathlib.Path(path)
        try:
            obj = json.loads(path.read_text())
        except OSError as e:
            raise ScheduleError(f"{path}: cannot read: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise ScheduleError(f"{path}:{e.lineno}:{e.colno}: not JSON: {e.msg}") from None
        return cls.from_json(obj, str(path))

    def to_json(self) -> dict:
        out = {"rdmalab_schedule": SCHEMA, "hosts": self.hosts, "seed": self.seed}
        if self.personality:
            out["personality"] = self.personality
        out["settle_ns"] = self.settle_ns
        if self.pace_ns:
            out["pace_ns"] = self.pace_ns
        if self.meta:
            out["meta"] = self.meta
        out["steps"] = self.steps
        return out

    def dump(self, path) -> pathlib.Path:
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = ",\n    ".join(json.dumps(s, sort_keys=True) for s in self.steps)
        head = json.dumps({k: v for k, v in self.to_json().items() if k != "steps"},
                          sort_keys=True)[:-1]
        path.write_text(f"{head}, \"steps\": [\n    {lines}]}}\n")
        return path

    def with_steps(self, steps: list[dict]) -> "Schedule":
        return dataclasses.replace(self, steps=steps)

    # -- validation
    def validate(self, where: str = "schedule") -> None:
        self._check_head(where)
        conns: set[str] = set()
        rules: set[str] = set()
        xrcs: dict[str, dict] = {}      # xrc name -> its xrc_open step
        senders: dict[str, dict] = {}   # sender name -> its xrc_connect step
        workloads: dict[str, dict] = {}  # workload name -> its workload step
        for i, step in enumerate(self.steps):
            at = f"{where}: step {i}"
            if not isinstance(step, dict):
                raise ScheduleError(f"{at}: a JSON object expected")
            op = step.get("op")
            if not isinstance(op, str) or op not in OPS:
                raise ScheduleError(f"{at}: op {op!r} unknown; allowed: {', '.join(OPS)}")
            _fields(step, OPS[op], _REQUIRED[op], f"{at} ({op})", extra=STEP_FIELDS)
            self._check_refs(step, conns, f"{at} ({op})")
            if "at" in step:  # before a connect's own conn exists: a moment of it never comes
                self._check_moment(step["at"], conns, f"{at} ({op}) at")
            if "may_miss" in step:
                if not isinstance(step["may_miss"], bool):
                    raise ScheduleError(f"{at} ({op}): may_miss={step['may_miss']!r}: bool "
                                        "expected")
                if step["may_miss"] and "at" not in step:
                    raise ScheduleError(f"{at} ({op}): may_miss: only a step with an \"at\" "
                                        "moment can miss it")
            if op == "rule":
                try:
                    check_wire_rule(step["rule"])
                except (ValueError, TypeError, RuntimeError) as e:  # the parser's refusal
                    raise ScheduleError(f"{at} (rule): {e}") from None
            if op == "connect":
                if step["conn"] in conns:
                    raise ScheduleError(f"{at} (connect): conn {step['conn']!r} made twice")
                conns.add(step["conn"])
            elif op == "rule":
                rules.add(step["name"])
            elif op == "unrule" and step["name"] not in rules:
                raise ScheduleError(f"{at} (unrule): no rule named {step['name']!r} before")
            elif op.startswith("xrc_"):
                _check_xrc(step, xrcs, senders, f"{at} ({op})")
            elif op.startswith("workload"):
                check_workload(step, workloads, self.hosts, f"{at} ({op})")

    def _check_head(self, where: str) -> None:
        """The schedule's own fields (a Schedule made in code is checked as a file's is)."""
        head = {"seed": self.seed, "settle_ns": self.settle_ns, "pace_ns": self.pace_ns}
        for key, value in head.items():
            _int(value, f"{where}: {key}")
        _ranges(head, {"seed": (0, MAX_SEED), "settle_ns": (0, MAX_NS),
                       "pace_ns": (0, MAX_NS)}, where)
        if self.personality is not None:
            known = personalities()
            if self.personality not in known:
                raise ScheduleError(f"{where}: personality {self.personality!r} unknown; "
                                    f"known: {', '.join(known)}")
        if not isinstance(self.meta, dict):
            raise ScheduleError(f"{where}: meta: a JSON object expected")

    def _check_refs(self, step: dict, conns: set, at: str) -> None:
        for key in ("host", "client", "server"):
            if key in step and step[key] not in self.hosts:
                raise ScheduleError(f"{at}: {key} {step[key]!r} is not one of the schedule's "
                                    f"hosts {self.hosts}")
        if step["op"] == "connect" and step["client"] == step["server"]:
            raise ScheduleError(f"{at}: client and server are the same host")
        if "conn" in step and step["op"] != "connect" and step["conn"] not in conns:
            raise ScheduleError(f"{at}: conn {step['conn']!r} is not made by an earlier "
                                "connect step")
        if "side" in step and step["side"] not in SIDES:
            raise ScheduleError(f"{at}: side {step['side']!r}: client or server")
        if step.get("opcode", "SEND") not in OPCODES:
            raise ScheduleError(f"{at}: opcode {step['opcode']!r}: {', '.join(OPCODES)}")
        if step.get("event", "QP_FATAL") not in ASYNC_EVENTS:
            raise ScheduleError(f"{at}: event {step['event']!r}: {', '.join(ASYNC_EVENTS)}")
        # wr_ids are (step + 1) * 1000 + k (runner._wr): n stays below 1000
        _ranges(step, {"n": (0, 999), "srq": (0, None), "ns": (0, MAX_NS),
                       "down_ns": (0, MAX_NS), "driver_delay_ns": (0, MAX_NS),
                       "deadline_ns": (0, MAX_NS), "within_ns": (0, MAX_NS),
                       "blocks": (1, None)}, at)

    def _check_moment(self, at_obj: Any, conns: set, at: str) -> None:
        if not isinstance(at_obj, dict) or not isinstance(at_obj.get("moment"), str) or \
                at_obj["moment"] not in MOMENTS:
            raise ScheduleError(f"{at}: {{\"moment\": ...}} with one of "
                                f"{', '.join(MOMENTS)}")
        m = at_obj["moment"]
        _fields(at_obj, MOMENTS[m], _MOMENT_REQUIRED[m], f"{at} {m}", extra=("moment",))
        if "conn" in at_obj and at_obj["conn"] not in conns:
            raise ScheduleError(f"{at} {m}: conn {at_obj['conn']!r} is not made by an "
                                "earlier connect step")
        if "side" in at_obj and at_obj["side"] not in SIDES:
            raise ScheduleError(f"{at} {m}: side {at_obj['side']!r}: client or server")
        if m == "cm_msg" and at_obj["msg"] not in CM_MESSAGES:
            raise ScheduleError(f"{at} cm_msg: msg {at_obj['msg']!r}: "
                                f"{', '.join(CM_MESSAGES)}")
        for key, table in (("event", cm_events), ("state", cm_protocol_states),
                           ("verb", lambda: VERB_MOMENTS)):
            if key in at_obj and at_obj[key] not in table():
                raise ScheduleError(f"{at} {m}: {key} {at_obj[key]!r} unknown; allowed: "
                                    f"{', '.join(table())}")
        # cm_msg n: the nth copy of the message, counted from 1
        _ranges(at_obj, {"ns": (0, MAX_NS), "within_ns": (0, MAX_NS), "n": (1, None)},
                f"{at} {m}")
        for key in ("host", "src_host"):
            if key in at_obj and at_obj[key] not in self.hosts:
                raise ScheduleError(f"{at} {m}: {key} {at_obj[key]!r} is not a schedule host")


def xrc_srqs(open_step: dict) -> int:
    """How many SRQs an xrc_open makes: n_srq for each holder (the creator's when none)."""
    return open_step.get("n_srq", 1) * max(1, len(open_step.get("holders", [])))


def _check_xrc(step: dict, xrcs: dict, senders: dict, at: str) -> None:
    op = step["op"]
    if op == "xrc_open":
        holders = step.get("holders", [])
        if step["xrc"] in xrcs:
            raise ScheduleError(f"{at}: xrc {step['xrc']!r} opened twice")
        if not all(isinstance(h, str) and h for h in holders) or len(set(holders)) != len(
                holders) or step["creator"] in holders:
            raise ScheduleError(f"{at}: holders: distinct process names other than the "
                                f"creator, got {holders!r}")
        if not 1 <= step.get("n_srq", 1) <= XRC_MAX_SRQ:
            raise ScheduleError(f"{at}: n_srq must be 1 to {XRC_MAX_SRQ}")
        xrcs[step["xrc"]] = step
        return
    name = step.get("xrc") if op != "xrc_send" else senders.get(step["sender"], {}).get("xrc")
    if op == "xrc_send" and step["sender"] not in senders:
        raise ScheduleError(f"{at}: sender {step['sender']!r} is not made by an earlier "
                            "xrc_connect step")
    if name not in xrcs:
        raise ScheduleError(f"{at}: xrc {name!r} is not made by an earlier xrc_open step")
    opened = xrcs[name]
    if op == "xrc_connect":
        if step["sender"] in senders:
            raise ScheduleError(f"{at}: sender {step['sender']!r} made twice")
        if any(s["xrc"] == name for s in senders.values()):  # a TGT QP has one INI peer
            raise ScheduleError(f"{at}: xrc {name!r} has a sender already")
        if step["host"] == opened["host"]:
            raise ScheduleError(f"{at}: the sender's host is the xrc's host {step['host']!r}")
        senders[step["sender"]] = step
    elif op in ("xrc_recv", "xrc_send") and not 0 <= step["srq"] < xrc_srqs(opened):
        raise ScheduleError(f"{at}: srq {step['srq']} out of range: xrc {name!r} has "
                            f"{xrc_srqs(opened)}")
    elif op == "xrc_close":
        if step["process"] not in [opened["creator"], *opened.get("holders", [])]:
            raise ScheduleError(f"{at}: process {step['process']!r} is not xrc {name!r}'s "
                                "creator or a holder")
        if step.get("what", "all") not in XRC_CLOSE:
            raise ScheduleError(f"{at}: what {step['what']!r}: {', '.join(XRC_CLOSE)}")


def _ranges(obj: dict, bounds: dict, at: str) -> None:
    """Each integer field of obj present in bounds within its (lowest, highest or None)."""
    for key, (lo, hi) in bounds.items():
        v = obj.get(key)
        if v is None:
            continue
        if v < lo:
            raise ScheduleError(f"{at}: {key} must be >= {lo}, got {v}")
        if hi is not None and v > hi:
            raise ScheduleError(f"{at}: {key} must be <= {hi}, got {v}")


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ScheduleError(f"{what}: an integer expected, got {v!r}")
    return v


def _fields(obj: dict, types: dict, required: tuple, at: str, extra: tuple) -> None:
    unknown = set(obj) - set(types) - set(extra)
    if unknown:
        raise ScheduleError(f"{at}: unknown field(s) {sorted(unknown)}; allowed: "
                            f"{', '.join(types)}")
    for key in required:
        if key not in obj:
            raise ScheduleError(f"{at}: field {key!r} missing")
    for key, want in types.items():
        if key in obj and (not isinstance(obj[key], want) or
                           (want is int and isinstance(obj[key], bool))):
            raise ScheduleError(f"{at}: {key}={obj[key]!r}: {want.__name__} expected")


def load(path) -> Schedule:
    return Schedule.load(path)


# The runner, and run(lab, schedule), live in rdmalab.schedules.runner (it needs the lab API;
# this module is pure data).
__all__ = ["ASYNC_EVENTS", "CM_MESSAGES", "MOMENTS", "OPS", "Schedule", "ScheduleError",
           "VERB_MOMENTS", "cm_events", "cm_protocol_states", "xrc_srqs", "load", "Error",
           "FaultNotSupported", "Hung"]
