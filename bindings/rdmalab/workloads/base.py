"""What every workload's controller side shares (Jepsen's client beside its nemesis): the two
hosts it spans, its host-side module run through Lab.run_on, failures as WorkloadError, and
waits on the state the kernel reports."""

from __future__ import annotations

import time
from typing import Optional

from ..errors import FaultNotSupported, WorkloadError
from ..protocol import KERNEL_ULP

HOST = "rdmalab.workloads.host"  # what every workload's host side shares
STEP_DEADLINE_S = 120.0  # a host step (a modprobe, a connect) on a TCG guest of a loaded machine


class Workload:
    """A target on one host, an initiator on another. Subclasses name `kind` (the history's
    object) and `module` (their host side)."""

    kind = ""
    module = ""

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

    def one_kernel(self) -> bool:
        """Whether target and initiator are network namespaces of one kernel (the netns lab)."""
        ids = {self.on(h, "boot_id", module=HOST)["boot_id"]
               for h in (self.target, self.initiator)}
        return len(ids) == 1

    def record(self, kind: str, host: Optional[str] = None, **data) -> int:
        return self.lab.record(kind, object=self.kind, host=host or "", **data)
