"""The VM lab as a Lab: soft-RoCE (rxe) or soft-iWARP (siw) hosts in qemu (lab/vmlab), each
running the host agent (rdmalab.agent) under execnet over SSH, the path real hosts will use.

    pool = VmPool(n=2, rdma="rxe")          # boots once; reused by every lab
    with pool.lab(seed=1) as lab:           # hosts "a", "b": fresh verbs labs in the agents
        pair = RCPair(lab)                  # built in the agents; proxies here
    pool.close()

The controller's clock is its CLOCK_MONOTONIC; each agent's offset is measured at start, so the
merged history orders records of all hosts on one time line.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import shutil
import sys
import threading
import time
from typing import Callable, Iterable, Optional, Union

from .errors import FaultNotSupported, Hung
from .errors import make_error as _make_error
from .faults import NoFaults
from .remote import Agent

REPO = pathlib.Path(__file__).resolve().parents[2]
HISTORY_TAIL = 50
POLL_S = 0.002
DATA_NETDEV = "eth0"  # the guest NIC on the switch (lab/vmlab/init.sh)


def qemu_unavailable() -> Optional[str]:
    """Why this machine cannot run the VM lab, or None if it can."""
    if shutil.which("qemu-system-x86_64") is None:
        return "qemu-system-x86_64 is not installed (make vmlab-deps)"
    if shutil.which("ssh") is None or not os.path.exists("/usr/sbin/sshd"):
        return "openssh client/server are not installed (make vmlab-deps)"
    try:
        import execnet  # noqa: F401
        import rpyc  # noqa: F401
    except ImportError as e:
        return f"python3-execnet / python3-rpyc missing: {e}"
    return None


def _vmlab():
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from lab.vmlab import vm as vm_mod
    return vm_mod


class VmPool:
    """N booted VMs with their agents; labs come and go on them."""

    def __init__(self, n: int = 2, rdma: str = "rxe", boot_deadline_s: float = 180.0):
        if rdma not in ("rxe", "siw"):
            raise ValueError(f"VM lab device {rdma!r}: rxe or siw")
        why = qemu_unavailable()
        if why:
            raise RuntimeError(f"the VM lab cannot run here: {why}")
        vm_mod = _vmlab()
        self.rdma, self.n = rdma, n
        self.vmlab = vm_mod.Lab(n, rdma=rdma)
        self.agents: list[Agent] = []
        self.used: dict[str, int] = {}  # VM name -> labs run on it since its last boot
        self.boot_s = 0.0
        t0 = time.monotonic()
        try:
            self.vmlab.start_all()
            self.vmlab.wait_all_ready(boot_deadline_s)
            self.boot_s = time.monotonic() - t0
            for vm in self.vmlab.vms:
                self.agents.append(self.start_agent(vm))
            self.warm_data_path()
        except BaseException:
            self.close()
            raise

    def warm_data_path(self, vms=None, deadline_s: float = 30.0) -> None:
        """Each VM (of vms, default all) resolves every other's data address (ARP) before a
        scenario does: on a just-booted TCG guest the first rdma_resolve_addr otherwise spent
        over a second on it (seen on siw). Also proves the switch carries frames."""
        vms = list(vms or self.vmlab.vms)
        end = time.monotonic() + deadline_s
        for vm in vms:
            for peer in self.vmlab.vms:
                if peer is vm:
                    continue
                ip = peer.spec.ip
                poke = (f"/usr/bin/python3 -c \"import socket; socket.socket(socket.AF_INET, "
                        f"socket.SOCK_DGRAM).sendto(b'rdmalab', ('{ip}', 9))\"; "
                        f"ip neigh show {ip} dev {DATA_NETDEV}")
                while True:
                    out = vm.run(poke, 30).out
                    if "REACHABLE" in out or "STALE" in out or "DELAY" in out:
                        break
                    if time.monotonic() > end:
                        raise Hung(f"{vm.spec.name}: ARP {ip}", f"{vm.spec.name} cannot "
                                   f"resolve {ip} on {DATA_NETDEV} after {deadline_s} s: {out!r}")
                    time.sleep(0.1)

    def start_agent(self, vm) -> Agent:
        """A new agent (its own python process) in vm, over a new SSH session."""
        import execnet
        gw = execnet.makegateway(f"ssh=-F {self.vmlab.ssh_config} {vm.spec.name}"
                                 f"//python=/usr/bin/python3")
        return Agent.start(gw, vm.spec.name)

    def replace_agent(self, old: Agent, vm) -> Agent:
        """A fresh agent on vm (after a reboot) in old's place."""
        new = self.start_agent(vm)
        self.agents[self.agents.index(old)] = new
        return new

    def heal(self) -> list[str]:
        """Reboots each VM whose agent is broken (a shutdown stuck in the kernel, a lost
        channel) and starts a fresh agent there; returns what was healed and why."""
        healed = []
        for i, agent in enumerate(self.agents):
            if not agent.broken:
                continue
            vm = self.vmlab.vms[i]
            healed.append(f"{vm.spec.name}: {agent.broken}")
            agent.close(deadline_s=5.0)
            vm.reboot()
            self.used[vm.spec.name] = 0
            self.agents[i] = self.start_agent(vm)
            self.warm_data_path([vm])
        return healed

    @property
    def vms(self):
        return self.vmlab.vms

    @property
    def workdir(self) -> pathlib.Path:
        return self.vmlab.workdir

    def lab(self, seed: int = 1, hosts: Iterable[str] = ("a", "b")) -> "VmLab":
        return VmLab(self, seed, list(hosts))

    def close(self) -> None:
        for agent in self.agents:
            agent.close()
        self.agents.clear()
        self.vmlab.close()


