"""Workloads: kernel ULPs driven across two hosts of a lab, beside its hosts and faults
(Jepsen's client next to its nemesis). A workload sets up a target on one host and an
initiator on another, drives I/O, reports the state the kernel gives its units, and tears
down; its steps, states and I/O are history records (records.py).

Each workload has a controller side (nvme.py: NvmeOf; iser.py: Iser; nfs.py: Nfs; srp.py:
Srp) and a host side run in the host's agent through Lab.run_on (nvme_host.py, iser_host.py,
nfs_host.py, srp_host.py, ledger.py, host.py). A lab
without kernel ULPs (the model) refuses with FaultNotSupported (capability kernel_ulp), which
the plugin reports as a skip."""

from .iser import Iser
from .nfs import Nfs
from .nvme import NvmeOf
from .srp import Srp
from .records import IO, IO_VERIFY, ULP_STATE, WORKLOAD

__all__ = ["Iser", "Nfs", "NvmeOf", "Srp", "IO", "IO_VERIFY", "ULP_STATE", "WORKLOAD"]
