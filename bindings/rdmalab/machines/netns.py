"""NetnsMachine: lab hosts as network namespaces on one kernel (one more rdmalab.machines.machine Machine).

Why: CI runs containers, not VMs, and soft-RoCE in a container is rxe on a namespace's veth.
rxe opens its UDP 4791 socket per network namespace since Linux 7.1 ("RDMA/rxe: Add the support
that rxe can work in net namespace"), so N namespaces on one kernel are N RoCE hosts: cheaper
than N guests, and the shape CI has. The recipe is the kernel's own
tools/testing/selftests/rdma/rxe_rping_between_netns.sh:

    outer namespace:  bridge <prefix>br  --  veth <prefix><i>v  (one per host)
    namespace <prefix><i>:  eth0 (the veth's peer), <subnet>.<i>/24, lo up,
                            optionally `rdma link add <rdma><i> type rxe|siw netdev eth0`

Every command goes through an outer Machine (rdmalab.machines.localmachine.LocalMachine where this kernel
can host the lab, a rdmalab.machines.qemu.QemuMachine guest where it cannot; kernel_support says which), as
root in the outer's root namespace: this module never runs ip or rdma itself.

RDMA device namespace mode (docs/semantics.md I, measured on 7.2.13): the lab runs in `shared`
mode, the kernel's default. In `exclusive` mode ib_register_device still puts the device in
init_net and moving it (`rdma dev set rxeN netns hN`) fails EOPNOTSUPP (rxe lacks
disassociate_ucontext), so a host could not see its own device. In shared mode every namespace
sees every device; each host uses its own (HostFacts.device, named <rdma><i> because device
names are kernel-wide). netns_mode="exclusive" is kept to measure later kernels. The mode can
only change while no namespace but the initial one exists (rdma_compatdev_set: EBUSY).

siw: its sockets are kernel TCP sockets; how siw behaves in namespaces is still to be measured
(kernel_support accepts it from 7.1 on like rxe).
"""
from __future__ import annotations

import atexit
import os
import re
import shlex
import subprocess
import time
from typing import Optional

from .machine import (HostFacts, Machine, MachineError, MachineUnreachable, Result,
                      WIRE_NFT_BRIDGE)

RDMA_KINDS = ("rxe", "siw", "none")
MODULES = {"rxe": "rdma_rxe", "siw": "siw"}
# rxe's IPv4-mapped GID sits behind the link-local one; siw has one GID (the MAC).
GID_INDEX = {"rxe": 1, "siw": 0}
NETNS_SINCE = (7, 1)     # rxe per network namespace (rxe_ns.c)
MAX_HOSTS = 16
CMD_TIMEOUT_S = 30.0
# sbin is not on every PATH (a non-login shell, sudo's secure_path aside): ip, rdma, modprobe.
_PATH = 'PATH="$PATH:/usr/sbin:/sbin"; '


def _run_steps(outer: Machine, host: str, steps: list[tuple[str, str]],
               timeout: float = CMD_TIMEOUT_S) -> Result:
    """Runs (step, command) pairs as one script on the outer machine (one round trip); the
    first failing step ends it. Raises MachineError naming the host, the step and the output."""
    # Each step in a subshell: its own `exit 1` (a loop giving up) still names the step.
    script = _PATH + "\n".join(
        f"( {cmd} ) || {{ echo {shlex.quote('FAILED STEP: ' + step)} >&2; exit 1; }}"
        for step, cmd in steps)
    try:
        r = outer.run(script, timeout=timeout, root=True)
    except MachineError as e:
        # Same class: a guest gone stays MachineUnreachable.
        raise type(e)(f"{host}: {steps[0][0]}: the outer machine {outer.name} did not "
                      f"answer: {e}") from e
    if r.rc == 0 and not r.timed_out:
        return r
    failed = [l[len("FAILED STEP: "):] for l in r.err.splitlines()
              if l.startswith("FAILED STEP: ")]
    err = "\n".join(l for l in r.err.splitlines() if not l.startswith("FAILED STEP: "))
    step = failed[-1] if failed else " / ".join(s for s, _ in steps)
    cmd = dict(steps).get(step, "")
    raise MachineError(f"{host}: {step}: "
                       + (f"timed out after {timeout} s" if r.timed_out else f"rc {r.rc}")
                       + (f" (`{cmd}`)" if cmd else "")
                       + f"\nstdout:\n{r.out.strip()[-2000:]}\nstderr:\n{err.strip()[-2000:]}")