class NftRule:
    """A wire rule installed as nftables rules in the sending hosts' output hooks (rdmalab.nft):
    `hits` is what their counters saw; `remove()` takes them out."""

    def __init__(self, faults: "VmFaults", action: str, fields: dict, installed: dict):
        self.action, self.fields = action, fields
        self._faults, self._installed = faults, installed  # host -> nft handle

    @property
    def hits(self) -> int:
        from . import nft
        total = 0
        for host, handle in self._installed.items():
            out = self._faults._nft(host, f"nft -j list chain inet {nft.TABLE} {nft.CHAIN}")
            total += nft.rule_packets(out, handle)
        return total

    def remove(self) -> None:
        from . import nft
        for host, handle in list(self._installed.items()):
            self._faults._nft(host, f"nft delete rule inet {nft.TABLE} {nft.CHAIN} handle {handle}")
            del self._installed[host]

    def __repr__(self) -> str:
        return f"<NftRule {self.action} {self.fields} on {sorted(self._installed)}>"


class SwitchRule:
    """A wire rule in the lab's fault switch: `hits` is the frames it acted on (a watch rule:
    the frames it counted); `remove()` takes it out."""

    def __init__(self, faults: "VmFaults", action: str, rule: dict, rule_id: int):
        self.action, self.rule, self.id = action, rule, rule_id
        self._faults = faults

    @property
    def hits(self) -> int:
        for r in self._faults._switch().request("rules")["rules"]:
            if r["id"] == self.id:
                return int(r["acted"])
        return self._final_hits

    _final_hits = 0

    def remove(self) -> None:
        self._final_hits = self.hits
        self._faults._switch().request("remove_rule", id=self.id)

    def __repr__(self) -> str:
        return f"<SwitchRule {self.id} {self.rule}>"


