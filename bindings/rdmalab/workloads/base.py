"""What every workload's controller side shares (Jepsen's client beside its nemesis): the two
hosts it spans, its host-side module run through Lab.run_on, failures as WorkloadError, the
target's backing device, waits on the state the kernel reports, the durability ledger's I/O
and what `rdma res` still holds afterwards."""

from __future__ import annotations

import time
from typing import Optional

from ..errors import FaultNotSupported, WorkloadError
from ..machines.machine import SPARE_DISK_SERIAL
from ..protocol import KERNEL_ULP

HOST = "rdmalab.workloads.host"  # what every workload's host side shares
LEDGER = "rdmalab.workloads.ledger"  # the durability ledger, on the initiator
STEP_DEADLINE_S = 120.0  # a host step (a modprobe, a connect) on a TCG guest of a loaded machine


class Workload:
    """A target on one host, an initiator on another. Subclasses name `kind` (the history's
    object), `module` (their host side) and `owners` (the kernel modules whose resources
    `rdma res` shows on each side), answer state() and unit_name(), and set `device` (the
    initiator's block device the ledger writes) once connected."""

    kind = ""
    module = ""
    owners: dict = {"target": [], "initiator": []}

    def __init__(self, lab, target: str, initiator: str):
        if not lab.has(KERNEL_ULP):
            raise FaultNotSupported(self.kind, f"{lab.description} runs no kernel whose ULPs a "
                                    "workload drives (capability kernel_ulp)")
        if target == initiator:
            raise ValueError(f"{self.kind}: target and initiator are both {target!r}; a "
                             "workload spans two hosts")
        for h in (target, initiator):
            lab.host(h)  # KeyError naming the lab's hosts
        self.lab, self.target, self.initiator = lab, target, initiator
        self.device = ""
        self._ledger: Optional[int] = None       # the ledger writing now
        self._last_ledger: Optional[int] = None  # the one verify reads back

    def on(self, host: str, function: str, *args, module: str = "",
           deadline_s: float = STEP_DEADLINE_S) -> dict:
        """function of the host side (module, default this workload's) on host; its failure
        raised as WorkloadError."""
        got = self.lab.run_on(host, module or self.module, function, *args,
                              deadline_s=deadline_s)
        failed = got.get("failed") if isinstance(got, dict) else None
        if failed:
            raise WorkloadError(failed["step"], host, failed["errno"], failed["detail"])
        return got

    def wait_for(self, pred, timeout_s: float, what: str, poll_s: float = 0.1) -> float:
        """Waits until pred() (each call a round trip to a host): the seconds it took. Past
        timeout_s the lab's Hung with its diagnostic dump."""
        t0, last = time.monotonic(), [0.0, False]

        def throttled() -> bool:  # the lab polls every few ms; a host is asked every poll_s
            if time.monotonic() - last[0] >= poll_s:
                last[:] = [time.monotonic(), bool(pred())]
            return last[1]

        self.lab.wait_until(throttled, int(timeout_s * 1e9), what)
        return time.monotonic() - t0

    # -- the target's backing device
    def spare_disk(self) -> str:
        """The target's spare disk (serial SPARE_DISK_SERIAL); FaultNotSupported without one."""
        dev = self.on(self.target, "disk_by_serial", SPARE_DISK_SERIAL, module=HOST)["device"]
        if not dev:
            raise FaultNotSupported(f"{self.kind} backing disk", f"{self.target} has no spare "
                                    f"disk (a block device with serial {SPARE_DISK_SERIAL!r}; "
                                    "the VM lab gives every guest one)")
        return dev

    def backing_device(self, backing: str, size_mb: int) -> str:
        """"disk": the spare disk; "null_blk": a memory-backed null_blk of size_mb."""
        if backing == "null_blk":
            return self.on(self.target, "null_blk", self.kind, size_mb, module=HOST)["device"]
        return self.spare_disk()

    # -- state
    def state(self) -> str:
        raise NotImplementedError

    def unit_name(self) -> str:
        """The unit whose state state() says, as waits name it ("nvme0")."""
        raise NotImplementedError

    def wait_state(self, state: str, timeout_s: float) -> float:
        """Seconds until the unit is in state; Hung past timeout_s."""
        return self.wait_for(lambda: self.state() == state, timeout_s,
                             f"{self.unit_name()} on {self.initiator} {state}")

    # -- I/O: the durability ledger on the initiator
    def io_path(self, blocks: int) -> str:
        """What the ledger writes: the initiator's block device (a file, where the unit is a
        file system)."""
        return self.device

    def start_io(self, blocks: int = 1024, seed: int = 1) -> None:
        """The durability ledger writes blocks of io_path() from now on."""
        self._ledger = self._last_ledger = self.on(
            self.initiator, "start", self.kind, self.io_path(blocks), blocks, seed,
            module=LEDGER)["ledger"]

    def stop_io(self, deadline_s: float = 30.0) -> dict:
        """Stops the ledger's writes: written (acknowledged), errors, first_error, and blocked
        (a write still in the kernel after deadline_s, for blocked_ns)."""
        ledger, self._ledger = self._ledger, None
        return self.on(self.initiator, "stop", ledger, deadline_s, module=LEDGER,
                       deadline_s=deadline_s + 30)

    def verify(self) -> dict:
        """Reads the ledger's blocks back, from the unit as it is now (a unit connected again
        may have a new device): the io_verify record's fields (records.py)."""
        if self._last_ledger is None:
            raise ValueError(f"{self.kind} verify: no I/O was started (start_io)")
        if self._ledger is not None:
            self.stop_io()
        return self.on(self.initiator, "verify", self._last_ledger, self.verify_path(),
                       module=LEDGER)

    def verify_path(self) -> str:
        return self.device

    def leftovers(self) -> dict:
        """host -> what `rdma res` still shows of the workload's kernel modules on each side
        (owners), by kind; empty once both are torn down."""
        held = {}
        for host, side in ((self.target, "target"), (self.initiator, "initiator")):
            got = self.on(host, "kernel_owned", self.owners[side], module=HOST)["held"]
            if got:
                held[host] = got
        return held

    def one_kernel(self) -> bool:
        """Whether target and initiator are network namespaces of one kernel (the netns lab)."""
        ids = {self.on(h, "boot_id", module=HOST)["boot_id"]
               for h in (self.target, self.initiator)}
        return len(ids) == 1

    def record(self, kind: str, host: Optional[str] = None, **data) -> int:
        return self.lab.record(kind, object=self.kind, host=host or "", **data)