def _netns_list(outer: Machine) -> list[str]:
    r = _run_steps(outer, outer.name, [("list network namespaces", "ip netns list")])
    # "rl1 (id: 3)" or "rl1"
    return [l.split()[0] for l in r.out.splitlines() if l.strip()]


def _has_netns(ns: str) -> str:
    # ip's own list: its run directory is /var/run/netns or /run/netns by version.
    return f"ip netns list | cut -d' ' -f1 | grep -qx {ns}"


def _links(outer: Machine) -> list[str]:
    r = _run_steps(outer, outer.name, [("list links", "ip -o link show")])
    # "7: rl1v@if2: <BROADCAST,...": the name, without the @peer
    return [l.split(":")[1].strip().split("@")[0] for l in r.out.splitlines() if ":" in l]


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

    def __repr__(self) -> str:
        return f"<NetnsMachine {self.name} on {self.outer.name} {self.facts.data_address}>"

    # -- commands: the outer's, entered into the namespace
    def _enter(self, cmd: str) -> str:
        return f"{_PATH}exec {self.ip} netns exec {self.name} /bin/sh -c {shlex.quote(cmd)}"

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
            return self.name in _netns_list(self.outer)
        except MachineError:
            return False

    # -- building and tearing down
    def _create(self) -> None:
        ns, f = self.name, self.facts
        _run_steps(self.outer, ns, [
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
            _run_steps(self.outer, ns, [
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
        _run_steps(self.outer, ns, [(
            "kill the namespace's processes",
            f"i=0; while p=$(ip netns pids {ns} 2>/dev/null) && [ -n \"$p\" ]; do "
            f"kill -9 $p 2>/dev/null; i=$((i+1)); "
            f"[ $i -ge 100 ] && {{ echo \"still alive: $p\"; exit 1; }}; sleep 0.1; done")])
        devices = self._devices_bound()
        if self._device_made:
            devices.add(self.facts.device)
        for dev in sorted(devices):
            _run_steps(self.outer, ns, [(f"delete the RDMA device {dev}",
                                         f"{{ ! rdma dev show {dev} >/dev/null 2>&1 || "
                                         f"rdma link delete {dev}; }}")], timeout=60.0)
        self._device_made = False
        # The veth by name: deleting one end takes the pair at once, while a namespace's own
        # teardown is asynchronous and would keep the name busy for a power_on.
        _run_steps(self.outer, ns, [
            ("delete the veth pair", f"{{ ! ip link show {self.veth} >/dev/null 2>&1 || "
                                     f"ip link del {self.veth}; }}"),
            ("delete the network namespace", f"{{ ! {_has_netns(ns)} || ip netns del {ns}; }}"),
        ])

    def _devices_bound(self) -> set[str]:
        """RDMA devices on this namespace's netdevs: inside a namespace, `rdma link show`
        names a port's netdev only when it lives there (nldev fill_port_info). Asked also
        with rdma "none": a leftover of another lab may have had one; no rdma tool, none."""
        r = self.outer.run(f"{_PATH}{_has_netns(self.name)} && "
                           f"ip netns exec {self.name} rdma link show", CMD_TIMEOUT_S, root=True)
        # "link rxe1/1 state ACTIVE physical_state LINK_UP netdev eth0"
        return {l.split()[1].split("/")[0] for l in r.out.splitlines()
                if l.startswith("link ") and " netdev " in l}


class NetnsHosts:
    """The netns lab's source of machines: n namespaces behind one bridge on `outer`.

        with NetnsHosts(LocalMachine(), 2, "rxe") as lab:
            a, b = lab.machines
    """

    def __init__(self, outer: Machine, n: int, rdma: str = "rxe", prefix: str = "rl",
                 subnet: str = "10.77.0", *, replace: bool = False,
                 netns_mode: str = "shared", ready_deadline_s: float = 60.0):
        if not 1 <= n <= MAX_HOSTS:
            raise ValueError(f"netns lab: {n} hosts: 1 to {MAX_HOSTS}")
        if rdma not in RDMA_KINDS:
            raise ValueError(f"netns lab: rdma {rdma!r}: one of {', '.join(RDMA_KINDS)}")
        # Ends in a letter: <prefix><i> must not read as another prefix's host.
        if not re.fullmatch(r"[a-z]([a-z0-9]{0,8}[a-z])?", prefix):
            raise ValueError(f"netns lab: prefix {prefix!r}: 1-10 of [a-z0-9], starting and "
                             f"ending with a letter (interface names are 15 characters)")
        if not re.fullmatch(r"(\d{1,3})\.(\d{1,3})\.(\d{1,3})", subnet) or \
                any(int(o) > 255 for o in subnet.split(".")):
            raise ValueError(f"netns lab: subnet {subnet!r}: three octets, as 10.77.0")
        if netns_mode not in ("shared", "exclusive"):
            raise ValueError(f"netns lab: netns_mode {netns_mode!r}: shared or exclusive")
        self.outer, self.rdma, self.prefix, self.subnet = outer, rdma, prefix, subnet
        self.netns_mode = netns_mode
        self.bridge = f"{prefix}br"
        self.machines: list[NetnsMachine] = []
        self._started: list[NetnsMachine] = []   # what close() must take down
        self._bridge_made = False
        try:
            self._setup(n, replace, ready_deadline_s)
        except BaseException as e:
            try:
                self.close()
            except MachineError as ce:
                e.add_note(f"cleaning up after the failed setup also failed: {ce}")
            raise

    def _setup(self, n: int, replace: bool, ready_deadline_s: float) -> None:
        where = f"{self.outer.name}: netns lab {self.prefix}"
        ip = _run_steps(self.outer, where, [("find ip (iproute2)", "command -v ip")]
                        ).out.strip().splitlines()[-1]
        self.machines = [NetnsMachine(self.outer, self.prefix, i, rdma=self.rdma,
                                      subnet=self.subnet, ip=ip) for i in range(1, n + 1)]
        left = self.leftovers()
        if left and not replace:
            raise MachineError(f"{where}: already exist: {', '.join(left)} (a lab of this "
                               f"prefix is running, or one was not closed; another prefix, "
                               f"or replace=True to delete them)")
        for name in left:
            if re.fullmatch(rf"{self.prefix}\d+", name):   # a namespace: as a crash of it
                m = NetnsMachine(self.outer, self.prefix, int(name[len(self.prefix):]),
                                 rdma=self.rdma, subnet=self.subnet, ip=ip)
                m._destroy()
        links = [(f"delete the leftover link {name}", f"ip link del {name}")
                 for name in self.leftovers()]
        if links:
            _run_steps(self.outer, where, links)
        if self.rdma != "none":
            self._rdma_system()
        _run_steps(self.outer, where, [
            (f"create the bridge {self.bridge}", f"ip link add {self.bridge} type bridge"),
        ])
        self._bridge_made = True
        _run_steps(self.outer, where, [(f"bring the bridge {self.bridge} up",
                                        f"ip link set {self.bridge} up")])
        for m in self.machines:
            self._started.append(m)
            m._create()
        for m in self.machines:
            m.wait_ready(ready_deadline_s)

    def _rdma_system(self) -> None:
        where = f"{self.outer.name}: netns lab {self.prefix}"
        mod, mode = MODULES[self.rdma], self.netns_mode
        r = _run_steps(self.outer, where, [
            (f"load {mod}", f"[ -d /sys/module/{mod} ] || modprobe {mod}"),
            ("read the RDMA namespace mode (rdma system show)", "rdma system show"),
        ])
        if f"netns {mode}" in r.out:
            return
        # Only while no namespace but the initial one exists (rdma_compatdev_set: EBUSY).
        _run_steps(self.outer, where, [(
            f"set the RDMA namespace mode to {mode} (possible only while no other network "
            f"namespace exists: see `lsns -t net`)", f"rdma system set netns {mode}")])

    def leftovers(self) -> list[str]:
        """Namespaces, veths and the bridge of this prefix that exist on the outer machine."""
        pat = re.compile(rf"{re.escape(self.prefix)}(\d+|\d+v|br)")
        return sorted(n for n in _netns_list(self.outer) + _links(self.outer) if pat.fullmatch(n))

    def close(self) -> None:
        """Tears down what this lab made (processes killed, devices, namespaces, veths, the
        bridge); idempotent. Every host is tried; the errors come back together."""
        errors = []
        BridgeCapture.close_all(self.outer, self.bridge)  # before its bridge goes
        for m in self.machines:
            m.retired = True
        while self._started:
            m = self._started.pop()
            try:
                m._destroy()
            except MachineError as e:
                errors.append(str(e))
        if self._bridge_made:
            try:
                _run_steps(self.outer, f"{self.outer.name}: netns lab {self.prefix}", [(
                    f"delete the bridge {self.bridge}",
                    f"{{ ! ip link show {self.bridge} >/dev/null 2>&1 || "
                    f"ip link del {self.bridge}; }}")])
                self._bridge_made = False
            except MachineError as e:
                errors.append(str(e))
        if errors:
            raise MachineError("closing the netns lab: " + "\n".join(errors))

    def __enter__(self) -> "NetnsHosts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def kernel_support(outer: Machine, rdma: str = "rxe") -> Optional[str]:
    """None when outer's kernel can host the netns lab with `rdma` ("rxe", "siw", "none"),
    else a sentence saying why, naming the kernel release."""
    mod = MODULES.get(rdma)
    probe = (_PATH + "uname -r; "
             "command -v ip >/dev/null && echo have-ip; "
             "command -v rdma >/dev/null && echo have-rdma; "
             "[ -e /proc/self/ns/net ] && echo have-netns; ")
    if mod:
        probe += (f"{{ [ -d /sys/module/{mod} ] || modprobe -n {mod} >/dev/null 2>&1; }} "
                  f"&& echo have-module")
    try:
        # Not as root: the release is named even where root is what is missing.
        r = outer.run(probe, timeout=CMD_TIMEOUT_S)
        lines = r.out.split()
        if r.timed_out or not lines:
            return (f"{outer.name}: the kernel probe failed (rc {r.rc}): "
                    f"{(r.err or r.out).strip()[-300:]}")
        release, why = lines[0], []
        try:
            uid = outer.run("id -u", timeout=CMD_TIMEOUT_S, root=True)
            if uid.out.strip() != "0":
                why.append(f"commands there do not run as root (id -u: rc {uid.rc}, "
                           f"{(uid.out + uid.err).strip()[-200:]})")
        except OSError as e:    # LocalMachine without sudo
            why.append(f"commands there cannot run as root ({e})")
    except MachineError as e:
        return f"{outer.name} did not answer the kernel probe: {e}"
    if "have-netns" not in lines:
        why.append("it has no network namespaces (/proc/self/ns/net)")
    missing = [t for t in ("ip",) + (("rdma",) if mod else ()) if f"have-{t}" not in lines]
    if missing:
        why.append(f"{' and '.join(missing)} missing (Debian package iproute2)")
    if mod:
        if "have-module" not in lines:
            why.append(f"the {mod} module is not available (no /sys/module/{mod}, "
                       f"`modprobe -n {mod}` fails)")
        m = re.match(r"(\d+)\.(\d+)", release)
        if not m or (int(m[1]), int(m[2])) < NETNS_SINCE:
            why.append(f"{rdma} works per network namespace only since "
                       f"{NETNS_SINCE[0]}.{NETNS_SINCE[1]} (\"RDMA/rxe: Add the support that "
                       f"rxe can work in net namespace\")")
    if not why:
        return None
    return (f"{outer.name}'s kernel {release} cannot host the netns lab with {rdma}: "
            + "; ".join(why))


class BridgeCapture:
    """tcpdump on the netns lab's bridge in the outer machine, for the scenarios' evidence
    (rdmalab.report.evidence): every frame between the hosts, as the fault switch's capture is in the
    VM lab. One tcpdump per bridge runs as long as the lab (starting one costs ~0.5 s on a TCG
    guest); each scenario takes its part of the file:

        cap = BridgeCapture.shared(outer, "rlbr")
        offset = cap.mark()                     # starts tcpdump when none runs
        ...                                     # the scenario
        stats = cap.take(offset, "wire.pcap")   # what was captured since, as a pcap file

    Each is one outer.run() (a guest's command agent: ~0.05 s). A scenario's part is capped at
    max_bytes; the file is started afresh once it outgrows max_file. NetnsHosts.close() (and
    the interpreter's exit) stops it and removes the file.
    """

    _live: dict = {}  # (machine name, bridge) -> BridgeCapture

    def __init__(self, machine: Machine, bridge: str, max_bytes: int = 8 << 20,
                 max_file: int = 64 << 20):
        self.machine, self.bridge = machine, bridge
        self.max_bytes, self.max_file = max_bytes, max_file
        base = f"/tmp/rdmalab-bridge-{bridge}-{os.getpid()}-{time.monotonic_ns()}"
        self.path, self.log = base + ".pcap", base + ".log"
        self.pid: Optional[int] = None

    @classmethod
    def shared(cls, machine: Machine, bridge: str, **kw) -> "BridgeCapture":
        """The capture of this bridge on this machine, made on first use."""
        key = (machine.name, bridge)
        cap = cls._live.get(key)
        if cap is None or cap.machine is not machine:
            if cap is not None:
                cap.close()
            cap = cls._live[key] = cls(machine, bridge, **kw)
        return cap

    @classmethod
    def close_all(cls, machine: Optional[Machine] = None, bridge: Optional[str] = None) -> None:
        for key, cap in list(cls._live.items()):
            if (machine is None or cap.machine is machine) and (bridge is None
                                                                 or cap.bridge == bridge):
                del cls._live[key]
                cap.close()

    def mark(self, deadline_s: float = 10.0, probe=None) -> int:
        """The capture file's size now (where a scenario's part starts); tcpdump is started
        first when none runs (or it died, or its file outgrew max_file). probe(path, pid) ->
        (alive, size): a cheaper look than a command where the caller has one (a process on
        the outer's file system: rdmalab.report.evidence asks a host's agent)."""
        if probe is not None and self.pid is not None:
            alive, size = probe(self.path, self.pid)
            if alive and size < self.max_file:
                return size
        q = shlex.quote
        tries = max(1, int(deadline_s / 0.02))
        alive = (f"[ -n \"$old\" ] && [ -e /proc/$old ] && ! grep -q '^State:.*Z' "
                 f"/proc/$old/status 2>/dev/null")
        gone = f"rm -f {q(self.path)} {q(self.log)}"
        # -U and --immediate-mode: each packet in the file as it is captured; -Z root: no
        # switch to the tcpdump user, whose rights may not reach the file.
        script = (f"{_PATH}old={self.pid or ''}; size=$(stat -c %s {q(self.path)} 2>/dev/null "
                  f"|| echo 0); if {alive} && [ $size -lt {int(self.max_file)} ]; then "
                  f"echo \"$old $size\"; exit 0; fi; "
                  f"[ -n \"$old\" ] && kill -9 $old 2>/dev/null; rm -f {q(self.path)}; "
                  f"setsid tcpdump -i {q(self.bridge)} -U --immediate-mode -n -Z root "
                  f"-w {q(self.path)} >{q(self.log)} 2>&1 </dev/null & pid=$!; i=0; "
                  f"until grep -q 'listening on' {q(self.log)} 2>/dev/null; do "
                  f"kill -0 $pid 2>/dev/null || {{ cat {q(self.log)} >&2; {gone}; exit 2; }}; "
                  f"i=$((i+1)); [ $i -ge {tries} ] && {{ kill -9 $pid; cat {q(self.log)} >&2; "
                  f"{gone}; exit 3; }}; sleep 0.02; done; "
                  f"echo \"$pid $(stat -c %s {q(self.path)})\"")
        r = self.machine.run(script, deadline_s + CMD_TIMEOUT_S, root=True)
        words = r.out.split()
        if r.rc != 0 or len(words) != 2 or not all(w.isdigit() for w in words):
            self.pid = None
            why = {2: "exited", 3: f"did not listen within {deadline_s} s"}.get(
                r.rc, f"rc {r.rc}: {r.out.strip()[-200:]}")
            raise MachineError(f"{self.machine.name}: tcpdump on {self.bridge} {why} (tcpdump "
                               f"is Debian's tcpdump package): {r.err.strip()[-500:]}")
        self.pid = int(words[0])
        return int(words[1])

    def take(self, offset: int, local: str, read=None) -> dict:
        """What the capture holds past offset, as a pcap file at `local` (the file's own header
        first; at most max_bytes of records, the last possibly cut), read once tcpdump has
        written every frame the kernel handed it (asleep in poll, its file's size unchanged:
        at most 2 s). {"bytes": n, "capped": why} when the part was larger. read(path, offset,
        max_bytes, pid) -> (header, part, size): a cheaper read than a command where the caller
        has one (rdmalab.report.evidence.file_part, which waits the same way)."""
        if read is not None:
            header, data, size = read(self.path, offset, self.max_bytes, self.pid or 0)
            return self._write(local, header, data, size - int(offset))
        import base64
        q = shlex.quote
        # The drain wait of rdmalab.report.evidence.capture_drained, in sh: State S (field 3 of stat)
        # with the size unchanged around it, looked at until 2 s have passed (a deadline, not
        # a count: each look forks, which costs a TCG guest far more than its 5 ms sleep).
        drain = ("" if not self.pid else
                 f"pid={int(self.pid)}; end=$(( $(date +%s%N) + 2000000000 )); "
                 f"last=$(stat -c %s {q(self.path)}); "
                 f"while [ $(date +%s%N) -lt $end ]; do st=$(cut -d')' -f2 /proc/$pid/stat "
                 f"2>/dev/null | cut -d' ' -f2) || break; [ -n \"$st\" ] || break; "
                 f"now=$(stat -c %s {q(self.path)}); [ \"$st\" = S ] && [ $now = $last ] "
                 f"&& break; last=$now; sleep 0.005; done; ")
        script = (f"{drain}size=$(stat -c %s {q(self.path)}) || exit 1; echo \"size $size\" >&2; "
                  f"head -c 24 {q(self.path)} | base64 -w0; echo; "
                  f"tail -c +{int(offset) + 1} {q(self.path)} | head -c {int(self.max_bytes)} "
                  f"| base64 -w0; echo")
        r = self.machine.run(script, CMD_TIMEOUT_S, root=True)
        lines = r.out.split("\n")
        if r.rc != 0 or len(lines) < 2:
            raise MachineError(f"{self.machine.name}: reading the capture of {self.bridge} "
                               f"({self.path}): rc {r.rc}: {r.err.strip()[-500:]}")
        header, data = base64.b64decode(lines[0]), base64.b64decode(lines[1])
        m = re.search(r"size (\d+)", r.err)
        return self._write(local, header, data, int(m.group(1)) - int(offset) if m
                           else len(data))

    def _write(self, local: str, header: bytes, data: bytes, part: int) -> dict:
        if len(header) != 24:
            raise MachineError(f"{self.machine.name}: the capture of {self.bridge} has no pcap "
                               f"header ({len(header)} bytes)")
        with open(local, "wb") as f:
            f.write(header + data)
        stats: dict = {"bytes": part}
        if part > self.max_bytes:
            stats["capped"] = f"{self.max_bytes} of {part} bytes"
        return stats

    def close(self) -> None:
        """Stops tcpdump and removes its files (a machine already gone is fine)."""
        pid, self.pid = self.pid, None
        try:
            self.machine.run(f"{'kill -9 %d 2>/dev/null; ' % pid if pid else ''}"
                             f"rm -f {shlex.quote(self.path)} {shlex.quote(self.log)}",
                             CMD_TIMEOUT_S, root=True)
        except (MachineError, OSError):
            pass


atexit.register(BridgeCapture.close_all)
