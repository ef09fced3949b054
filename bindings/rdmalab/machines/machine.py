"""Machines: where an agent lab's hosts come from (labgrid's resource/driver split, small).

A Machine is one host the controller can reach: it runs commands, copies files, powers off /
on / cycles where it can, waits until it is ready, and gives execnet an SSH target for the
host agent. The agent lab (rdmalab.labs.agent) drives hosts only through this protocol, so a
qemu guest (rdmalab.machines.qemu.QemuMachine), a machine from an inventory (rdmalab.machines.sshmachine.SshMachine) and,
next, a network namespace are the same to it.

The RDMA facts of a host (device, port, GID index, netdev, data address, how wire faults reach
its traffic) travel with the machine as a HostFacts; capabilities are read from the device on
the host, never from these facts.

A kind's fleet function (name, hosts, log) -> Fleet chooses, boots and locks the machines a
pool's agents run on (rdmalab.run.labkinds names it in the kind's row); each_host calls a
function per machine, side by side.
"""
from __future__ import annotations

import dataclasses
import subprocess
import threading
import time
from typing import Callable, Optional, Protocol, runtime_checkable


class MachineError(RuntimeError):
    """A machine could not do what was asked: the message names the machine and the step."""


class MachineUnreachable(MachineError):
    """The machine does not answer (SSH refused or timed out, qemu gone)."""


class PowerNotSupported(MachineError):
    """The machine has no way to power off, on or cycle (no power commands)."""


@dataclasses.dataclass
class Result:
    rc: int
    out: str
    err: str
    timed_out: bool
    elapsed_s: float

    def check(self, what: str = "command") -> "Result":
        if self.rc != 0 or self.timed_out:
            raise MachineError(f"{what}: rc {self.rc} timed_out {self.timed_out}\n"
                               f"stdout:\n{self.out[-2000:]}\nstderr:\n{self.err[-2000:]}")
        return self


# How wire faults reach a host's traffic (the inventory's `wire.via`).
WIRE_SWITCH = "switch"          # an rdmalab-switch on the path (wire.switch names it)
WIRE_NFTABLES = "nftables"      # nftables in the host itself (software providers: rxe, siw)
WIRE_NFT_BRIDGE = "nft-bridge"  # an nftables bridge host on the path (hardware RoCE)
WIRE_NONE = "none"              # nothing can touch the wire (an InfiniBand link)
WIRE_KINDS = (WIRE_SWITCH, WIRE_NFTABLES, WIRE_NFT_BRIDGE, WIRE_NONE)
# The devices `rdma link add` makes on a host's netdev (the VM and netns labs' kinds).
SOFT_DEVICES = ("rxe", "siw")
# A machine's spare disk, which a workload's target exports (rdmalab.workloads): the block
# device whose serial (/sys/block/*/serial) is this. The VM lab gives every guest one, kept
# across reboots; an inventory host may have one (e.g. a virtio or loop disk set up so).
SPARE_DISK_SERIAL = "rdmalab-disk"


@dataclasses.dataclass
class HostFacts:
    """What the controller must know of a host to use its RDMA device."""
    device: str                    # "rxe0", "mlx5_0"
    port: int = 1
    gid_index: int = 0
    netdev: str = ""               # the data NIC ("eth0", "ens1f0np0")
    data_address: str = ""         # the IP rdma_cm resolves for this host
    mac: str = ""                  # the data NIC's MAC (a switch's host table), optional
    wire: str = WIRE_NONE          # one of WIRE_KINDS
    wire_switch: str = ""          # with WIRE_SWITCH: the switch's name in the inventory
    wire_bridge: str = ""          # with WIRE_NFT_BRIDGE: the bridge host's name


