"""The netns lab's fleet function (--lab netns:rxe): its hosts as network namespaces on this
machine's kernel, or on the kernel of one VM lab guest booted for them where this one cannot
host them; and _Owners, which closes both."""
from __future__ import annotations

import os
from typing import Callable

from ..localmachine import LocalMachine
from ..machine import SOFT_DEVICES, Fleet
from ..qemu import VmMachines, qemu_unavailable
from .lab import NetnsHosts, kernel_support

# The kernel the netns lab's guest boots where this machine's cannot host it: the first with
# rxe per network namespace (7.1) that Debian carries. RDMALAB_VM_KERNEL (--kernel) overrides,
# and a kernel without the support is refused by name.
NETNS_GUEST_KERNEL = "sid"


class _Owners:
    """Closes what a pool was built on, innermost first (the namespaces, then their guest)."""

    def __init__(self, *owners):
        self.owners = [o for o in owners if o is not None]

    def close(self) -> None:
        errors = []
        for o in self.owners:
            try:
                o.close()
            except Exception as e:  # the guest still goes when the namespaces fail to
                errors.append(f"{type(o).__name__}: {e}")
        if errors:
            raise RuntimeError("closing the netns lab: " + "; ".join(errors))


def netns_fleet(name: str, hosts: int, log: Callable[[str], None] = lambda m: None, *,
                boot_deadline_s: float = 180.0) -> Fleet:
    """The netns lab: `hosts` hosts as network namespaces on one kernel (rdmalab.machines.netns),
    with rdma `name` (rxe or siw). On this machine's kernel where it can host them (root,
    rdma_rxe with per-namespace sockets: 7.1 on); else inside one guest of the VM lab booted
    with a kernel that can (RDMALAB_VM_KERNEL, else sid). The error names the kernel that
    cannot."""
    rdma = name
    if rdma not in SOFT_DEVICES:
        raise ValueError(f"netns lab device {rdma!r}: {' or '.join(SOFT_DEVICES)}")
    local = LocalMachine("local")
    why_local = kernel_support(local, rdma)
    guest = None
    if why_local is None:
        outer = local
    else:
        why_qemu = qemu_unavailable()
        if why_qemu:
            raise RuntimeError(f"the netns lab cannot run here: this machine's kernel cannot "
                               f"host it ({why_local}) and no guest can boot ({why_qemu})")
        kernel = os.environ.get("RDMALAB_VM_KERNEL") or NETNS_GUEST_KERNEL
        log(f"netns lab: {why_local}; booting one {kernel} guest for the namespaces")
        # Two vCPUs: the hosts' agents and the kernel's rxe work share the one guest.
        guest = VmMachines(1, "none", boot_deadline_s, kernel=kernel, memory_mb=1536, cpus=2)
        outer = guest.machines[0]
    try:
        why_guest = None if guest is None else kernel_support(outer, rdma)
        if why_guest is not None:
            raise RuntimeError(f"the netns lab cannot run in a {kernel} guest: {why_guest}")
        netns_hosts = NetnsHosts(outer, hosts, rdma, replace=True)
    except BaseException:
        if guest is not None:
            guest.close()
        raise
    # AgentPool closes its owner (the namespaces, then the guest) if it cannot start.
    return Fleet(netns_hosts.machines, description=f"netns:{rdma}", switch_control=None,
                 owner=_Owners(netns_hosts, guest))
