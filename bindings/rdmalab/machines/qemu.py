"""QemuMachine: a qemu soft-RoCE guest of the VM lab (bindings/rdmalab/machines/vmlab) as a Machine, and the VM lab's
source of machines: `VmMachines(n, rdma)` boots the guests joined by the fault switch, vm_fleet
is the VM lab's fleet function (--lab vm:rxe), qemu_unavailable says why this machine cannot
run it.

A guest runs as root; commands go through the guest's small command agent (fast on TCG),
everything an agent lab needs of SSH (execnet, background commands, copies) through the
guest's sshd with the lab's pinned host key.
"""
from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import time
from typing import Callable, Optional

from .machine import (WIRE_SWITCH, Fleet, HostFacts, MachineError, MachineUnreachable,
                      OwnKernelMachine, Result)
from .vmlab import vm as vm_mod

SWITCH_NAME = "vmlab"
DATA_NETDEV = "eth0"  # bindings/rdmalab/machines/vmlab/init.sh names the data NIC so
# The GID rdma_cm uses for the data address: rxe's IPv4-mapped GID sits behind the link-local
# one; siw has one GID (the MAC).
GID_INDEX = {"rxe": 1, "siw": 0}


class QemuMachine(OwnKernelMachine):
    """One guest of a vmlab VmGroup (rdmalab.machines.vmlab.vm.Vm)."""

    def __init__(self, vm: "vm_mod.Vm", ssh_config, rdma: str):
        self.vm, self.ssh_config, self.rdma = vm, str(ssh_config), rdma
        self.name = vm.spec.name
        self.facts = HostFacts(device=f"{rdma}0", port=1, gid_index=GID_INDEX.get(rdma, 0),
                               netdev=DATA_NETDEV, data_address=vm.spec.ip,
                               mac=vm.spec.data_mac, wire=WIRE_SWITCH, wire_switch=SWITCH_NAME)

    def __repr__(self) -> str:
        return f"<QemuMachine {self.name} {self.facts.device} {self.facts.data_address}>"

    # -- commands
    def run(self, cmd: str, timeout: float = 60.0, *, root: bool = False) -> Result:
        if not self.vm.alive():
            raise MachineUnreachable(f"{self.name}: its qemu is not running")
        try:
            return self.vm.run(cmd, timeout)
        except (OSError, vm_mod.VmError) as e:
            raise MachineUnreachable(f"{self.name}: the guest's command agent did not answer "
                                     f"{cmd!r}: {e}") from e

    def ssh_argv(self) -> list[str]:
        return ["ssh", "-F", self.ssh_config, self.name]

    def popen(self, cmd: str, *, root: bool = False, stdin: bool = False) -> subprocess.Popen:
        return subprocess.Popen(self.ssh_argv() + [cmd],
                                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def copy_to(self, local: str, remote: str, timeout: float = 300.0) -> None:
        _tar_copy(self.ssh_argv(), self.name, local, remote, timeout)

    def copy_from(self, remote: str, local: str, timeout: float = 300.0) -> None:
        with open(local, "wb") as f:
            r = subprocess.run(self.ssh_argv() + [f"cat {remote!r}"], stdout=f,
                               stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=timeout)
        if r.returncode != 0:
            raise MachineError(f"{self.name}: copy of {remote}: {r.stderr.decode()[-500:]}")

    def execnet_spec(self, python: str = "/usr/bin/python3") -> str:
        # The agent's long session: -q keeps "closed by remote host" (printed straight to
        # stderr when a guest is killed) off the terminal, -E logs the rest.
        log = self.vm.dir / "ssh.log"
        return f"ssh=-q -E {log} -F {self.ssh_config} {self.name}//python={python}"

    # -- power: qemu itself
    can_power = True

    def power_off(self) -> None:
        """SIGKILL of qemu: a crash, nothing closed, nothing sent."""
        self.vm.kill()

    def power_on(self) -> None:
        self.vm.start()

    def power_cycle(self) -> None:
        self.vm.kill()
        self.vm.start()

    def wait_ready(self, deadline_s: float = 180.0) -> float:
        try:
            return self.vm.wait_ready(deadline_s)
        except vm_mod.VmError as e:
            raise MachineUnreachable(str(e)) from e

    def alive(self) -> bool:
        return self.vm.alive()


def _tar_copy(ssh: list[str], name: str, local: str, remote: str, timeout: float) -> None:
    """A file or a tree to `remote` on the machine, through tar over ssh."""
    src = os.path.abspath(local)
    parent, base = os.path.dirname(src), os.path.basename(src)
    remote_cmd = (f"mkdir -p {remote!r} && tar -C {remote!r} -xf - --strip-components=1"
                  if os.path.isdir(src) else
                  f"mkdir -p \"$(dirname {remote!r})\" && cat > {remote!r}")
    if os.path.isdir(src):
        producer = subprocess.Popen(["tar", "-C", parent, "-cf", "-", base],
                                    stdout=subprocess.PIPE)
    else:
        producer = subprocess.Popen(["cat", src], stdout=subprocess.PIPE)
    try:
        r = subprocess.run(ssh + [remote_cmd], stdin=producer.stdout, capture_output=True,
                           timeout=timeout)
    finally:
        producer.stdout.close()
        producer.wait(timeout=30)
    if r.returncode != 0 or producer.returncode != 0:
        raise MachineError(f"{name}: copy of {local} to {remote} failed: "
                           f"{r.stderr.decode(errors='replace')[-500:]}")


class VmMachines:
    """The VM lab's guests as machines: boots N guests on the fault switch (a vmlab VmGroup)."""

    def __init__(self, n: int, rdma: str, boot_deadline_s: float = 180.0, *,
                 kernel: Optional[str] = None, memory_mb: int = 512, cpus: int = 1):
        self.rdma = rdma
        self.vmlab = vm_mod.VmGroup(n, rdma=rdma, kernel=kernel, memory_mb=memory_mb, cpus=cpus)
        self.machines = [QemuMachine(vm, self.vmlab.ssh_config, rdma) for vm in self.vmlab.vms]
        t0 = time.monotonic()
        try:
            self.vmlab.start_all()
            self.vmlab.wait_all_ready(boot_deadline_s)
        except BaseException:
            self.vmlab.close()
            raise
        self.boot_s = time.monotonic() - t0

    @property
    def switch_control(self) -> Optional[str]:
        c = self.vmlab.switch_control
        return None if c is None else str(c)

    @property
    def workdir(self):
        return self.vmlab.workdir

    def close(self) -> None:
        self.vmlab.close()


def qemu_unavailable() -> Optional[str]:
    """Why this machine cannot run the VM lab, or None if it can."""
    if shutil.which("qemu-system-x86_64") is None:
        return "qemu-system-x86_64 is not installed (make vmlab-deps)"
    if shutil.which("ssh") is None or not os.path.exists("/usr/sbin/sshd"):
        return "openssh client/server are not installed (make vmlab-deps)"
    try:  # optional dependencies: imported only to see that they are installed
        for module in ("execnet", "rpyc"):
            importlib.import_module(module)
    except ImportError as e:
        return f"python3-execnet / python3-rpyc missing: {e}"
    return None


def vm_fleet(name: str, hosts: int, log: Callable[[str], None] = lambda m: None, *,
             boot_deadline_s: float = 180.0) -> Fleet:
    """The VM lab: `hosts` qemu guests with rdma `name` (rxe or siw) on the fault switch."""
    rdma = name
    if rdma not in ("rxe", "siw"):
        raise ValueError(f"VM lab device {rdma!r}: rxe or siw")
    why = qemu_unavailable()
    if why:
        raise RuntimeError(f"the VM lab cannot run here: {why}")
    vms = VmMachines(hosts, rdma, boot_deadline_s)
    return Fleet(vms.machines, description=f"vm:{rdma}", switch_control=vms.switch_control,
                 owner=vms)
