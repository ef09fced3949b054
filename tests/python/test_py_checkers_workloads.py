"""The workloads checker (rdmalab.checkers.workloads): hand-written histories for each rule,
valid and invalid, and the NVMe-oF scenario's histories of vm:rxe and vm:siw (their workload
records only: tests/python/nvme_workload_histories.json), which must pass."""

import copy
import json
from pathlib import Path

from rdmalab import checkers
from rdmalab.checkers import Context
from rdmalab.checkers import workloads as w
from rdmalab.labs.engine import model_lab

S = w.S
TOL = Context(tolerance_ns=S // 2)   # an agent lab's tolerance
EXACT = Context()
REAL = json.loads((Path(__file__).resolve().parent / "nvme_workload_histories.json").read_text())


class H(list):
    """A workload history under construction; times in seconds."""

    def add(self, kind, host, t, obj="nvme", **data):
        self.append({"seq": len(self), "t_ns": int(t * S), "host": host, "object": obj,
                     "kind": kind, "data": data})
        return self

    def step(self, host, step, t, took=0.0, ok=True, obj="nvme", **data):
        return self.add("workload", host, t, obj, step=step, ok=ok, took_ns=int(took * S),
                        **data)

    def state(self, t, state, unit="nvme0", obj="nvme", host="b"):
        return self.add("ulp_state", host, t, obj, unit=unit, state=state)

    def io_error(self, t, obj="nvme", host="b"):
        return self.add("io", host, t, obj, op="write", phase="errors", ok=10, errors=1,
                        error="EIO: Input/output error")

    def verify(self, t, lost=(), corrupt=(), pending=0):
        return self.add("io_verify", "b", t, blocks=64, acked=40, matched=40 - len(lost),
                        lost=list(lost), lost_count=len(lost), corrupt=list(corrupt),
                        corrupt_count=len(corrupt), pending=pending)


def nvme(fast=None, ctrl_loss=600, delay=2):
    """Exported at 1 s, connected (live) at 2 s with these timeouts."""
    return H().step("a", "target_up", 1, took=1).state(2, "live").step(
        "b", "connect", 2.1, took=1, keep_alive_tmo=5, reconnect_delay=delay,
        ctrl_loss_tmo=ctrl_loss, fast_io_fail_tmo=fast)


def outage(h, t=10, connecting_after=1):
    """The target lost at t: resetting, then connecting."""
    return h.state(t, "resetting").state(t + connecting_after, "connecting")


def texts(r):
    return " | ".join(str(p) for p in r.problems)


def assert_invalid(r, *words):
    assert r.verdict == "invalid", (r.verdict, r.reason)
    for word in words:
        assert word in texts(r), texts(r)


def assert_valid(r, checked=None):
    assert r.valid, (r.verdict, texts(r), r.reason)
    if checked is not None:
        assert r.checked == checked, r.checked


# ---------------------------------------------------------------- nothing to check

def test_a_history_without_workloads_is_valid_with_nothing_checked():
    other = [{"seq": 0, "t_ns": 0, "host": "a", "object": "qp:5", "kind": "post",
              "data": {"wr_id": 1}}]
    for h in ([], other):
        assert_valid(w.check(h, EXACT), checked=0)
    assert checkers.names()[-1] == "workloads"
    assert [r.checker for r in checkers.check_all(other, EXACT)][-1] == "workloads"


# ---------------------------------------------------------------- safety

def test_a_clean_read_back_is_valid_pending_blocks_too():
    assert_valid(w.check(nvme().verify(30, pending=3), EXACT), checked=1)


def test_a_lost_or_corrupt_block_is_invalid_naming_it():
    r = w.check(nvme().verify(30, lost=[4, 9], corrupt=[7]), EXACT)
    assert_invalid(r, "at 30.00 s of", "2 acknowledged block(s) lost [4, 9], 1 corrupt [7]",
                   "(records 3)")
    bare = nvme().add("io_verify", "b", 30, blocks=64)
    assert_invalid(w.check(bare, EXACT), "has no lost_count or corrupt_count")


# ---------------------------------------------------------------- I/O errors

def test_an_error_while_reconnecting_with_fast_io_fail_off_is_invalid():
    h = outage(nvme()).io_error(20)
    r = w.check(h, TOL)
    assert_invalid(r, "I/O error at 20.00 s (EIO", "nvme0 connecting since 11.00 s",
                   "fast_io_fail_tmo off (counted from connecting)", "ctrl_loss_tmo 600 s",
                   "no teardown begun", "(records 5, 2, 4)")


def test_fast_io_fail_counts_from_connecting_not_from_leaving_live():
    # nvme_failfast_work starts at RESETTING -> CONNECTING (core.c)
    h = outage(nvme(fast=5), t=10, connecting_after=4)
    assert_invalid(w.check(copy.deepcopy(h).io_error(16), EXACT), "fast_io_fail_tmo 5 s")
    assert_valid(w.check(copy.deepcopy(h).io_error(19), EXACT), checked=1)
    # stuck in resetting: the failfast clock never started
    stuck = nvme(fast=5).state(10, "resetting").io_error(30)
    assert_invalid(w.check(stuck, EXACT), "nvme0 resetting since 10.00 s")


def test_the_tolerance_applies_to_the_timeout():
    h = outage(nvme(fast=5)).io_error(15.7)   # connecting at 11: allowed from 16
    assert_invalid(w.check(h, EXACT), "I/O error at 15.70 s")
    assert_valid(w.check(h, TOL), checked=1)


def test_an_error_once_ctrl_loss_deleted_the_controller_is_valid():
    h = outage(nvme(ctrl_loss=20)).state(31.5, "deleting").io_error(31.6)
    assert_valid(w.check(h, EXACT), checked=1)
    early = outage(nvme(ctrl_loss=20)).state(15, "deleting").io_error(15.1)
    assert_invalid(w.check(early, EXACT), "nvme0 deleting since 15.00 s",
                   "ctrl_loss_tmo 20 s (counted from connecting)")


def test_an_error_once_the_unit_is_gone_or_the_scenario_tore_it_down_is_valid():
    gone = outage(nvme()).state(12, "gone").io_error(12.1)
    assert_valid(w.check(gone, EXACT), checked=1)
    # the disconnect is recorded when it ends: it began at 15 - 6 = 9
    down = outage(nvme()).io_error(10.5).step("b", "disconnect", 15, took=6)
    assert_valid(w.check(down, EXACT), checked=2)


def test_a_target_removed_and_exported_again_is_a_fault_not_a_teardown():
    # the target's removal began at 9.5; exported again at 30: from then the timeouts govern
    h = nvme().step("a", "target_down", 10, took=0.5)
    outage(h, t=10.2).io_error(12).step("a", "target_up", 30, took=1).io_error(31)
    r = w.check(h, EXACT)
    assert_invalid(r, "I/O error at 31.00 s")
    assert "I/O error at 12.00 s" not in texts(r)


def test_an_error_while_live_is_invalid():
    assert_invalid(w.check(nvme().io_error(5), EXACT), "nvme0 live since 2.00 s")


def test_an_error_before_any_connect_or_of_an_unknown_kind_is_unknown():
    r = w.check(H().state(2, "live").io_error(5), EXACT)
    assert r.verdict == "unknown" and "no connect step before it" in r.reason, r.reason
    r = w.check(H().io_error(5, obj="fc"), EXACT)
    assert r.verdict == "unknown" and "workload kind 'fc'" in r.reason, r.reason


def test_iser_errors_wait_for_the_replacement_timeout():
    h = H().step("a", "target_up", 1, took=1, obj="iser").state(
        2, "LOGGED_IN", unit="session1", obj="iser").step(
        "b", "login", 2.1, took=1, obj="iser", replacement_timeout=5).state(
        10, "FAILED", unit="session1", obj="iser")
    assert_valid(w.check(copy.deepcopy(h).io_error(15.5, obj="iser"), EXACT), checked=1)
    assert_invalid(w.check(copy.deepcopy(h).io_error(12, obj="iser"), EXACT),
                   "session1 FAILED since 10.00 s",
                   "replacement_timeout 5 s (counted from FAILED)")


# ---------------------------------------------------------------- liveness

def reexported(h, t=40, took=1):
    return h.step("a", "target_up", t, took=took)


def test_live_within_the_bound_after_the_export_is_valid():
    h = reexported(outage(nvme())).state(44, "live")
    assert_valid(w.check(h, TOL), checked=1)


def test_live_past_the_bound_is_invalid_naming_the_times():
    # bound: reconnect_delay 2 + 60 s + 0.5 s after the export's end at 40 s
    h = reexported(outage(nvme())).state(103, "live")
    r = w.check(h, TOL)
    assert_invalid(r, "nvme0 not live at the export that ended at 40.00 s",
                   "live only at 103.00 s, 63.00 s after it", "bound 62.50 s",
                   "reconnect_delay 2 s + 60 s to connect + 0.50 s tolerance", "(records 5, 6)")


def test_never_live_again_is_invalid_once_the_history_passes_the_deadline():
    h = reexported(outage(nvme())).add("io", "b", 200, phase="progress", ok=0, errors=0)
    r = w.check(h, TOL)
    assert_invalid(r, "still connecting (since 11.00 s) at the deadline 102.50 s",
                   "the history ends at 200.00 s")
    short = reexported(outage(nvme()))
    assert_valid(w.check(short, TOL), checked=0)  # it may yet come back


def test_a_teardown_before_the_deadline_excuses_a_unit_not_back():
    h = reexported(outage(nvme())).state(69, "gone").step("b", "disconnect", 70, took=5)
    h.step("a", "target_down", 200, took=0.1)
    assert_valid(w.check(h, TOL))


def test_a_removal_once_ctrl_loss_ran_out_is_valid_before_it_invalid():
    h = reexported(outage(nvme(ctrl_loss=30))).state(41.5, "deleting").state(42, "gone")
    assert_valid(w.check(h, TOL))
    early = reexported(outage(nvme())).state(41.5, "deleting").state(42, "gone")
    assert_invalid(w.check(early, TOL), "removed (deleting) at 41.50 s before ctrl_loss_tmo")


def test_only_units_out_of_live_at_the_export_are_judged():
    assert_valid(w.check(reexported(nvme()), TOL), checked=0)
    being_removed = reexported(nvme().state(10, "deleting")).add("io", "b", 200, phase="progress")
    assert_valid(w.check(being_removed, TOL), checked=0)


def test_an_unset_reconnect_delay_is_the_kernels_default():
    h = nvme(delay=None)
    outage(h)
    reexported(h).state(109, "live")     # 10 s default + 60 s: due by 110.5 s
    assert_valid(w.check(h, TOL), checked=1)


# ---------------------------------------------------------------- teardown

def test_teardown_steps_must_succeed_within_the_bound():
    h = nvme().step("b", "disconnect", 10, took=0.4).step("a", "target_down", 11, took=0.1)
    assert_valid(w.check(h, EXACT), checked=2)
    slow = nvme().step("b", "disconnect", 80, took=61)
    assert_invalid(w.check(slow, EXACT), "disconnect that began at 19.00 s took 61.00 s "
                   f"(bound {w.TEARDOWN_S} s)")
    failed = nvme().step("a", "target_down", 10, took=0.1, ok=False, error="rmdir: EBUSY")
    assert_invalid(w.check(failed, EXACT), "target_down that began at 9.90 s failed",
                   "rmdir: EBUSY")
    logout = H().step("b", "logout", 10, took=70, obj="iser")
    assert_invalid(w.check(logout, EXACT), "iser: logout")


# ---------------------------------------------------------------- the NVMe-oF scenario

def test_the_nvme_scenarios_histories_pass():
    for column, h in REAL.items():
        r = w.check(h, TOL)
        assert_valid(r, checked=4)   # a read-back, a return, a disconnect, a target_down
        assert [x.checker for x in checkers.check_all(h, TOL) if x.verdict == "invalid"] \
            == [], column


def test_a_real_history_with_an_error_while_reconnecting_is_invalid():
    h = copy.deepcopy(REAL["vm-rxe"])
    connecting = next(r for r in h if r["data"].get("state") == "connecting")
    h.append({**connecting, "seq": 9999, "kind": "io", "t_ns": connecting["t_ns"] + S,
              "data": {"op": "write", "phase": "errors", "ok": 0, "errors": 1,
                       "error": "EIO"}})
    assert_invalid(w.check(h, TOL), "nvme0 connecting since 21.78 s",
                   "fast_io_fail_tmo off")


def test_context_of_carries_the_labs_tolerance():
    lab = model_lab(seed=1)
    try:
        assert checkers.context_of(lab).tolerance_ns == lab.tolerance_ns == 0
    finally:
        lab.shutdown()
