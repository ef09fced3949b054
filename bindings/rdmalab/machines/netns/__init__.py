"""The netns lab: hosts as network namespaces on one kernel (NetnsMachine: one more
rdmalab.machines.machine Machine).

Why: CI runs containers, not VMs, and soft-RoCE in a container is rxe on a namespace's veth.
rxe opens its UDP 4791 socket per network namespace since Linux 7.1 ("RDMA/rxe: Add the support
that rxe can work in net namespace"), so N namespaces on one kernel are N RoCE hosts: cheaper
than N guests, and the shape CI has. The recipe is the kernel's own
tools/testing/selftests/rdma/rxe_rping_between_netns.sh:

    outer namespace:  bridge <prefix>br  --  veth <prefix><i>v  (one per host)
    namespace <prefix><i>:  eth0 (the veth's peer), <subnet>.<i>/24, lo up,
                            optionally `rdma link add <rdma><i> type rxe|siw netdev eth0`

Every command goes through an outer Machine (rdmalab.machines.localmachine.LocalMachine where
this kernel can host the lab, a rdmalab.machines.qemu.QemuMachine guest where it cannot;
kernel_support says which), as root in the outer's root namespace: this package never runs ip
or rdma itself.

RDMA device namespace mode (docs/semantics.md I, measured on 7.2.13): the lab runs in `shared`
mode, the kernel's default. In `exclusive` mode ib_register_device still puts the device in
init_net and moving it (`rdma dev set rxeN netns hN`) fails EOPNOTSUPP (rxe lacks
disassociate_ucontext), so a host could not see its own device. In shared mode every namespace
sees every device; each host uses its own (HostFacts.device, named <rdma><i> because device
names are kernel-wide). netns_mode="exclusive" is kept to measure later kernels. The mode can
only change while no namespace but the initial one exists (rdma_compatdev_set: EBUSY).

siw: its sockets are kernel TCP sockets; how siw behaves in namespaces is still to be measured
(kernel_support accepts it from 7.1 on like rxe).

The rooms: common (constants, commands as named steps on the outer machine), host
(NetnsMachine), lab (NetnsHosts, kernel_support), capture (BridgeCapture), fleet (netns_fleet:
the netns lab's fleet function, on this kernel or a guest's).
"""
from __future__ import annotations

from .capture import BridgeCapture
from .common import CMD_TIMEOUT_S, GID_INDEX, MAX_HOSTS, MODULES, NETNS_SINCE, RDMA_KINDS
from .host import NetnsMachine
from .lab import NetnsHosts, kernel_support

__all__ = [
    "BridgeCapture", "CMD_TIMEOUT_S", "GID_INDEX", "MAX_HOSTS", "MODULES", "NETNS_SINCE",
    "NetnsHosts", "NetnsMachine", "RDMA_KINDS", "kernel_support",
]
