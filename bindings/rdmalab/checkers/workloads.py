"""Kernel ULP workloads (rdmalab.workloads): what the initiator was told holds, I/O errors only
where a documented timeout allows them, recovery once the target is back, teardown bounded.

The records are rdmalab.workloads.records': `workload` steps (data.step, ok, took_ns; a step
is recorded when it ends, so it began at t_ns - took_ns), `ulp_state` (data.unit, state),
`io` (data.phase) and `io_verify`. Rules, one function each (the source is on each):
- safety: every `io_verify` found lost_count == 0 and corrupt_count == 0; a block holding a
  write in flight at the fault (`pending`) may hold the old or the new data.
- io_errors: an `io` record of phase "errors" is allowed only if, at its time, the unit had
  been out of its working state for a timeout KINDS names, counted from the state the kernel
  starts that timeout's clock in; or the unit was gone; or a teardown step (TEARDOWN_STEPS)
  of the workload had begun and no export or connect had set it up again. The timeouts are
  the workload's `connect` step's data (the kernel's default where it left one unset).
- liveness: at each export after a workload's first (its target back after a reboot or a
  target_down), a unit neither working nor being removed then works again within
  reconnect_delay + CONNECT_BUDGET_S + ctx.tolerance_ns of the export's end, unless a teardown
  began or the kernel removed the unit once its give-up timeout (ctrl_loss_tmo) had run out.
  A history that ends before that deadline does not judge it (the unit may yet come back).
- teardown: every TEARDOWN_STEPS step is ok and took at most TEARDOWN_S.
Times compare within ctx.tolerance_ns (the watcher polls a state file; records of two hosts).
A history without workload records is valid with nothing checked; records of a workload kind
KINDS does not know make the timing rules unknown, naming the kind.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from ..workloads.records import GONE, IO, IO_VERIFY, ULP_STATE, WORKLOAD
from .base import INVALID, UNKNOWN, Context, Result

NAME = "workloads"
S = 1_000_000_000
# One reconnect on a TCG guest of a loaded machine: the RDMA/CM exchange and the fabric connect
# of the admin queue and every I/O queue (a few seconds on hardware, tens on TCG).
CONNECT_BUDGET_S = 60
# A teardown (nvme disconnect, an iSCSI logout, the target's configfs removal), also with the
# peer gone: the drain and the CM's DREQ timeout stay well under it.
TEARDOWN_S = 60
TEARDOWN_STEPS = frozenset({"disconnect", "logout", "target_down", "umount", "server_down",
                            "release_disk"})


@dataclasses.dataclass(frozen=True)
class Kind:
    """What the timing rules need of one workload kind: the kernel's words for its unit's
    states and which timeout (seconds, in the connect step's data) allows what."""
    live: str                 # the unit's working state
    connect: str              # the step whose data holds the timeouts
    fail_io: dict             # timeout -> the state whose entry starts its clock
    defaults: dict            # the kernel's value of a timeout left unset (None: off)
    gives_up: str = ""        # the timeout after which the kernel removes the unit
    removing: tuple = ()      # states of a unit on its way out
    reconnect_delay: str = ""  # the timeout waited before each reconnect try
    export: str = "target_up"


KINDS = {
    # nvme-connect(1); drivers/nvme/host/fabrics.c (nvmf_parse_options, NVMF_DEF_* in fabrics.h;
    # a negative value is off). fast_io_fail_tmo: core.c nvme_change_ctrl_state starts
    # nvme_failfast_work on RESETTING -> CONNECTING, which then fails queued I/O. ctrl_loss_tmo:
    # max_reconnects = ctrl_loss_tmo / reconnect_delay tries from CONNECTING, then
    # nvmf_should_reconnect is false and the controller is deleted (nvme_delete_ctrl).
    "nvme": Kind(live="live", connect="connect",
                 fail_io={"fast_io_fail_tmo": "connecting", "ctrl_loss_tmo": "connecting"},
                 defaults={"fast_io_fail_tmo": None, "ctrl_loss_tmo": 600, "reconnect_delay": 10},
                 gives_up="ctrl_loss_tmo", removing=("deleting", "deleting (no IO)"),
                 reconnect_delay="reconnect_delay"),
    # drivers/scsi/scsi_transport_iscsi.c: iscsi_block_session marks the session FAILED and
    # starts recovery_tmo (open-iscsi's node.session.timeo.replacement_timeout, 120 s in
    # iscsid.conf); session_recovery_timedout fails its I/O. iscsid keeps logging in after.
    "iser": Kind(live="LOGGED_IN", connect="login", fail_io={"replacement_timeout": "FAILED"},
                 defaults={"replacement_timeout": 120}),
    # nfs(5): a hard mount retries for ever and never fails I/O (a soft mount's EIO timing,
    # timeo x retrans, is not modelled: none allowed). NFSv4's recovery includes the server's
    # grace period (its grace_s at server_up; the kernel's default 90 s passes the budget).
    # ib_srp (Documentation/ABI/stable/sysfs-transport-srp; scsi_transport_srp.c): I/O fails
    # fast_io_fail_tmo after the remote port blocked, and the port goes at dev_loss_tmo.
    "srp": Kind(live="running", connect="login",
                fail_io={"fast_io_fail_tmo": "blocked", "dev_loss_tmo": "blocked"},
                defaults={"reconnect_delay": 10, "fast_io_fail_tmo": 15, "dev_loss_tmo": 600},
                gives_up="dev_loss_tmo", reconnect_delay="reconnect_delay"),
    "nfs": Kind(live="answering", connect="mount", fail_io={},
                defaults={"timeo": 600, "retrans": 2}, export="server_up"),
}


def _s(ns: int) -> str:
    return f"{ns / S:.2f} s"


def _began(step: dict) -> int:
    return step["t_ns"] - int(step["data"].get("took_ns") or 0)


@dataclasses.dataclass
class _Outage:
    """A unit out of its working state: its ulp_state records from leaving it on, and the one
    that brought it back (None: never)."""
    records: list
    back: Optional[dict] = None

    def covers(self, t: int, tol: int) -> bool:
        return self.records[0]["t_ns"] <= t + tol and \
            (self.back is None or self.back["t_ns"] >= t - tol)

    def entered(self, state: str) -> Optional[dict]:
        return next((r for r in self.records if r["data"]["state"] == state), None)


def _outages(timeline: list, live: str) -> list:
    out, cur = [], None
    for r in timeline:
        if r["data"]["state"] == live:
            if cur is not None:
                cur.back = r
                out.append(cur)
                cur = None
        elif cur is None:
            cur = _Outage([r])
        else:
            cur.records.append(r)
    return out + ([cur] if cur is not None else [])


class _Index:
    """The history's workload records, by workload (object) and unit."""

    def __init__(self, history: list):
        self.steps, self.io_errors, self.verifies = [], [], []
        self.units: dict = {}  # (object, host, unit) -> its ulp_state records in order
        for r in history:
            k = r["kind"]
            if k == WORKLOAD:
                self.steps.append(r)
            elif k == ULP_STATE:
                self.units.setdefault((r["object"], r["host"], r["data"].get("unit", "")),
                                      []).append(r)
            elif k == IO and r["data"].get("phase") == "errors":
                self.io_errors.append(r)
            elif k == IO_VERIFY:
                self.verifies.append(r)
        self.end_ns = max((r["t_ns"] for r in history), default=0)

    def any(self) -> bool:
        return bool(self.steps or self.units or self.io_errors or self.verifies)

    def connect(self, kind: Kind, obj: str, host: str, t: int) -> Optional[dict]:
        """The last ok connect step of obj on host before t (None: none)."""
        c = [s for s in self.steps if s["object"] == obj and s["host"] == host and s["t_ns"] <= t
             and s["data"].get("step") == kind.connect and s["data"].get("ok")]
        return c[-1] if c else None

    @staticmethod
    def timeouts(kind: Kind, connect: Optional[dict]) -> dict:
        """The connect's timeouts, the kernel's default where it left one unset (None: off)."""
        got = {}
        for name, default in kind.defaults.items():
            v = (connect or {"data": {}})["data"].get(name)
            v = default if v is None else v
            got[name] = v if v is not None and v >= 0 else None
        return got

    def teardown_begun(self, obj: str, after: int, by: int) -> Optional[dict]:
        return next((s for s in self.steps if s["object"] == obj and
                     s["data"].get("step") in TEARDOWN_STEPS and after <= _began(s) <= by),
                    None)

    def torn_down(self, kind: Kind, obj: str, since: int, t: int) -> bool:
        """Whether at t a teardown step begun after `since` had taken obj down and no export
        or connect since set it up again (a target removed and exported again is a fault the
        timeouts govern, not a teardown)."""
        for s in self.steps:
            if s["object"] != obj or s["data"].get("step") not in TEARDOWN_STEPS or \
                    not since <= _began(s) <= t:
                continue
            if not any(u["object"] == obj and u["data"].get("ok") and
                       u["data"].get("step") in (kind.export, kind.connect) and
                       _began(s) < u["t_ns"] <= t for u in self.steps):
                return True
        return False

    def units_of(self, obj: str, host: Optional[str] = None) -> list:
        return [(key, tl) for key, tl in self.units.items()
                if key[0] == obj and (host is None or key[1] == host)]


def safety(ix: _Index, res: Result) -> None:
    """A write that returned under O_DSYNC is durable (open(2): by then the data, and what is
    needed to read it back, went to the hardware); an NVMe write completed with Force Unit
    Access, or followed by a completed Flush, is in non-volatile media (NVMe base
    specification: the Flush command, FUA). So no acknowledged block may read back older
    (lost) or as nothing the ledger wrote (corrupt)."""
    for r in ix.verifies:
        res.checked += 1
        d = r["data"]
        lost, corrupt = d.get("lost_count"), d.get("corrupt_count")
        if lost is None or corrupt is None:
            res.fail(f"io_verify at {_s(r['t_ns'])} has no lost_count or corrupt_count",
                     (r["seq"],), r["host"], r["object"])
        elif lost or corrupt:
            res.fail(f"read-back at {_s(r['t_ns'])} of {d.get('device', '?')}: {lost} "
                     f"acknowledged block(s) lost {d.get('lost', [])}, {corrupt} corrupt "
                     f"{d.get('corrupt', [])} (of {d.get('acked', '?')} acknowledged)",
                     (r["seq"],), r["host"], r["object"])


def _error_allowed(ix: _Index, kind: Kind, connect: dict, r: dict, tol: int) -> bool:
    """Whether a documented timeout, the unit's going or a teardown allows an I/O error at r
    (only what happened since the connect whose timeouts apply counts)."""
    t, obj, since = r["t_ns"], r["object"], _began(connect)
    if ix.torn_down(kind, obj, since, t + tol):
        return True
    tmo = ix.timeouts(kind, connect)
    for _, tl in ix.units_of(obj, r["host"]):
        if any(x["data"]["state"] == GONE and since <= x["t_ns"] <= t + tol for x in tl):
            return True
        for name, state in kind.fail_io.items():
            if tmo.get(name) is not None and _expired(tl, kind, state, tmo[name], t, tol):
                return True
    return False


def _expired(tl: list, kind: Kind, state: str, tmo_s: int, t: int, tol: int) -> bool:
    """Whether at t the unit had been out of its working state since it entered `state` at
    least tmo_s seconds before."""
    for out in _outages(tl, kind.live):
        start = out.entered(state)
        if out.covers(t, tol) and start is not None and start["t_ns"] + tmo_s * S <= t + tol:
            return True
    return False


def _unit_story(ix: _Index, obj: str, host: str, t: int) -> tuple[str, list]:
    """Each unit's state at t and since when (the records that say it)."""
    said, seqs = [], []
    for (_, _, unit), tl in ix.units_of(obj, host):
        before = [x for x in tl if x["t_ns"] <= t]
        if before:
            x = before[-1]
            said.append(f"{unit} {x['data']['state']} since {_s(x['t_ns'])}")
            seqs.append(x["seq"])
    return ("; ".join(said) or "no unit state recorded"), seqs


def io_errors(ix: _Index, ctx: Context, res: Result, unknown: list) -> None:
    """nvme-connect(1): with fast_io_fail_tmo off, I/O waits for the controller until
    ctrl_loss_tmo deletes it (fabrics.c nvmf_fail_nonready_command requeues it while the
    controller is not live and its failfast has not expired: core.c nvme_failfast_work).
    scsi_transport_iscsi.c: I/O of a FAILED session waits for replacement_timeout. An error
    before that is the kernel's, not the timeouts'."""
    for r in ix.io_errors:
        kind = KINDS.get(r["object"])
        if kind is None:
            unknown.append(f"no timing rules for workload kind {r['object']!r}")
            continue
        connect = ix.connect(kind, r["object"], r["host"], r["t_ns"])
        if connect is None:
            unknown.append(f"io error record {r['seq']}: no {kind.connect} step before it "
                           "(its timeouts unknown)")
            continue
        res.checked += 1
        if _error_allowed(ix, kind, connect, r, ctx.tolerance_ns):
            continue
        story, seqs = _unit_story(ix, r["object"], r["host"], r["t_ns"])
        tmo = ix.timeouts(kind, connect)
        limits = ", ".join(f"{n} {'off' if tmo[n] is None else f'{tmo[n]} s'} (counted from "
                           f"{kind.fail_io[n]})" for n in kind.fail_io)
        res.fail(f"I/O error at {_s(r['t_ns'])} ({r['data'].get('error', '')}) that no "
                 f"timeout allows: {story}; {limits}; no teardown begun",
                 (r["seq"], connect["seq"], *seqs), r["host"], r["object"])


def _removal_allowed(kind: Kind, tmo: dict, tl: list, gone: dict, tol: int) -> bool:
    """Whether the unit's removal at `gone` came once its give-up timeout had run out."""
    if not kind.gives_up or tmo.get(kind.gives_up) is None:
        return False
    return _expired(tl, kind, kind.fail_io[kind.gives_up], tmo[kind.gives_up], gone["t_ns"],
                    tol)


def _judge_return(ix: _Index, kind: Kind, export: dict, key: tuple, tl: list, tol: int,
                  res: Result) -> None:
    """One unit not working at an export: working again by the deadline, or excused."""
    obj, host, unit = key
    began = _began(export)
    tmo = ix.timeouts(kind, ix.connect(kind, obj, host, began))
    delay = tmo.get(kind.reconnect_delay) or 0
    bound = (delay + CONNECT_BUDGET_S) * S + tol
    deadline = export["t_ns"] + bound
    after = [x for x in tl if x["t_ns"] > began]
    back = next((x for x in after if x["data"]["state"] == kind.live), None)
    gone = next((x for x in after if x["t_ns"] <= deadline and
                 (x["data"]["state"] == GONE or x["data"]["state"] in kind.removing)), None)
    down = ix.teardown_begun(obj, began, deadline)
    if down is not None and (back is None or back["t_ns"] > _began(down)):
        return  # torn down on purpose before it had to be back
    if back is None and gone is None and ix.end_ns < deadline:
        return  # the history ended before the deadline: it may yet come back
    if back is None and gone is not None and _removal_allowed(kind, tmo, tl, gone, tol):
        return  # the kernel gave up as documented (ctrl_loss_tmo)
    res.checked += 1
    if back is not None and back["t_ns"] <= deadline:
        return
    what = f"{unit} not {kind.live} at the export that ended at {_s(export['t_ns'])}"
    limit = f"bound {_s(bound)}: {kind.reconnect_delay or 'no delay'} {delay} s + " \
            f"{CONNECT_BUDGET_S} s to connect + {_s(tol)} tolerance"
    if gone is not None and (back is None or gone["t_ns"] < back["t_ns"]):
        res.fail(f"{what}: removed ({gone['data']['state']}) at {_s(gone['t_ns'])} before "
                 f"{kind.gives_up or 'any timeout'} allowed it ({limit})",
                 (export["seq"], gone["seq"]), host, obj)
    elif back is not None:
        res.fail(f"{what}: {kind.live} only at {_s(back['t_ns'])}, "
                 f"{_s(back['t_ns'] - export['t_ns'])} after it ({limit})",
                 (export["seq"], back["seq"]), host, obj)
    else:
        last = [x for x in tl if x["t_ns"] <= deadline][-1]
        res.fail(f"{what}: still {last['data']['state']} (since {_s(last['t_ns'])}) at the "
                 f"deadline {_s(deadline)}; the history ends at {_s(ix.end_ns)} ({limit})",
                 (export["seq"], last["seq"]), host, obj)


def liveness(ix: _Index, ctx: Context, res: Result, unknown: list) -> None:
    """nvme-connect(1): a controller that lost its target tries to reconnect every
    reconnect_delay until ctrl_loss_tmo (fabrics.c nvmf_should_reconnect, rdma.c
    nvme_rdma_reconnect_or_remove); iscsid logs in again (iscsiadm(8)). So once the target
    is back, one wait and one connect bring the unit back."""
    first: dict = {}
    for e in ix.steps:
        kind = KINDS.get(e["object"])
        if kind is None:
            unknown.append(f"no timing rules for workload kind {e['object']!r}")
            continue
        if e["data"].get("step") != kind.export or not e["data"].get("ok"):
            continue
        if first.setdefault(e["object"], e["seq"]) == e["seq"]:
            continue  # the first export: nothing to come back to
        for key, tl in ix.units_of(e["object"]):
            before = [x for x in tl if x["t_ns"] <= _began(e)]
            if before and before[-1]["data"]["state"] not in (kind.live, GONE, *kind.removing):
                _judge_return(ix, kind, e, key, tl, ctx.tolerance_ns, res)


def teardown(ix: _Index, res: Result) -> None:
    """`nvme disconnect` returns once the kernel deleted the controller (core.c
    nvme_delete_ctrl_sync: its queues drained, ib_drain_qp), `iscsiadm --logout` once the
    session is gone, rmdir of a configfs item once the target dropped it: each must end, also
    with the peer gone (issue 29's teardown rule; nvme-cli 1365 is one that did not)."""
    for s in ix.steps:
        d = s["data"]
        if d.get("step") not in TEARDOWN_STEPS:
            continue
        res.checked += 1
        took = int(d.get("took_ns") or 0)
        if not d.get("ok"):
            res.fail(f"{d['step']} that began at {_s(_began(s))} failed after {_s(took)}: "
                     f"{d.get('error', '?')}", (s["seq"],), s["host"], s["object"])
        elif took > TEARDOWN_S * S:
            res.fail(f"{d['step']} that began at {_s(_began(s))} took {_s(took)} (bound "
                     f"{TEARDOWN_S} s)", (s["seq"],), s["host"], s["object"])


def check(history: list, ctx: Context) -> Result:
    res = Result(NAME)
    ix = _Index(history)
    if not ix.any():
        return res  # no workload ran: nothing to judge
    unknown: list = []
    safety(ix, res)
    io_errors(ix, ctx, res, unknown)
    liveness(ix, ctx, res, unknown)
    teardown(ix, res)
    if unknown and res.verdict != INVALID:
        res.verdict, res.reason = UNKNOWN, "; ".join(dict.fromkeys(unknown))
    return res