class VmFaults(NoFaults):
    """The faults the VM lab applies: link down/up of a host's data NIC (rxe and siw raise
    PORT_ERR / PORT_ACTIVE from the netdev's carrier), and wire rules (drop, watch) as
    nftables rules inside the sending guests, which rxe and siw traffic passes through. Rules
    with a Python predicate or a packet count, delays and duplicates need the fault switch; they
    raise FaultNotSupported, as do reboots and process kills for now."""

    def __init__(self, lab: "VmLab"):
        super().__init__(lab)
        self._counts: dict[str, int] = {}
        self._down: set[str] = set()
        self._rules: list[NftRule] = []
        self._nft_ready: set[str] = set()
        self._removed: dict = {}  # host -> (device, the background `rdma link delete`)
        self._control = None  # SwitchControl, connected at the first switch rule
        self._switch_rules: list[SwitchRule] = []
        self._switch_records: list[dict] = []
        self._since = 0  # the switch's history seq at this lab's first rule

    # -- wire rules (nftables in the guests)
    def _nft(self, host: str, cmd: str) -> str:
        vm = self._lab.vm_of(host)
        return vm.run(cmd, 30).check(f"{host}: {cmd}").out

    def _wire_rule(self, fault: str, verdict: str, match, count, fields: dict) -> NftRule:
        from . import nft
        from .faults import expand_cm
        if match is not None:
            raise FaultNotSupported(fault, "a Python predicate cannot run in the guest's "
                                    "nftables: give the fields (cm=, opcode=, dest_qpn=, ...)")
        if count is not None:
            raise FaultNotSupported(fault, "nftables counts bytes, not packets: count= needs "
                                    "the fault switch")
        fields = expand_cm(fields)
        transport = "iwarp" if self._lab.pool.rdma == "siw" else "roce"
        expr = nft.match_expr(fields, self._lab.addresses, transport, DATA_NETDEV)
        src = fields.get("src_host")
        hosts = [src] if src is not None else list(self._lab.addresses)
        installed = {}
        for host in hosts:
            if host not in self._nft_ready:
                self._nft(host, nft.setup_commands())
                self._nft_ready.add(host)
            out = self._nft(host, nft.add_rule_command(expr, verdict, f"rdmalab {fault}"))
            handle = nft.parse_handle(out)
            if handle is None:
                raise RuntimeError(f"{host}: nft printed no rule handle: {out!r}")
            installed[host] = handle
        rule = NftRule(self, fault, fields, installed)
        self._rules.append(rule)
        self._lab.record("fault", object="nft", fault=fault, fields=fields, expr=expr,
                         hosts=sorted(installed))
        return rule

    # -- devices
    def device_fatal(self, host) -> None:
        """Removes the host's RDMA device, as a driver unload or a fatal firmware error would:
        rdma_link_delete; the device comes back when the lab shuts down, after its contexts
        are closed (or earlier with rdma_link_add)."""
        self.rdma_link_delete(host, fault="device_fatal")

    def rdma_link_delete(self, host, *, fault: str = "rdma_link_delete") -> None:
        """`rdma link delete` of the host's soft device. The command may block while user
        contexts stay open (a provider without disassociate_ucontext), so it runs in the
        background; rdma_link_add (or the lab's shutdown) waits for it."""
        import subprocess as sp
        name = host if isinstance(host, str) else host.name
        if name in self._removed:
            raise _make_error("rdma link delete", errno.EBUSY, f"{name}: its device is already being removed")
        vm = self._lab.vm_of(name)
        dev = f"{self._lab.pool.rdma}0"
        argv = ["ssh", "-F", str(self._lab.pool.vmlab.ssh_config), vm.spec.name,
                f"rdma link delete {dev}"]
        self._removed[name] = (dev, sp.Popen(argv, stdin=sp.DEVNULL, stdout=sp.PIPE,
                                              stderr=sp.STDOUT))
        self._counts[fault] = self._counts.get(fault, 0) + 1
        self._lab.record("fault", object="device", host=name, fault=fault,
                         command=f"rdma link delete {dev}")

    def rdma_link_add(self, host, deadline_s: float = 30.0) -> None:
        """`rdma link add` of the device rdma_link_delete removed, once the removal has
        finished (Hung if it is still blocked after deadline_s: a context is still open);
        returns when the port is ACTIVE and usable."""
        name = host if isinstance(host, str) else host.name
        if name not in self._removed:
            raise _make_error("rdma link add", errno.ENODEV, f"{name}: no device of it was deleted")
        self._restore(name, deadline_s, hung=True)
        self._counts["rdma_link_add"] = self._counts.get("rdma_link_add", 0) + 1

    def note_removals(self) -> None:
        """Records, before the lab's contexts close, whether each removal still blocks."""
        for name, (dev, proc) in self._removed.items():
            self._lab.record("device_removal_state", object="device", host=name, device=dev,
                             blocked=proc.poll() is None)

    def restore_devices(self, deadline_s: float = 30.0) -> None:
        """After the lab's contexts are closed: waits for each removal, adds the device back
        and waits for its port. A removal still blocked marks the host for a reboot."""
        for name in list(self._removed):
            self._restore(name, deadline_s, hung=False)

    def _restore(self, name: str, deadline_s: float, hung: bool) -> None:
        import subprocess as sp
        dev, proc = self._removed[name]
        try:
            out, _ = proc.communicate(timeout=deadline_s)
        except sp.TimeoutExpired:
            if hung:  # the scenario still holds a context: say so, keep waiting at shutdown
                raise Hung(f"{name}: rdma link delete {dev}", f"rdma link delete {dev} on "
                           f"{name} still blocks after {deadline_s} s: a user context on it "
                           "is still open") from None
            del self._removed[name]
            proc.kill()
            self._lab.agent_for(name).broken = f"rdma link delete {dev} still blocked"
            return
        del self._removed[name]
        self._lab.record("device_removed", object="device", host=name, rc=proc.returncode,
                         output=out.decode(errors="replace")[-500:])
        vm = self._lab.vm_of(name)
        vm.run(f"rdma link add {dev} type {self._lab.pool.rdma} netdev {DATA_NETDEV}",
               30).check(f"{name}: rdma link add {dev}")
        self._lab.record("device_added", object="device", host=name, device=dev)
        self._wait_usable(name, vm)

    # -- hosts
    def reboot(self, host, down_ns: int) -> None:
        """SIGKILL the host's qemu (a crash: nothing is closed, nothing sent), wait down_ns,
        boot it again on the same switch port, MAC and address, and start a fresh agent and
        lab there. Returns once the host is back: its earlier objects are gone."""
        name = host if isinstance(host, str) else host.name
        self._lab.reboot_host(name, down_ns)
        self._nft_ready.discard(name)  # the rebooted guest has no rules
        self._rules = [r for r in self._rules if name not in r._installed]
        self._counts["reboot"] = self._counts.get("reboot", 0) + 1

    # -- wire rules in the fault switch
    def _switch(self):
        from .fabric import SwitchControl
        if self._control is None:
            path = self._lab.pool.vmlab.switch_control
            if path is None:
                raise FaultNotSupported("switch", "the VM lab runs the Python learning switch "
                                        "(build/faults/rdmalab-switch is not built): no rules")
            self._control = SwitchControl(path)
            since = 0  # the end of what earlier labs left in the switch's history
            while True:
                page = self._control.request("history", since=since)
                if not page["records"]:
                    break
                since = page["last_seq"]
            self._since = since
            self._control.request("hosts", hosts={
                n: {"mac": vm.spec.data_mac, "ip": vm.spec.ip}
                for n, vm in ((n, self._lab.vm_of(n)) for n in self._lab.addresses)})
        return self._control

    def _switch_rule(self, action: str, match, fields: dict, **params) -> SwitchRule:
        if match is not None:
            raise FaultNotSupported(action, "a Python predicate cannot run in the switch: give "
                                    "the fields (cm=, opcode=, dest_qpn=, tcp_flags=, ...)")
        rule = {"action": action, **{k: v for k, v in fields.items() if v is not None},
                **{k: v for k, v in params.items() if v is not None}}
        rid = self._switch().request("add_rule", rule=rule)["id"]
        handle = SwitchRule(self, action, rule, rid)
        self._switch_rules.append(handle)
        self._lab.record("fault", object="switch", fault=action, rule=rule, id=rid)
        return handle

    def _where(self, at: Optional[str]) -> str:
        if at is None:
            return "switch" if self._lab.pool.vmlab.switch_control is not None else "host"
        if at not in ("switch", "host"):
            raise ValueError(f"at={at!r}: 'switch' (the fault switch) or 'host' (nftables in "
                             "the sending guest)")
        return at

    def drop(self, match=None, *, count=None, every=None, probability=None,
             at: Optional[str] = None, **fields):
        """Drops matching packets: in the fault switch (default), or with at="host" where they
        leave the sending guest (nftables; all hosts unless src_host=)."""
        if self._where(at) == "host":
            if every is not None or probability is not None:
                raise FaultNotSupported("drop", "nftables counts bytes: every=/probability= "
                                        "need the fault switch")
            rule = self._wire_rule("drop", "drop", match, count, fields)
            self._counts["drop"] = self._counts.get("drop", 0)  # read from the counters
            return rule
        return self._switch_rule("drop", match, fields, count=count, every=every,
                                 probability=probability)

    def watch(self, match=None, *, at: Optional[str] = None, **fields):
        """Counts matching packets without touching them (rule.hits)."""
        if self._where(at) == "host":
            return self._wire_rule("watch", "accept", match, None, fields)
        return self._switch_rule("watch", match, fields)

    def delay(self, match=None, *, delay_ns: int, count=None, every=None, probability=None,
              **fields) -> SwitchRule:
        return self._switch_rule("delay", match, fields, delay_ns=delay_ns, count=count,
                                 every=every, probability=probability)

    def duplicate(self, match=None, *, count=None, every=None, probability=None,
                  **fields) -> SwitchRule:
        return self._switch_rule("duplicate", match, fields, count=count, every=every,
                                 probability=probability)

    def reorder(self, match=None, *, hold_ns=None, count=None, **fields) -> SwitchRule:
        return self._switch_rule("reorder", match, fields, hold_ns=hold_ns, count=count)

    def corrupt(self, match=None, *, layer: str, offset: int, xor: int = 0xFF, count=None,
                **fields) -> SwitchRule:
        """Flips bits at `offset` of `layer` ("bth", "mpa", "ddp", ...) and recomputes the
        checksums checked before that layer (IPv4, UDP/TCP, ICRC, MPA CRC), so the corruption
        reaches it."""
        return self._switch_rule("corrupt", match, fields, layer=layer, offset=offset, xor=xor,
                                 count=count)

    def _await_releases(self, deadline_s: float = 5.0) -> list[dict]:
        """The switch's records once every delayed or held frame has its release record (at
        most deadline_s: a longer delay is recorded as still pending)."""
        end = time.monotonic() + deadline_s
        while True:
            records = self.switch_history()
            held = {r.get("seq") for r in records if r.get("action") in ("delay", "reorder")}
            released = {r.get("of_seq") for r in records if r.get("action") == "release"}
            if held <= released:
                return records
            if time.monotonic() > end:
                self._lab.record("switch_holds_pending", object="switch",
                                 seqs=sorted(held - released))
                return records
            time.sleep(0.02)

    def switch_history(self) -> list[dict]:
        """The switch's records (every rule action) since this lab's first switch rule."""
        if self._control is None:
            return list(self._switch_records)
        return self._switch().request("history", since=self._since)["records"]

    def _ip_link(self, host, state: str) -> None:
        name = host if isinstance(host, str) else host.name
        vm = self._lab.vm_of(name)
        vm.run(f"ip link set {DATA_NETDEV} {state}", 30).check(f"{name}: ip link set {state}")
        if state == "up":
            self._wait_usable(name, vm)
        self._counts[f"port_{state}"] = self._counts.get(f"port_{state}", 0) + 1
        self._lab.record("fault", object="link", host=name, fault=f"port_{state}",
                         netdev=DATA_NETDEV)
        (self._down.add if state == "down" else self._down.discard)(name)

    @staticmethod
    def _wait_usable(name: str, vm, deadline_s: float = 30.0) -> None:
        """Up is not usable yet: the port must be ACTIVE again and the link-local address (the
        GID RoCEv2 routes by) past duplicate address detection, or modify to RTR fails with
        ETIMEDOUT resolving the peer."""
        probe = (f"cat /sys/class/infiniband/*/ports/1/state; "
                 f"ip -6 addr show dev {DATA_NETDEV} tentative")
        end = time.monotonic() + deadline_s
        while True:
            out = vm.run(probe, 30).out
            if "ACTIVE" in out and "inet6" not in out:
                return
            if time.monotonic() > end:
                raise Hung(f"{name}: link up", f"{name}: {DATA_NETDEV} not usable "
                           f"{deadline_s} s after link up:\n{out}")
            time.sleep(0.1)

    def port_down(self, host) -> None:
        self._ip_link(host, "down")

    def port_up(self, host) -> None:
        self._ip_link(host, "up")

    def counts(self) -> dict[str, int]:
        """Faults applied so far; "drop" is the packets the drop rules' counters saw."""
        counts = {k: v for k, v in self._counts.items() if k != "drop"}
        drops = sum(r.hits for r in self._rules if r.action == "drop")
        for r in self._switch_rules:
            if r.action != "watch":
                counts[r.action] = counts.get(r.action, 0) + r.hits
        drops += counts.pop("drop", 0)
        if drops or "drop" in self._counts or any(r.action == "drop" for r in self._switch_rules):
            counts["drop"] = drops
        return counts

    def clear(self) -> None:
        from . import nft
        for name in list(self._down):  # the next lab on these VMs starts with links up
            self.port_up(name)
        for host in list(self._nft_ready):  # and with no rules
            self._nft(host, f"nft delete table inet {nft.TABLE}")
        self._nft_ready.clear()
        self._rules.clear()
        if self._control is not None:
            self._control.request("clear")  # no new holds; frames held already still go
            # Kept for the lab's history, with the release of every frame it held back.
            self._switch_records = self._await_releases()
            self._control.close()
            self._control = None
        self._switch_rules.clear()

    def _unsupported_reason(self, fault: str) -> str:
        return (f"the VM lab ({self._lab.description}) cannot apply {fault} yet (process "
                "kills, injected events and verb hooks are the model's)")


