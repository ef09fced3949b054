"""What every workload's host side shares (it runs in a host's agent, beside the agent's verbs
lab, so its records land in that host's history): a step recorded with its outcome, sysfs and
configfs attributes, modprobe, a command with a deadline, and a watcher that records each
change of a sysfs state file."""

from __future__ import annotations

import contextlib
import errno as _errno
import glob
import json
import os
import subprocess
import threading
import time
from typing import Callable, Optional

from . import records

POLL_S = 0.02  # how often a watcher reads its state file (one read: cheap even in a TCG guest)


class StepFailed(Exception):
    """A host step failed: .step, .errno (0 where none applies), .detail (what was said)."""

    def __init__(self, step: str, err: int, detail: str):
        super().__init__(f"{step}: {_errno.errorcode.get(err, err) if err else 'failed'}: "
                         f"{detail}")
        self.step, self.errno, self.detail = step, err, detail


def host_name(lab) -> str:
    """The one host of an agent's verbs lab (its name in the scenario)."""
    return next(iter(lab.hosts))


@contextlib.contextmanager
def step(lab, workload: str, name: str, **data):
    """Records `workload` step name with its outcome and duration; a StepFailed or OSError
    inside is recorded and raised again."""
    t0 = time.monotonic_ns()
    try:
        yield data
    except (StepFailed, OSError) as e:
        err = e.errno if isinstance(e.errno, int) else 0
        detail = f"{e.step}: {e.detail}" if isinstance(e, StepFailed) else str(e)
        lab.record(records.WORKLOAD, object=workload, host=host_name(lab), step=name, ok=False,
                   took_ns=time.monotonic_ns() - t0, error=detail, errno=err, **data)
        raise
    lab.record(records.WORKLOAD, object=workload, host=host_name(lab), step=name, ok=True,
               took_ns=time.monotonic_ns() - t0, **data)


def write_attr(path: str, value: str) -> None:
    """Writes a sysfs or configfs attribute (one write, as `echo -n` does)."""
    try:  # one write(2): a buffered file retries a refused write at its close
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)
    except OSError as e:
        raise StepFailed(f"write {path}", e.errno or 0, f"{value!r}: {e.strerror}") from None


def read_attr(path: str) -> Optional[str]:
    """A sysfs attribute's text, stripped; None when it is not there (the unit went)."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def run(argv: list[str], deadline_s: float, what: str = "") -> str:
    """Runs a command; its stdout. A failure or the deadline raises StepFailed naming it."""
    what = what or argv[0]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=deadline_s)
    except subprocess.TimeoutExpired:
        raise StepFailed(what, _errno.ETIMEDOUT, f"{' '.join(argv)} still running after "
                         f"{deadline_s} s") from None
    except OSError as e:
        raise StepFailed(what, e.errno or 0, f"{argv[0]}: {e.strerror}") from None
    if p.returncode != 0:
        said = (p.stderr or p.stdout).strip()[-600:]
        raise StepFailed(what, 0, f"{' '.join(argv)} exited {p.returncode}: {said}")
    return p.stdout


def modprobe(*modules: str, deadline_s: float = 60.0) -> None:
    for m in modules:
        run(["modprobe", m], deadline_s, f"modprobe {m}")


def configfs() -> str:
    """Where configfs is mounted (mounted first where it is not: a guest's init does not)."""
    root = "/sys/kernel/config"
    if not os.path.isdir(root):
        modprobe("configfs")
    with open("/proc/mounts") as f:
        if any(line.split()[2] == "configfs" for line in f if len(line.split()) > 2):
            return root
    run(["mount", "-t", "configfs", "none", root], 30.0, "mount configfs")
    return root


_CLOSING: dict = {}  # id(lab) -> the keys set up and not yet undone (at_close, undone)


def at_close(lab, key, undo: Callable[[], object]) -> None:
    """undo() when the agent's lab closes if key is still set up then (undone(lab, key) not
    called): a scenario that failed before its teardown leaves no controller or target behind
    for the next one on the same machines. The undo's steps are recorded as any step is."""
    keys = _CLOSING.setdefault(id(lab), set())
    if key in keys:
        return
    keys.add(key)

    def close() -> None:
        if key not in _CLOSING.get(id(lab), ()):
            return
        try:
            undo()
        except Exception:  # noqa: BLE001 -- the lab closes anyway; the step's record says why
            pass
        undone(lab, key)
    lab.add_closer(close)


def undone(lab, key) -> None:
    """key was undone (its teardown ran): nothing is left for the lab's close."""
    keys = _CLOSING.get(id(lab))
    if keys is not None:
        keys.discard(key)
        if not keys:
            _CLOSING.pop(id(lab), None)


class Watcher:
    """Records every change of a state file (`ulp_state`) until stopped or the lab closes: the
    kernel's own word for the unit's state, timed on the host's clock."""

    def __init__(self, lab, workload: str, unit: str, path: str,
                 on_change: Callable[[str], None] = lambda s: None):
        self.lab, self.workload, self.unit, self.path = lab, workload, unit, path
        self.on_change = on_change
        self.state: Optional[str] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"rdmalab-watch-{unit}")
        lab.add_closer(self.stop)  # before the lab's engine stops taking records
        self._thread.start()

    def _run(self) -> None:
        host = host_name(self.lab)
        while not self._stop.is_set():
            state = read_attr(self.path)
            state = records.GONE if state is None else state
            if state != self.state:
                self.lab.record(records.ULP_STATE, object=self.workload, host=host,
                                unit=self.unit, state=state, previous=self.state or "")
                self.state = state
                self.on_change(state)
                if state == records.GONE:
                    return
            self._stop.wait(POLL_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)


