"""Where a pool's machines come from: the VM lab's guests (vm_pool), network namespaces on one
kernel (netns_pool), or an inventory's hosts, each locked for the run (inventory_pool)."""

from __future__ import annotations

import fcntl
import os
from typing import Callable

from ...machines import hostcheck, inventory, netns, sshmachine
from ...machines.localmachine import LocalMachine
from ...machines.deploy import AGENT_DIR
from ...machines.machine import SOFT_DEVICES, MachineError
from ...machines.qemu import VmMachines
from .common import each_host, qemu_unavailable
from .pool import AgentPool


def vm_pool(n: int = 2, rdma: str = "rxe", boot_deadline_s: float = 180.0) -> AgentPool:
    """The VM lab: n qemu guests with rdma (rxe or siw) on the fault switch, their agents."""
    if rdma not in ("rxe", "siw"):
        raise ValueError(f"VM lab device {rdma!r}: rxe or siw")
    why = qemu_unavailable()
    if why:
        raise RuntimeError(f"the VM lab cannot run here: {why}")
    vms = VmMachines(n, rdma, boot_deadline_s)
    return AgentPool(vms.machines, description=f"vm:{rdma}", switch_control=vms.switch_control,
                     owner=vms)


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


def netns_pool(n: int = 2, rdma: str = "rxe", boot_deadline_s: float = 180.0,
               log: Callable[[str], None] = lambda m: None) -> AgentPool:
    """The netns lab: n hosts as network namespaces on one kernel (rdmalab.machines.netns), each with its
    agent. On this machine's kernel where it can host them (root, rdma_rxe with per-namespace
    sockets: 7.1 on); else inside one guest of the VM lab booted with a kernel that can
    (RDMALAB_VM_KERNEL, else sid). The error names the kernel that cannot."""
    if rdma not in SOFT_DEVICES:
        raise ValueError(f"netns lab device {rdma!r}: {' or '.join(SOFT_DEVICES)}")
    local = LocalMachine("local")
    why_local = netns.kernel_support(local, rdma)
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
        why_guest = None if guest is None else netns.kernel_support(outer, rdma)
        if why_guest is not None:
            raise RuntimeError(f"the netns lab cannot run in a {kernel} guest: {why_guest}")
        hosts = netns.NetnsHosts(outer, n, rdma, replace=True)
    except BaseException:
        if guest is not None:
            guest.close()
        raise
    # AgentPool closes its owner (the namespaces, then the guest) if it cannot start.
    return AgentPool(hosts.machines, description=f"netns:{rdma}", switch_control=None,
                     owner=_Owners(hosts, guest), log=log)


def inventory_pool(path: str, hosts: int = 2,
                   log: Callable[[str], None] = lambda m: None) -> AgentPool:
    """`hosts` machines of an inventory (rdmalab.machines.inventory), the first in file order that are free
    and healthy: each locked for this run (another run, or another pytest-xdist worker, takes
    the next ones), health-checked before use and after each lab, each running the
    controller's own agent version."""
    inv = inventory.load(path)
    # Hosts behind one fault switch are one fabric: a lab's hosts come from one of them.
    fabrics: dict[str, list] = {}
    for m in sshmachine.inventory_machines(inv):
        fabrics.setdefault(m.facts.wire_switch, []).append(m)
    # pytest-xdist workers start at different fabrics, so two starting at once do not split
    # one fabric's hosts between them (each then too few) and both give up.
    groups = list(fabrics.values())
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    start = int(worker[2:]) % len(groups) if worker[2:].isdigit() and groups else 0
    groups = groups[start:] + groups[:start]
    chosen, locks, passed = [], [], []
    try:
        for group in groups:
            switch = group[0].facts.wire_switch
            if switch:  # its rule table serves one run: hosts behind a switch another holds
                lock = _SwitchLock(inv.switches[switch].control)  # are passed over
                if not lock.acquire():
                    passed.append(f"switch {switch!r} is used by another rdmalab run")
                    continue
                locks.append(lock)
            left = list(group)
            while left and len(chosen) < hosts:
                batch = []  # as many as still wanted, locked, then checked side by side
                while left and len(chosen) + len(batch) < hosts:
                    m = left.pop(0)
                    lock = hostcheck.HostLock(m)
                    try:
                        lock.acquire(30.0)
                    except MachineError as e:
                        passed.append(str(e))
                        continue
                    batch.append((m, lock))
                for (m, lock), problems in zip(
                        batch, each_host(lambda b: hostcheck.health_check(b[0]), batch)):
                    if problems:
                        lock.release()
                        passed.append(f"{m.name}: not healthy: {'; '.join(problems)}")
                        continue
                    chosen.append(m)
                    locks.append(lock)
            if len(chosen) == hosts:
                break
            if chosen:  # too few free on this fabric: leave them to others, try the next
                passed.append(f"only {', '.join(m.name for m in chosen)} free behind switch "
                              f"{chosen[0].facts.wire_switch!r}")
            _Locks(locks).close()
            chosen, locks = [], []
        if len(chosen) < hosts:
            raise RuntimeError(f"inventory {path}: {hosts} hosts wanted on one fabric, "
                               f"{len(chosen)} free and healthy; passed over: "
                               + " | ".join(passed))
        switches = {m.facts.wire_switch for m in chosen if m.facts.wire_switch}
        control = inv.switches[switches.pop()].control if len(switches) == 1 else None
        return AgentPool(chosen, description=f"inventory:{os.path.basename(str(path))}",
                         switch_control=control, owner=_Locks(locks), health_check=True,
                         agent_dir=inv.agent_dir or AGENT_DIR, log=log)
    except BaseException:
        _Locks(locks).close()
        raise


class _SwitchLock:
    """A fault switch for one run: its rules and its host table are switch-wide, so two runs
    (or two pytest-xdist workers) on one switch would drop each other's frames. The switch's
    control socket is on the controller: flock beside it."""

    def __init__(self, control: str):
        self.path = f"{control}.rdmalab-lock"
        self._f = None

    def acquire(self) -> bool:
        f = open(self.path, "a")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            return False
        self._f = f
        return True

    def release(self) -> None:
        if self._f is not None:
            self._f.close()  # closing the file frees the lock
            self._f = None


class _Locks:
    """The inventory hosts' locks, held while the pool lives."""

    def __init__(self, locks):
        self.locks = locks

    def close(self) -> None:
        for lock in self.locks:
            try:
                lock.release()
            except Exception:  # the host may be gone; its lock goes with the ssh session
                pass
