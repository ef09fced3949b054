"""A schedule's workload steps (issue 29): the kinds a `workload` step may name (KINDS: one row
each), the checks of the workload family's steps (check_step, called by Schedule.validate), and
the runner's ops (WorkloadOps: `_op_workload`, `_op_workload_setup`, ...) that drive a
workload of rdmalab.workloads through the Lab protocol.

    {"op": "workload", "workload": "w0", "kind": "nvme", "target": "a", "initiator": "b",
     "options": {"backing": "disk", "ctrl_loss_tmo": 600}},
    {"op": "workload_setup", "workload": "w0"},
    {"op": "workload_start_io", "workload": "w0", "blocks": 512},
    ... faults ...
    {"op": "workload_wait_state", "workload": "w0", "state": "live", "within_ns": 90e9},
    {"op": "workload_stop_io", "workload": "w0"}, {"op": "workload_verify", "workload": "w0"},
    {"op": "workload_teardown", "workload": "w0"}

A lab without kernel ULPs (the model) refuses the `workload` step with FaultNotSupported: the
step is `unsupported`, and so is every later step of that workload, with the same reason.
"""
from __future__ import annotations

import dataclasses
import errno
import inspect
import typing
from typing import Any, Optional

from .. import sec
from ..checkers import workloads as rules
from ..errors import Error, FaultNotSupported, Hung, WorkloadError
from ..workloads import Iser, Nfs, NvmeOf, Srp
from ..workloads.nfs_host import STATES as NFS_STATES
from ..workloads.records import GONE, WORKLOAD
from .schedule import ScheduleError

# The NVMe controller's states as its sysfs `state` file names them (drivers/nvme/host/core.c
# nvme_sysfs_show_state), and "gone" once the controller is deleted (rdmalab.workloads.records).
NVME_STATES = ("new", "live", "resetting", "connecting", "deleting", "deleting (no IO)",
               "dead", GONE)
# The iSCSI session's states (drivers/scsi/scsi_transport_iscsi.c iscsi_session_state_names)
# and "gone" once logged out.
ISER_STATES = ("LOGGED_IN", "FAILED", "FREE", GONE)


@dataclasses.dataclass(frozen=True)
class Kind:
    """A workload kind a schedule may name: its class (whose keyword-only constructor options
    are the step's `options`), the states wait_state may name, and the options the swarm sets
    it up with (rdmalab.schedules.swarm_workload). Its working state and the option a
    reconnect waits are the checkers' (rdmalab.checkers.workloads.KINDS: live,
    reconnect_delay)."""
    cls: type
    states: tuple[str, ...]
    swarm_options: dict

    @property
    def rules(self) -> rules.Kind:
        return rules.KINDS[self.cls.kind]


KINDS: dict[str, Kind] = {
    # ctrl_loss_tmo past any outage the swarm draws (a TCG guest's reboot: 30-90 s), fast_io_fail
    # off: the controller reconnects and I/O waits, so no I/O error may reach the ledger.
    "nvme": Kind(NvmeOf, NVME_STATES, {"backing": "disk", "keep_alive_tmo": 5,
                                       "reconnect_delay": 2, "ctrl_loss_tmo": 600}),
    # replacement_timeout past any outage: the session recovers and I/O waits.
    "iser": Kind(Iser, ISER_STATES, {"backing": "disk", "replacement_timeout": 600,
                                     "noop_out_interval": 5, "noop_out_timeout": 5}),
    # A hard NFSv3 mount: I/O waits out any outage (NFSv4 adds the server's grace period).
    # SRP has no keep-alive: a SCSI command timeout past the outage, or sd offlines the disk.
    "srp": Kind(Srp, ("running", "blocked", "fail-fast", "lost", GONE),
                {"reconnect_delay": 2, "fast_io_fail_tmo": 300, "dev_loss_tmo": 600,
                 "scsi_timeout": 75}),
    "nfs": Kind(Nfs, NFS_STATES, {"vers": "3", "hard": True, "timeo": 100, "retrans": 2}),
}

SETUP_NS = sec(120)      # a setup or a connect: modprobe, configfs, nvme connect on a TCG guest
TEARDOWN_NS = sec(120)   # a teardown: disconnect and the target's removal
STOP_IO_NS = sec(30)     # a write still in the kernel this long after stop is `blocked`