def answered(fn: Callable) -> Callable:
    """A host step's answer as plain data, its failure too ({"failed": {step, errno, detail}}):
    it crosses to the controller as a copy (rdmalab.agent.remote.Agent.call_copy), where an
    exception would arrive as rpyc's rendering of it."""
    def wrapper(*args, **kw):
        try:
            return fn(*args, **kw)
        except StepFailed as e:
            return {"failed": {"step": e.step, "errno": e.errno, "detail": e.detail}}
        except OSError as e:
            return {"failed": {"step": fn.__name__, "errno": e.errno or 0,
                               "detail": str(e)}}
    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


@answered
def boot_id(lab) -> dict:
    """This kernel's boot id: two hosts with one are network namespaces of one kernel."""
    return {"boot_id": read_attr("/proc/sys/kernel/random/boot_id") or ""}


RES_KINDS = ("cm_id", "qp", "cq", "mr", "pd")


@answered
def kernel_owned(lab, owners: list[str]) -> dict:
    """What `rdma res` shows owned by these kernel ULPs (their module name: nvme_rdma,
    nvmet_rdma, ...), by kind, each entry as rdma prints it: a finished teardown leaves none.
    Kernel owners are named by `comm` ("[nvme_rdma]" or "nvme_rdma", by iproute2 version)."""
    held: dict = {}
    for kind in RES_KINDS:
        got = json.loads(run(["rdma", "-j", "res", "show", kind], 30.0,
                             f"rdma res show {kind}") or "[]")
        mine = [e for e in got if str(e.get("comm", "")).strip("[]") in owners]
        if mine:
            held[kind] = mine
    return {"held": held}


def ensure_dir(path: str) -> None:
    """mkdir of a configfs or sysfs directory that may be there already (a second export)."""
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    except OSError as e:
        raise StepFailed(f"mkdir {path}", e.errno or 0, e.strerror or "") from None


def set_attr(path: str, value: str) -> None:
    """Writes an attribute that does not hold value yet (a second export changes nothing)."""
    if read_attr(path) != value:
        write_attr(path, value)


@answered
def disk_by_serial(lab, serial: str) -> dict:
    """The disk whose serial is this (the VM lab's spare disk, kept across reboots; its
    virtio driver loaded first: no udev loads it in a guest); "" where there is none."""
    try:
        modprobe("virtio_blk")
    except StepFailed:
        pass  # not a virtio machine: its disks have their drivers
    for path in glob.glob("/sys/block/*/serial"):
        if read_attr(path) == serial:
            return {"device": "/dev/" + path.split("/")[3]}
    return {"device": ""}


@answered
def null_blk(lab, workload: str, size_mb: int) -> dict:
    """A memory-backed null_blk device (configfs nullb "rdmalab"): a RAM disk that keeps what
    is written while its host is up. Its path; the step recorded as workload's."""
    with step(lab, workload, "null_blk", size_mb=size_mb):
        # nr_devices=0: no nullb0 of the module's own; ours is made through configfs.
        run(["modprobe", "null_blk", "nr_devices=0"], 60.0, "modprobe null_blk")
        root = os.path.join(configfs(), "nullb", "rdmalab")
        ensure_dir(root)
        for attr, value in (("size", str(size_mb)), ("memory_backed", "1"),
                            ("blocksize", "4096"), ("power", "1")):
            set_attr(os.path.join(root, attr), value)
        return {"device": f"/dev/nullb{read_attr(os.path.join(root, 'index'))}"}
