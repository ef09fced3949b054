"""The workloads' parts that need no kernel ULP (rdmalab.workloads): the durability ledger
judges a read-back against what was acknowledged, the watcher records a state file's changes,
a host step records its outcome, and a lab without kernel ULPs refuses a workload by name.
The NVMe-oF workload itself runs in tests/scenarios/test_nvme_of.py on the VM lab."""

import os
import threading
import time

import pytest

from rdmalab import FaultNotSupported, model_lab
from rdmalab.workloads import NvmeOf, host, ledger, records
from workload_fakes import HostLab, UlpLab


def disk(tmp_path, blocks: int) -> str:
    """A file as the ledger's device (O_DIRECT works on this machine's ext4, not on tmpfs)."""
    path = "/var/tmp" if tmp_path.as_posix().startswith("/tmp") else str(tmp_path)
    f = os.path.join(path, f"rdmalab-ledger-{os.getpid()}-{time.monotonic_ns()}")
    with open(f, "wb") as out:
        out.truncate(blocks * ledger.BLOCK)
    return f


@pytest.fixture
def device(tmp_path):
    path = disk(tmp_path, 64)
    yield path
    os.unlink(path)


def run_ledger(lab, device, seconds=0.3):
    got = ledger.start(lab, "nvme", device, 64, 7)
    time.sleep(seconds)
    stopped = ledger.stop(lab, got["ledger"], 5.0)
    assert stopped["written"] > 0 and stopped["errors"] == 0 and not stopped["blocked"], stopped
    return got["ledger"]


def test_the_ledger_finds_every_acknowledged_write_in_place(device):
    lab = HostLab()
    result = ledger.verify(lab, run_ledger(lab, device))
    assert result["lost_count"] == 0 and result["corrupt_count"] == 0, result
    assert result["matched"] == result["acked"] > 0
    assert lab.kinds(records.IO_VERIFY) == [{"kind": "io_verify", "object": "nvme",
                                             "host": "b", "device": device, **result}]
    assert [r["step"] for r in lab.kinds(records.WORKLOAD)] == ["io_start", "io_stop"]


def test_an_older_generation_is_lost_and_a_foreign_block_corrupt(device):
    lab = HostLab()
    lid = run_ledger(lab, device)
    led = ledger._LEDGERS[lid]
    block, gen = next((b, g) for b, g in led.acked.items() if g > 1)
    with open(device, "r+b") as f:  # the block as an earlier write of this ledger left it
        f.seek(block * ledger.BLOCK)
        f.write(ledger._image(led.run, block, gen - 1))
        other = next(b for b in led.acked if b != block)
        f.seek(other * ledger.BLOCK + 100)  # the stamp intact, the pattern not
        f.write(b"\xff" * 8)
    result = ledger.verify(lab, lid)
    assert result["lost"] == [block] and result["corrupt"] == [other], result


def test_a_block_of_an_earlier_ledger_counts_as_lost_once_this_one_acked_it(device):
    lab = HostLab()
    first = ledger._LEDGERS[run_ledger(lab, device)]
    lid = run_ledger(lab, device)
    led = ledger._LEDGERS[lid]
    block = next(iter(led.acked))
    with open(device, "r+b") as f:
        f.seek(block * ledger.BLOCK)
        f.write(ledger._image(first.run, block, led.acked[block]))  # same gen, other run
    assert ledger.verify(lab, lid)["lost"] == [block]


def test_failing_writes_and_their_end_are_io_records(device, monkeypatch):
    """Writes that fail (EIO while a controller is gone) are an `io` record with phase
    "errors" at the first, and "resumed" at the first good write after them."""
    lab = HostLab()
    real, failing = os.pwrite, threading.Event()

    def pwrite(fd, data, offset):
        if failing.is_set():
            raise OSError(5, "Input/output error")
        return real(fd, data, offset)

    monkeypatch.setattr(ledger.os, "pwrite", pwrite)
    got = ledger.start(lab, "nvme", device, 64, 1)
    time.sleep(0.1)
    failing.set()
    time.sleep(0.2)
    failing.clear()
    time.sleep(0.1)
    stopped = ledger.stop(lab, got["ledger"], 5.0)
    assert stopped["errors"] > 0 and stopped["first_error"] == "EIO: Input/output error"
    phases = [r["phase"] for r in lab.kinds(records.IO)]
    assert phases[:2] == ["errors", "resumed"], phases
    errors = lab.kinds(records.IO)[0]
    assert errors["error"] == "EIO: Input/output error" and errors["ok"] > 0
    assert ledger.verify(lab, got["ledger"])["lost_count"] == 0