# ---- validation (Schedule.validate calls check_step for every workload step) -----------------

def check_step(step: dict, declared: dict, hosts: list, at: str) -> None:
    """A workload step's own checks: a `workload` step's kind, hosts and options; any other
    names a workload declared before, and a wait_state a state of its kind."""
    name = step["workload"]
    if step["op"] == "workload":
        if name in declared:
            raise ScheduleError(f"{at}: workload {name!r} declared twice")
        if step["kind"] not in KINDS:
            raise ScheduleError(f"{at}: kind {step['kind']!r} unknown; known: "
                                f"{', '.join(KINDS)}")
        for key in ("target", "initiator"):
            if step[key] not in hosts:
                raise ScheduleError(f"{at}: {key} {step[key]!r} is not one of the schedule's "
                                    f"hosts {hosts}")
        if step["target"] == step["initiator"]:
            raise ScheduleError(f"{at}: target and initiator are both {step['target']!r}; a "
                                "workload spans two hosts")
        check_options(step["kind"], step.get("options", {}), f"{at} options")
        declared[name] = step
        return
    if name not in declared:
        raise ScheduleError(f"{at}: workload {name!r} is not declared by an earlier workload "
                            "step")
    kind = KINDS[declared[name]["kind"]]
    if step["op"] == "workload_wait_state" and step["state"] not in kind.states:
        raise ScheduleError(f"{at}: state {step['state']!r} is not a state of "
                            f"{declared[name]['kind']}; allowed: {', '.join(kind.states)}")


def options_of(kind: str) -> dict[str, Any]:
    """The kind's options: each keyword-only parameter of its constructor, with its type."""
    cls = KINDS[kind].cls
    hints = typing.get_type_hints(cls.__init__)
    return {p.name: hints.get(p.name, Any)
            for p in inspect.signature(cls.__init__).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY}


def check_options(kind: str, options: dict, at: str) -> None:
    allowed = options_of(kind)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ScheduleError(f"{at}: unknown option(s) {unknown}; {kind} takes "
                            f"{', '.join(allowed)}")
    for key, value in options.items():
        want = allowed[key]
        types = typing.get_args(want) if typing.get_origin(want) is typing.Union else (want,)
        if want is Any or (value is None and type(None) in types):
            continue
        if isinstance(value, bool) and bool not in types or not isinstance(
                value, tuple(t for t in types if t is not type(None))):
            names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise ScheduleError(f"{at}: {key}={value!r}: {names} expected")


# ---- the runner's ops -------------------------------------------------------------------------

@dataclasses.dataclass
class Running:
    """A schedule's workload as the runner holds it: the object, what it has done, and why the
    lab refused it (then every later step of it is refused too)."""
    step: dict                   # its `workload` step
    obj: Any = None
    refused: Optional[FaultNotSupported] = None
    touched: bool = False        # a setup, export or connect ran: the teardown undoes it
    down: bool = False           # torn down by its teardown step
    io: bool = False             # the ledger writes now
    ledger: bool = False         # a ledger to read back (verify)
    lost: str = ""               # why the I/O state went (the initiator's reboot)