class VmProcess:
    """A process of a VM host that is an OS process of its own: a second agent in the guest
    (python over its own SSH session), whose verbs lab has just this process. Its objects
    live there, so kill() is a real SIGKILL: the guest kernel releases them (uverbs, ucma) as
    it does for any process that dies."""

    def __init__(self, lab: "VmLab", host: str, name: str):
        self._lab, self.name, self._host_name = lab, name, host
        self._agent = lab.pool.start_agent(lab.vm_of(host))
        try:
            self._agent.new_lab(lab.seed, host, lab.addresses)
            self.host = self._agent.lab.host(host)
            self._proc = self.host.process(name)
            self.pid = int(self._agent.module("os").getpid())
        except BaseException:
            self._agent.close(deadline_s=5.0)
            raise
        self._killed = False
        self._tids = {self.pid}

    @property
    def alive(self) -> bool:
        return not self._killed

    @property
    def agent(self) -> Optional[Agent]:
        return None if self._killed else self._agent

    def _live(self, verb: str):
        if self._killed:
            raise _make_error(verb, errno.ESRCH, f"proc:{self.name} (pid {self.pid}) was killed")
        return self._proc

    def open_device(self, device_name: str = ""):
        return self._live("ibv_open_device").open_device(device_name)

    def event_channel(self, workers: int = 2):
        return self._live("rdma_create_event_channel").event_channel(workers)

    def kernel_objects(self) -> dict[str, int]:
        """`rdma res show` in the guest for this process (it works after the kill too).
        restrack names the thread that made each object (its TID, not the process's PID), so
        the threads seen while the process lived count as its own."""
        self._note_threads()
        return self._lab.kernel_resources(self._host_name, self._tids)

    def _note_threads(self) -> None:
        if self._killed:
            return
        try:
            tids = self._lab.agent_for(self._host_name).module("os").listdir(
                f"/proc/{self.pid}/task")
        except Exception:  # gone
            return
        self._tids |= {int(t) for t in tids}

    def records(self) -> list[dict]:
        return [] if self._killed else self._lab._agent_records(self._agent)

    def kill(self) -> None:
        """SIGKILL from the host's main agent; returns once the process is gone (its pid no
        longer in /proc). Its history so far is kept; nothing it would have recorded after."""
        if self._killed:
            return
        self._lab._archive(self.records, self._host_name, f"proc:{self.name}")
        self._lab.record("fault", object=f"proc:{self.name}", host=self._host_name,
                         fault="kill", pid=self.pid)
        self._note_threads()
        main = self._lab.agent_for(self._host_name)
        os_mod = main.module("os")
        os_mod.kill(self.pid, 9)
        self._killed = True
        self._agent.broken = "SIGKILLed by a kill fault"
        self._agent.lab = None
        end = time.monotonic() + 10.0
        while "zombie" not in _proc_state(main, self.pid):
            if time.monotonic() > end:
                raise Hung(f"kill {self.name}", f"pid {self.pid} on {self._host_name} still "
                           "runs 10 s after SIGKILL")
            time.sleep(0.01)
        self._agent.close(deadline_s=5.0)

    def close(self) -> None:
        """Lab shutdown: a live process closes its lab (objects released in order)."""
        if self._killed:
            return
        self._killed = True
        try:
            self._agent.close_lab()
        finally:
            self._agent.close(deadline_s=5.0)

    def __repr__(self) -> str:
        state = "killed" if self._killed else "alive"
        return f"<VmProcess {self.name} pid {self.pid} on {self._host_name} ({state})>"


