"""NVMe over Fabrics as a workload: nvmet-rdma on the target host, nvme-rdma on the initiator
(rdmalab.workloads.nvme_host does the host side).

    nvme = NvmeOf(lab, target="a", initiator="b", keep_alive_tmo=5, ctrl_loss_tmo=30)
    nvme.setup()                 # target exported, initiator connected, controller live
    nvme.start_io()              # the durability ledger writes (rdmalab.workloads.ledger)
    ...                          # faults
    nvme.wait_state("live", 60)  # recovered
    nvme.stop_io(); assert nvme.verify()["lost_count"] == 0
    nvme.teardown()              # disconnect, target removed

Timeouts are the kernel's fabrics options (drivers/nvme/host/fabrics.c, nvme-connect(1)), in
seconds; None leaves the kernel's default (keep-alive 5 s on 6.1, reconnect-delay 10 s,
ctrl-loss 600 s, fast_io_fail off)."""

from __future__ import annotations

from typing import Optional

from ..errors import FaultNotSupported
from .base import Workload

MODULE = "rdmalab.workloads.nvme_host"
NVMF_PORT = 4420  # the IANA port of NVMe over Fabrics (RDMA/CM's service id)


class NvmeOf(Workload):
    kind = "nvme"
    module = MODULE
    # A QP made through rdma_create_qp is the rdma_cm's in `rdma res`, not the ULP's.
    owners = {"target": ["nvmet_rdma", "rdma_cm"], "initiator": ["nvme_rdma", "rdma_cm"]}

    def __init__(self, lab, target: str = "a", initiator: str = "b", *,
                 nqn: str = "nqn.2026-11.io.rdmalab:nvme", port: int = NVMF_PORT,
                 backing: str = "null_blk", size_mb: int = 64,
                 keep_alive_tmo: Optional[int] = 5, reconnect_delay: Optional[int] = 2,
                 ctrl_loss_tmo: Optional[int] = 60, fast_io_fail_tmo: Optional[int] = None):
        super().__init__(lab, target, initiator)
        if self.one_kernel():
            raise FaultNotSupported("nvme", f"{target} and {initiator} are network namespaces "
                                    "of one kernel: nvmet-rdma and nvme-rdma make their RDMA/CM "
                                    "ids in the initial namespace (rdma_create_id(&init_net, "
                                    "...), drivers/nvme/target/rdma.c and host/rdma.c), where "
                                    "the hosts' addresses are not")
        if backing not in ("null_blk", "disk"):
            raise ValueError(f"nvme backing {backing!r}: null_blk (a RAM disk, gone with a "
                             "reboot of the target) or disk (the host's spare disk)")
        self.nqn, self.port, self.backing, self.size_mb = nqn, port, backing, size_mb
        self.timeouts = {"keep_alive_tmo": keep_alive_tmo, "reconnect_delay": reconnect_delay,
                         "ctrl_loss_tmo": ctrl_loss_tmo, "fast_io_fail_tmo": fast_io_fail_tmo}
        self.ctrl = self.device = ""

    # -- set up and tear down
    def setup(self, deadline_s: float = 120.0) -> None:
        """The target exports its backing device; the initiator connects; its controller is
        live and its namespace's block device there."""
        self.export()
        self.connect(deadline_s)

    def export(self) -> None:
        dev = self.backing_device(self.backing, self.size_mb)
        self.on(self.target, "target_up", self.nqn, dev, self.lab.address_of(self.target),
                self.port)

    def connect(self, deadline_s: float = 120.0) -> None:
        got = self.on(self.initiator, "connect", self.nqn, self.lab.address_of(self.target),
                      self.port, self.timeouts, deadline_s, deadline_s=deadline_s + 30)
        self.ctrl, self.device = got["ctrl"], got["device"]
        self.wait_state("live", deadline_s)

    def remove_target(self) -> float:
        """The target's port, namespace and subsystem removed (its controllers deleted, their
        QPs drained), with the initiator still connected: the seconds it took."""
        return self.on(self.target, "target_down", self.nqn)["took_s"]

    def teardown(self, deadline_s: float = 120.0) -> None:
        """Disconnects (within deadline_s, else WorkloadError) and removes the target."""
        if self._ledger is not None:
            self.stop_io()
        try:
            if self.ctrl:
                self.on(self.initiator, "disconnect", self.nqn, deadline_s,
                        deadline_s=deadline_s + 30)
        finally:
            self.on(self.target, "target_down", self.nqn)

    # -- state
    def state(self) -> str:
        """The initiator's controller state as the kernel says it now (live, connecting,
        resetting, deleting, ...; "gone" when the controller is deleted)."""
        return self.on(self.initiator, "state", self.ctrl)["state"]

    def unit_name(self) -> str:
        return self.ctrl or "the nvme controller"

    # -- I/O