def test_a_device_that_cannot_be_opened_is_a_failed_answer(tmp_path):
    got = ledger.start(HostLab(), "nvme", str(tmp_path / "nosuch"), 4, 1)
    assert got["failed"]["errno"] == 2 and "nosuch" in got["failed"]["detail"], got


def test_the_watcher_records_each_change_and_the_unit_going(tmp_path):
    lab = HostLab()
    state = tmp_path / "state"
    state.write_text("live\n")
    w = host.Watcher(lab, "nvme", "nvme0", str(state))
    deadline = time.monotonic() + 5

    def states():
        return [(r["previous"], r["state"]) for r in lab.kinds(records.ULP_STATE)]

    def wait_for(n):
        while len(states()) < n and time.monotonic() < deadline:
            time.sleep(0.01)

    wait_for(1)
    state.write_text("connecting\n")
    wait_for(2)
    state.unlink()
    wait_for(3)
    w.stop()
    assert states() == [("", "live"), ("live", "connecting"), ("connecting", "gone")]
    assert lab.closers == [w.stop]


def test_a_failed_step_is_recorded_with_its_errno():
    lab = HostLab()
    with pytest.raises(host.StepFailed):
        with host.step(lab, "nvme", "target_up", nqn="n"):
            host.write_attr("/proc/nosuch/attr", "1")
    (r,) = lab.kinds(records.WORKLOAD)
    assert r["step"] == "target_up" and not r["ok"] and r["errno"] == 2 and r["nqn"] == "n"
    assert r["error"].startswith("write /proc/nosuch/attr: '1'"), r["error"]


def test_a_command_past_its_deadline_is_a_step_failure():
    with pytest.raises(host.StepFailed) as e:
        host.run(["sleep", "5"], 0.2, "sleeping")
    assert e.value.errno == 110 and "still running" in e.value.detail  # ETIMEDOUT


def test_the_model_refuses_a_workload_by_name():
    with model_lab(hosts=("a", "b")) as lab:
        with pytest.raises(FaultNotSupported) as e:
            NvmeOf(lab)
        assert "kernel_ulp" in str(e.value)
        with pytest.raises(FaultNotSupported):
            lab.run_on("a", "rdmalab.workloads.host", "host_name")


def test_nvme_on_namespaces_of_one_kernel_is_refused_with_the_reason():
    with pytest.raises(FaultNotSupported) as e:
        NvmeOf(UlpLab(one_kernel=True))
    assert "init_net" in str(e.value) and "network namespaces of one kernel" in str(e.value)
    assert NvmeOf(UlpLab()).initiator == "b"


def test_bad_workload_arguments_are_named():
    with pytest.raises(ValueError, match="both 'a'"):
        NvmeOf(UlpLab(), target="a", initiator="a")
    with pytest.raises(KeyError, match="no host 'c'"):
        NvmeOf(UlpLab(), target="a", initiator="c")
    with pytest.raises(ValueError, match="backing 'tape'"):
        NvmeOf(UlpLab(), backing="tape")


def test_what_a_failed_scenario_left_set_up_is_undone_when_the_lab_closes():
    lab, undos = HostLab(), []
    host.at_close(lab, ("target", "n"), lambda: undos.append("target_down"))
    host.at_close(lab, ("target", "n"), lambda: undos.append("twice"))  # once per key
    host.at_close(lab, ("initiator", "n"), lambda: undos.append("disconnect"))
    host.undone(lab, ("initiator", "n"))  # the scenario's own teardown ran
    for close in reversed(lab.closers):
        close()
    assert undos == ["target_down"] and len(lab.closers) == 2