def _proc_state(agent: Agent, pid: int) -> str:
    try:
        with agent.module("builtins").open(f"/proc/{pid}/status") as f:
            for line in f.read().splitlines():
                if line.startswith("State:"):
                    return line
    except Exception:  # no /proc entry: gone (reaped)
        return "zombie (gone)"
    return ""


class VmLab:
    """A Lab whose hosts are VMs of a pool: the same API as rdmalab.Lab (hosts, faults, waits,
    history), with every host's objects in that VM's agent."""

    backend = "verbs"
    replayable = False
    # TCG guests: CM timers and events were seen up to ~260 ms late (docs/vmlab.md).
    tolerance_ns = 500 * 10**6

    def __init__(self, pool: VmPool, seed: int, names: list[str]):
        if len(names) > len(pool.agents):
            raise FaultNotSupported("hosts", f"the VM lab has {len(pool.agents)} hosts; the "
                                    f"scenario wants {len(names)} ({', '.join(names)})")
        healed = pool.heal()  # a stuck agent from an earlier lab: rebooted first
        self.pool, self.seed = pool, seed
        self.description = f"vm:{pool.rdma}"
        self.replay = ""
        self._t0 = time.monotonic_ns()
        self._agents = dict(zip(names, pool.agents))
        self._vms = dict(zip(names, pool.vms))
        self.addresses = {n: vm.spec.ip for n, vm in self._vms.items()}
        for name, agent in self._agents.items():
            agent.new_lab(seed, name, self.addresses)
            vm_name = self._vms[name].spec.name
            pool.used[vm_name] = pool.used.get(vm_name, 0) + 1  # labs since its boot
        self._faults = VmFaults(self)
        self._records: list[dict] = []
        self._archived: list[dict] = []  # records of agents lost to a reboot or a kill
        self._procs: list[VmProcess] = []  # killable processes (agents of their own)
        self._shutdown_hooks: list[Callable[["VmLab"], None]] = []
        self._lock = threading.Lock()
        self._shut = False
        self.record("lab_start", object="lab", lab=self.description,
                    vms={n: vm.spec.name for n, vm in self._vms.items()}, healed=healed)

    # -- hosts
    now_ns = property(lambda self: time.monotonic_ns())

    @property
    def hosts(self) -> dict:
        return {n: a.lab.host(n) for n, a in self._agents.items()}

    def host(self, name: str):
        if name not in self._agents:
            raise KeyError(f"no host {name!r} in {self.description}; hosts: "
                           f"{', '.join(self._agents)}")
        return self._agents[name].lab.host(name)

    def agent_for(self, name: str) -> Optional[Agent]:
        return self._agents.get(name)

    def vm_of(self, name: str):
        return self._vms[name]

    def killable_process(self, host: str, name: str) -> VmProcess:
        """A process that kill() SIGKILLs: an OS process of its own in the guest (a second
        agent, started over SSH: a few seconds on TCG), not a part of the host's agent."""
        if host not in self._agents:
            raise KeyError(f"no host {host!r} in {self.description}; hosts: "
                           f"{', '.join(self._agents)}")
        proc = VmProcess(self, host, name)
        self._procs.append(proc)
        self.record("process_start", object=f"proc:{name}", host=host, pid=proc.pid)
        return proc

    def kernel_resources(self, host: str, pids: set[int]) -> dict[str, int]:
        """What the guest's kernel still holds for these pids (restrack records the creating
        thread's TID, so a process is the set of its threads), by kind (`rdma res show`: qp,
        cq, pd, mr, cm_id, ctx, srq); kinds with none are left out."""
        out = {}
        vm = self._vms[host]
        for kind in ("qp", "cq", "pd", "mr", "cm_id", "ctx", "srq"):
            res = vm.run(f"rdma -j res show {kind}", 30)
            if res.rc != 0:  # a kind this iproute2 or kernel does not list
                continue
            try:
                entries = json.loads(res.out or "[]")
            except ValueError as e:
                raise RuntimeError(f"{host}: rdma -j res show {kind}: {e}: {res.out!r}") from e
            n = sum(1 for e in entries if isinstance(e, dict) and e.get("pid") in pids)
            if n:
                out[kind] = n
        return out

    def devices_by_host(self) -> dict[str, str]:
        """host -> the device label metrics use ("rxe", "siw")."""
        return {name: self.pool.rdma for name in self._agents}

    def on_shutdown(self, fn: Callable[["VmLab"], None]) -> None:
        """fn(lab) after the lab has shut down, its history complete (metrics ingest it)."""
        self._shutdown_hooks.append(fn)

    def _archive(self, fetch: Callable[[], list[dict]], host: str, object: str) -> None:
        """Keeps fetch()'s records past their agent (a reboot, a kill, shutdown); an agent that
        cannot answer any more loses them, and the history says so."""
        try:
            records = fetch()
        except Exception as e:
            records = []
            self.record("history_lost", object=object, host=host, error=str(e))
        with self._lock:
            self._archived += records

    def address_of(self, host: str) -> str:
        return self.addresses.get(host, host)

    @property
    def faults(self) -> VmFaults:
        return self._faults

    # -- time (wall clock: devices run on their own)
    def run_for(self, duration_ns: int) -> None:
        time.sleep(duration_ns / 1e9)
        self.check_errors()

    sleep = run_for

    def wait_until(self, pred: Callable[[], bool], timeout_ns: int = 10 * 10**9,
                   what: str = "condition") -> None:
        start = self.now_ns
        end = start + timeout_ns
        while not pred():
            if self.now_ns >= end:
                raise Hung(what, self.diagnostic(f"waited {timeout_ns} ns for {what}"))
            time.sleep(POLL_S)
        self.check_errors()

    def spawn(self, name: str, fn: Callable[[], None]) -> None:
        threading.Thread(target=fn, name=name, daemon=True).start()

    # -- history
    def record(self, kind: str, object: str = "scenario", host: str = "", **data) -> int:
        with self._lock:
            seq = len(self._records)
            self._records.append({"seq": seq, "t_ns": self.now_ns - self._t0, "host": host,
                                  "object": object, "kind": kind, "data": data})
        return seq

    def history(self, since_seq: int = 0) -> list[dict]:
        """Every host's records and the controller's on the controller's time line (t_ns from
        the lab's start), ordered by time; seq renumbered, each host's own seq kept as
        host_seq."""
        merged = []
        for agent in self._agents.values():
            merged += self._agent_records(agent)
        for proc in self._procs:
            merged += proc.records()
        for r in self._faults.switch_history():  # the switch runs on this machine's clock
            merged.append({"seq": 0, "host_seq": r.get("seq", 0), "t_ns": r.get("t_ns", 0) - self._t0,
                           "host": "switch", "object": f"rule:{r.get('rule', '')}",
                           "kind": f"switch_{r.get('action', 'record')}", "data": r})
        with self._lock:
            merged += [dict(r) for r in self._archived]
            merged += [dict(r, host_seq=r["seq"]) for r in self._records]
        merged.sort(key=lambda r: (r["t_ns"], r["host"], r["host_seq"]))
        for i, r in enumerate(merged):
            r["seq"] = i
        return merged[since_seq:]

    def _agent_records(self, agent: Agent) -> list[dict]:
        if agent.lab is None:
            return []
        out = []
        for line in agent.lab._o.history_jsonl().splitlines():
            r = json.loads(line)
            r["host_seq"] = r.pop("seq")
            r["t_ns"] -= self._t0  # the agent's clock is offset onto ours
            out.append(r)
        return out

    def fresh_hosts(self, *names: str) -> None:
        """Reboots each of these hosts whose VM earlier labs used, so the host is as booted:
        its next QP gets the first QPN again (rxe counts QPNs from 17 per boot)."""
        for name in names:
            if name not in self._agents:
                raise KeyError(f"no host {name!r} in {self.description}")
            if self.pool.used.get(self._vms[name].spec.name, 0) > 1:
                self.reboot_host(name, 0)

    def reboot_host(self, name: str, down_ns: int, boot_deadline_s: float = 180.0) -> None:
        """The reboot fault (VmFaults.reboot): the history so far is kept, the VM killed,
        booted again after down_ns, and a new agent and lab started there."""
        agent, vm = self._agents[name], self._vms[name]
        self._archive(lambda: self._agent_records(agent), name, "host")
        self.record("fault", object="host", host=name, fault="reboot", down_ns=down_ns,
                    vm=vm.spec.name)
        vm.kill()
        agent.broken = "its VM was killed by a reboot fault"
        agent.lab = None
        agent.close(deadline_s=5.0)
        time.sleep(down_ns / 1e9)
        vm.start()
        boot_s = vm.wait_ready(boot_deadline_s)
        new = self.pool.replace_agent(agent, vm)
        self.pool.warm_data_path([vm])
        new.new_lab(self.seed, name, self.addresses)
        self.pool.used[vm.spec.name] = 1  # this lab, on a fresh boot
        self._agents[name] = new
        self.record("host_back", object="host", host=name, boot_s=round(boot_s, 3))

    def write_history(self, path: Union[str, os.PathLike]) -> None:
        os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            for r in self.history():
                f.write(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n")

    # -- diagnostics
    def dump_state(self) -> str:
        lines = []
        for name, agent in self._agents.items():
            vm = self._vms[name]
            procs = [p.name for p in agent.lab.host(name).processes] if agent.lab else []
            procs += [f"{p.name} (pid {p.pid}{'' if p.alive else ', killed'})"
                      for p in self._procs if p._host_name == name]
            lines.append(f"host {name} = {vm.spec.name} ({vm.spec.ip}, {self.pool.rdma}): "
                         f"processes {procs}")
        return "\n".join(lines)

    def diagnostic(self, headline: str) -> str:
        tail = self.history()[-HISTORY_TAIL:]
        lines = [f"Hung: {headline}", f"lab: {self.description} seed={self.seed} "
                 f"(not replayable: real devices) workdir={self.pool.workdir}",
                 "--- state ---", self.dump_state(), f"--- last {len(tail)} history records ---"]
        lines += [json.dumps(r, sort_keys=True) for r in tail]
        return "\n".join(lines)

    def check_errors(self) -> None:
        for agent in [*self._agents.values(), *(p.agent for p in self._procs)]:
            if agent is not None and agent.lab is not None:
                agent.lab.check_errors()

    # -- lifetime
    def shutdown(self) -> None:
        if self._shut:
            return
        self._shut = True
        errors = []
        try:
            self._faults.note_removals()
            self._faults.clear()
        finally:
            for proc in self._procs:  # their own agents, before the hosts' agents
                self._archive(proc.records, proc._host_name, f"proc:{proc.name}")
                try:
                    proc.close()
                except Exception as e:
                    errors.append(e)
            for name, agent in self._agents.items():
                # The history outlives the lab: written after shutdown.
                self._archive(lambda agent=agent: self._agent_records(agent), name, "host")
                try:
                    agent.close_lab()
                except Exception as e:  # the others still close; the next lab heals it
                    agent.broken = agent.broken or f"lab shutdown failed: {e}"
                    errors.append(e)
            try:
                self._faults.restore_devices()  # contexts closed: removals can finish
            except Exception as e:
                errors.append(e)
            for hook in self._shutdown_hooks:
                try:
                    hook(self)
                except Exception as e:
                    errors.append(e)
        if errors:
            raise errors[0]

    def __enter__(self) -> "VmLab":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"<VmLab {self.description} hosts={list(self._agents)}>"
