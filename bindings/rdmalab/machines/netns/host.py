"""NetnsMachine: one host of the netns lab, the network namespace <prefix><i> on an outer
Machine: its commands entered into the namespace, power as a crash (everything in it gone) and
a rebuild, and readiness (eth0 up with its address, the RDMA port ACTIVE)."""
from __future__ import annotations

import shlex
import subprocess
import time

from ..machine import (HostFacts, Machine, MachineError, MachineUnreachable, Result,
                       WIRE_NFT_BRIDGE)
from .common import CMD_TIMEOUT_S, GID_INDEX, SBIN_PATH, has_netns, netns_list, run_steps


class NetnsMachine:
    """One host: the namespace `name` on `outer`. Built by NetnsHosts, which owns the bridge."""

    def __init__(self, outer: Machine, prefix: str, index: int, *, rdma: str = "none",
                 subnet: str = "10.77.0", ip: str = "ip"):
        self.outer, self.index, self.rdma, self.ip = outer, index, rdma, ip
        self.name = f"{prefix}{index}"
        self.bridge = f"{prefix}br"
        self.veth = f"{prefix}{index}v"              # the outer end, a port of the bridge
        self.facts = HostFacts(device="" if rdma == "none" else f"{rdma}{index}", port=1,
                               gid_index=GID_INDEX.get(rdma, 0), netdev="eth0",
                               data_address=f"{subnet}.{index}",
                               mac=f"52:54:00:77:00:{index:02x}", wire=WIRE_NFT_BRIDGE,
                               wire_bridge=outer.name)
        self._device_made = False   # delete the device only if this host made it
        self.retired = False        # NetnsHosts.close() ran: no power_on any more

    @property
    def bridge_machine(self) -> Machine:
        """Where wire faults go by default: the outer machine's bridge joins the hosts, and a
        rule in its forward hook is invisible to the sender's stack, as the fault switch is
        (a drop in the host's own output hook is a local send error: docs/semantics.md I)."""
        return self.outer

    @property
    def kernel_machine(self) -> Machine:
        """The namespaces share the outer machine's kernel."""
        return self.outer

    def __repr__(self) -> str:
        return f"<NetnsMachine {self.name} on {self.outer.name} {self.facts.data_address}>"

    # -- commands: the outer's, entered into the namespace
    def _enter(self, cmd: str) -> str:
        return f"{SBIN_PATH}exec {self.ip} netns exec {self.name} /bin/sh -c {shlex.quote(cmd)}"

    def run(self, cmd: str, timeout: float = 60.0, *, root: bool = False) -> Result:
        r = self.outer.run(self._enter(cmd), timeout, root=True)
        # ip's own words when the namespace is gone (exit status 255): the host is off.
        if r.rc == 255 and "Cannot open network namespace" in r.err:
            raise MachineUnreachable(f"{self.name}: its network namespace does not exist "
                                     f"(powered off?): {r.err.strip()[-300:]}")
        return r

    def popen(self, cmd: str, *, root: bool = False, stdin: bool = False) -> subprocess.Popen:
        return self.outer.popen(self._enter(cmd), root=True, stdin=stdin)

    # One file system with the outer machine.
    def copy_to(self, local: str, remote: str, timeout: float = 300.0) -> None:
        self.outer.copy_to(local, remote, timeout)

    def copy_from(self, remote: str, local: str, timeout: float = 300.0) -> None:
        self.outer.copy_from(remote, local, timeout)

    def execnet_spec(self, python: str = "/usr/bin/python3") -> str:
        """The outer's spec with python= entering the namespace. execnet splits a popen
        spec's python with shlex and hands an ssh spec's to the remote shell, so a command
        with spaces works for both; the outer's login must be root (ip netns exec)."""
        wrapped = f"python={self.ip} netns exec {self.name} {python}"
        parts = self.outer.execnet_spec(python).split("//")
        if any(p.startswith("python=") for p in parts):
            parts = [wrapped if p.startswith("python=") else p for p in parts]
        else:
            parts.append(wrapped)
        return "//".join(parts)

    def ssh_argv(self) -> list[str]:
        # The outer's argv would land outside the namespace: none rather than a wrong one.
        raise MachineError(f"{self.name}: a network namespace host has no SSH target of its "
                           f"own; use run(), popen() or execnet_spec()")

    # -- power: a crash is the namespace and everything in it gone
    can_power = True

    def power_off(self) -> None:
        """A crash: every process in the namespace SIGKILLed, the RDMA device deleted, the
        namespace and its veth pair deleted."""
        self._destroy()

    def power_on(self) -> None:
        """The host again as before: same namespace, address, MAC, device and bridge port."""
        if self.retired:
            raise MachineError(f"{self.name}: its lab was closed: cannot power on")
        self._create()

    def power_cycle(self) -> None:
        self.power_off()
        self.power_on()

    def wait_ready(self, deadline_s: float = 180.0) -> float:
        """Until eth0 is up with its address and (with a device) the port is ACTIVE."""
        addr = self.facts.data_address
        probe = "cat /sys/class/net/eth0/operstate; ip -4 -o addr show dev eth0"
        if self.facts.device:
            probe += f"; cat /sys/class/infiniband/{self.facts.device}/ports/1/state"
        start, last = time.monotonic(), "nothing answered"
        while True:
            left = deadline_s - (time.monotonic() - start)
            try:
                r = self.run(probe, timeout=max(1.0, min(CMD_TIMEOUT_S, left)))
                lines = r.out.split("\n")
                ok = (lines[0].strip() == "up" and f" {addr}/" in r.out
                      and (not self.facts.device or r.out.rstrip().endswith("ACTIVE")))
                if ok and r.rc == 0:
                    return time.monotonic() - start
                last = f"rc {r.rc}: {r.out.strip()} {r.err.strip()}"
            except MachineUnreachable as e:
                last = str(e)
            if left <= 0:
                want = f"eth0 up with {addr}" + (f", {self.facts.device} port 1 ACTIVE"
                                                  if self.facts.device else "")
                raise MachineUnreachable(f"{self.name}: not ready within {deadline_s} s "
                                         f"(wanted {want}); last probe: {last[-1000:]}")
            time.sleep(min(0.2, max(0.0, left)))

    def alive(self) -> bool:
        try:
            return self.name in netns_list(self.outer)
        except MachineError:
            return False

    # -- building and tearing down
    def _create(self) -> None:
        ns, f = self.name, self.facts
        run_steps(self.outer, ns, [
            ("create the network namespace", f"ip netns add {ns}"),
            ("create the veth pair", f"ip link add {self.veth} type veth peer name eth0 "
                                     f"address {f.mac} netns {ns}"),
            ("plug the veth into the bridge", f"ip link set {self.veth} master {self.bridge} up"),
            ("bring lo up", f"ip -n {ns} link set lo up"),
            ("address eth0", f"ip -n {ns} addr add {f.data_address}/24 dev eth0"),
            ("bring eth0 up", f"ip -n {ns} link set eth0 up"),
        ])
        if f.device:
            # A device of the same name may still be unregistering (a crash just before):
            # wait for the name, then add the device from inside so it binds this eth0.
            run_steps(self.outer, ns, [
                (f"wait for the device name {f.device} to be free (another lab's?)",
                 f"i=0; while rdma dev show {f.device} >/dev/null 2>&1; do i=$((i+1)); "
                 f"[ $i -ge 100 ] && exit 1; sleep 0.1; done"),
                (f"add the {self.rdma} device {f.device}",
                 f"ip netns exec {ns} rdma link add {f.device} type {self.rdma} netdev eth0"),
            ])
            self._device_made = True

    def _destroy(self) -> None:
        """Everything of this host gone; absent pieces are fine (idempotent)."""
        ns = self.name
        # Processes first: a device with open user contexts blocks its own deletion (rxe has
        # no disassociate_ucontext).
        run_steps(self.outer, ns, [(
            "kill the namespace's processes",
            f"i=0; while p=$(ip netns pids {ns} 2>/dev/null) && [ -n \"$p\" ]; do "
            f"kill -9 $p 2>/dev/null; i=$((i+1)); "
            f"[ $i -ge 100 ] && {{ echo \"still alive: $p\"; exit 1; }}; sleep 0.1; done")])
        devices = self._devices_bound()
        if self._device_made:
            devices.add(self.facts.device)
        for dev in sorted(devices):
            run_steps(self.outer, ns, [(f"delete the RDMA device {dev}",
                                         f"{{ ! rdma dev show {dev} >/dev/null 2>&1 || "
                                         f"rdma link delete {dev}; }}")], timeout=60.0)
        self._device_made = False
        # The veth by name: deleting one end takes the pair at once, while a namespace's own
        # teardown is asynchronous and would keep the name busy for a power_on.
        run_steps(self.outer, ns, [
            ("delete the veth pair", f"{{ ! ip link show {self.veth} >/dev/null 2>&1 || "
                                     f"ip link del {self.veth}; }}"),
            ("delete the network namespace", f"{{ ! {has_netns(ns)} || ip netns del {ns}; }}"),
        ])

    def _devices_bound(self) -> set[str]:
        """RDMA devices on this namespace's netdevs: inside a namespace, `rdma link show`
        names a port's netdev only when it lives there (nldev fill_port_info). Asked also
        with rdma "none": a leftover of another lab may have had one; no rdma tool, none."""
        r = self.outer.run(f"{SBIN_PATH}{has_netns(self.name)} && "
                           f"ip netns exec {self.name} rdma link show", CMD_TIMEOUT_S, root=True)
        # "link rxe1/1 state ACTIVE physical_state LINK_UP netdev eth0"
        return {l.split()[1].split("/")[0] for l in r.out.splitlines()
                if l.startswith("link ") and " netdev " in l}