class WorkloadOps:
    """The Runner's workload ops; it gives lab, s, workloads, _cleanup."""

    def _workload_init(self) -> None:
        self.workloads: dict[str, Running] = {}

    def _make(self, st: dict):
        return KINDS[st["kind"]].cls(self.lab, st["target"], st["initiator"],
                                     **st.get("options", {}))

    def _workload(self, st: dict) -> Running:
        w = self.workloads[st["workload"]]
        if w.refused is not None:
            raise FaultNotSupported(st["op"], w.refused.detail)
        return w

    def _op_workload(self, st: dict) -> str:
        w = self.workloads[st["workload"]] = Running(st)
        try:
            w.obj = self._make(st)
        except FaultNotSupported as e:
            w.refused = e
            raise
        return ""

    def _op_workload_setup(self, st: dict) -> str:
        w = self._workload(st)
        w.touched = True  # a setup that fails half way is undone at the end all the same
        w.obj.setup(st.get("deadline_ns", SETUP_NS) / 1e9)
        return ""

    def _op_workload_export(self, st: dict) -> str:
        w = self._workload(st)
        w.touched = True
        w.obj.export()
        return ""

    def _op_workload_connect(self, st: dict) -> str:
        w = self._workload(st)
        w.touched = True
        w.obj.connect(st.get("deadline_ns", SETUP_NS) / 1e9)
        return ""

    def _op_workload_start_io(self, st: dict) -> str:
        w = self._workload(st)
        if w.io:
            raise Error(f"workload {st['workload']}: its I/O runs already")
        w.obj.start_io(blocks=st.get("blocks", 1024), seed=self.s.seed)
        w.io = w.ledger = True
        w.lost = ""
        return ""

    def _op_workload_wait_state(self, st: dict) -> str:
        took = self._workload(st).obj.wait_state(st["state"], st.get("within_ns", sec(60)) / 1e9)
        return f"{st['state']} after {took:.1f} s"

    def _op_workload_stop_io(self, st: dict) -> str:
        w = self._workload(st)
        if not w.io:
            raise Error(f"workload {st['workload']}: no I/O runs" + (f" ({w.lost})"
                                                                     if w.lost else ""))
        w.io = False
        got = w.obj.stop_io(st.get("deadline_ns", STOP_IO_NS) / 1e9)
        return (f"{got['written']} written, {got['errors']} errors"
                + (f" (first: {got['first_error']})" if got["errors"] else "")
                + (f", a write blocked {got['blocked_ns'] / 1e9:.1f} s" if got["blocked"]
                   else ""))

    def _op_workload_verify(self, st: dict) -> str:
        w = self._workload(st)
        if not w.ledger:
            raise Error(f"workload {st['workload']}: nothing to read back: no I/O ran"
                        + (f" since {w.lost}" if w.lost else ""))
        w.io = w.ledger = False  # verify stops a ledger still writing, and forgets it
        got = w.obj.verify()
        return (f"{got['acked']} acked, {got['matched']} matched, {got['lost_count']} lost, "
                f"{got['corrupt_count']} corrupt, {got['pending']} pending")

    def _op_workload_teardown(self, st: dict) -> str:
        w = self._workload(st)
        w.io = w.ledger = False
        deadline_s = st.get("deadline_ns", TEARDOWN_NS) / 1e9
        try:
            w.obj.teardown(deadline_s)
        except WorkloadError as e:
            if e.errno == errno.ETIMEDOUT:  # the teardown's bound: a wait that did not end
                raise Hung(f"workload {st['workload']} teardown", str(e), "teardown") from e
            raise
        finally:
            w.down = True
        return self._leftovers(w)

    def _leftovers(self, w: Running) -> str:
        """What `rdma res` still shows of the workload's ULPs, as a `workload` record per host
        (step "leftovers"): a finished teardown leaves nothing."""
        held = w.obj.leftovers()
        for host in (w.step["target"], w.step["initiator"]):
            self.lab.record(WORKLOAD, object=w.step["kind"], host=host, step="leftovers",
                            ok=not held.get(host), took_ns=0, held=held.get(host, {}))
        if held:
            raise Error("left in rdma res: " + "; ".join(
                f"{host}: " + ", ".join(f"{len(v)} {kind}" for kind, v in kinds.items())
                for host, kinds in held.items()))
        return ""

    def _workloads_rebooted(self, host: str) -> None:
        """A reboot of an initiator takes the workload's host side with it (its controller, its
        ledger): the workload is made anew, to be connected again; a target's export goes too,
        which its export step makes again."""
        for w in self.workloads.values():
            if w.obj is None or w.down or w.step["initiator"] != host:
                continue
            w.obj = self._make(w.step)
            w.io = w.ledger = False
            w.lost = f"the initiator {host} rebooted"

    def _workload_teardown(self) -> None:
        """The harness's cleanup: every workload set up and not torn down by its step is torn
        down, so the lab's next schedule finds its hosts clean."""
        for w in self.workloads.values():
            if w.obj is not None and w.touched and not w.down:
                w.down = True
                self._cleanup(w.obj.teardown, TEARDOWN_NS / 1e9)