@runtime_checkable
class Machine(Protocol):
    """The protocol every kind of machine implements."""

    name: str
    facts: HostFacts

    def run(self, cmd: str, timeout: float = 60.0, *, root: bool = False) -> Result:
        """Runs a shell command on the machine (root=True: as root, through sudo -n where the
        login is not root). Never raises for a non-zero status; MachineUnreachable when the
        machine cannot be reached."""

    def popen(self, cmd: str, *, root: bool = False, stdin: bool = False) -> subprocess.Popen:
        """Starts a command on the machine in the background (stdout and stderr piped
        together); the caller waits for it with a deadline. stdin=True: stdin is a pipe whose
        closing (also by this process dying) the command sees as EOF (rdmalab.machines.hostcheck.HostLock
        holds a host's lock that way); otherwise stdin is /dev/null."""

    def copy_to(self, local: str, remote: str, timeout: float = 300.0) -> None:
        """Copies a local file or directory tree to a path on the machine."""

    def copy_from(self, remote: str, local: str, timeout: float = 300.0) -> None:
        """Copies a file from the machine."""

    def execnet_spec(self, python: str = "/usr/bin/python3") -> str:
        """An execnet gateway spec that starts `python` on the machine over SSH."""

    def ssh_argv(self) -> list[str]:
        """ssh argv (without the command) reaching the machine, host key verified."""

    @property
    def can_power(self) -> bool:
        """Whether power_off/power_on/power_cycle work here."""

    def power_off(self) -> None: ...
    def power_on(self) -> None: ...
    def power_cycle(self) -> None: ...

    def wait_ready(self, deadline_s: float = 180.0) -> float:
        """Waits until the machine answers commands; returns the seconds waited."""

    def alive(self) -> bool:
        """Cheap: does the machine answer at all (a qemu still running, an SSH login)?"""

    # Where wire faults and captures can reach this host's data traffic besides the host itself
    # and a switch (facts.wire): the machine of the Linux bridge its traffic crosses, whose
    # nftables take at="bridge" rules and whose tcpdump sees every host's frames, and that
    # bridge's interface there; None and "" where no bridge of ours is on the path.
    bridge_machine: Optional["Machine"]
    bridge: str

    @property
    def kernel_machine(self) -> "Machine":
        """The machine whose kernel runs this host: itself, or the one machine that hosts
        share (network namespaces on one kernel: their kernel log is read once)."""


class OwnKernelMachine:
    """The Machine protocol's answers for a host with a kernel of its own and no bridge of
    ours on its path: what every kind but NetnsMachine says."""

    bridge_machine: Optional[Machine] = None
    bridge = ""

    @property
    def kernel_machine(self) -> Machine:
        return self  # type: ignore[return-value]


def wait_for_ssh(machine: Machine, deadline_s: float, poll_s: float = 1.0) -> float:
    """Polls `true` over the machine's run() until it answers; returns the seconds waited."""
    start = time.monotonic()
    last: Optional[BaseException] = None
    while time.monotonic() - start < deadline_s:
        try:
            if machine.run("true", timeout=min(15.0, deadline_s)).rc == 0:
                return time.monotonic() - start
        except MachineError as e:
            last = e
        time.sleep(poll_s)
    raise MachineUnreachable(f"{machine.name}: no answer over SSH within {deadline_s} s"
                             + (f": {last}" if last else ""))


@dataclasses.dataclass(frozen=True)
class Fleet:
    """What a pool's agents run on, as a kind's fleet function chose, booted and locked it;
    rdmalab.labs.agent.AgentPool starts the agents on it."""
    machines: list     # the hosts, in the order labs name them
    description: str   # what messages call it: "vm:rxe", "inventory:lab.toml"
    switch_control: Optional[str] = None  # the control socket of the fault switch on their path
    # What they were built on (the VM lab's guests, the namespaces, an inventory's locks): its
    # close() is called when the pool closes.
    owner: Optional[object] = None
    health_check: bool = False  # checked before use and after the run (inventory hosts)
    agent_dir: Optional[str] = None  # where the agent goes on each; None: deploy.AGENT_DIR


def each_host(fn: Callable, items: list) -> list:
    """fn(item) for every item at once, one thread each, results in items' order. The hosts
    are machines of their own (a TCG guest is a qemu process of its own): their starts and
    checks, each seconds of a guest's CPU, need not wait for one another. The first error
    (in items' order) is raised once every call has ended."""
    items = list(items)
    if len(items) < 2:
        return [fn(i) for i in items]
    out: list = [None] * len(items)
    errs: list = [None] * len(items)

    def run(k: int) -> None:
        try:
            out[k] = fn(items[k])
        except BaseException as e:  # handed to the caller's thread
            errs[k] = e

    threads = [threading.Thread(target=run, args=(k,), name=f"rdmalab-host-{k}", daemon=True)
               for k in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errs:
        if e is not None:
            raise e
    return out


def end_session(proc, deadline_s: float) -> None:
    """Ends a command kept running on its stdin (`nft -i`, a host lock's flock): closing stdin
    ends it; one that has not ended within deadline_s (stuck, or its machine gone) is killed.
    Its stdout is closed too."""
    try:
        if proc.stdin:
            proc.stdin.close()
        proc.wait(timeout=deadline_s)
    except (OSError, ValueError, subprocess.TimeoutExpired):  # stuck or gone: killed below
        pass
    if proc.poll() is None:
        proc.kill()
        proc.wait(deadline_s)
    if proc.stdout:
        proc.stdout.close()
