"""The agent lab: a Lab (rdmalab.protocol) whose hosts are Machines (lab/machine.py) each
running the host agent (rdmalab.agent) under execnet over SSH. The machines come from the VM
lab (lab.qemu: qemu guests on the fault switch, `--lab vm:rxe`) or from an inventory of real
machines (lab.inventory, `--lab inventory:PATH`); the lab drives both the same way.

    pool = vm_pool(2, "rxe")                # boots once; reused by every lab
    with pool.lab(seed=1) as lab:           # hosts "a", "b": fresh verbs labs in the agents
        pair = RCPair(lab)                  # built in the agents; proxies here
    pool.close()

The controller's clock is its CLOCK_MONOTONIC; each agent's offset is measured at start, so the
merged history orders records of all hosts on one time line. Each host's records are followed
as they are written (a fetch waits in the agent for the next, up to FOLLOW_WAIT_S), so a host
lost mid-scenario keeps what it said until then.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import re
import shutil
import sys
import threading
import time
from typing import Callable, Iterable, Optional, Union

from . import progress
from .errors import FaultNotSupported, HostLost, Hung
from .errors import make_error as _make_error
from .faults import NoFaults, _host_name
from .protocol import WIRE_PLACEMENT
from .remote import Agent

REPO = pathlib.Path(__file__).resolve().parents[2]
HISTORY_TAIL = 50
POLL_S = 0.002
FOLLOW_WAIT_S = 1.0  # how long one fetch of a host's records waits in its agent for the next
# Between two fetches: a host writing records all the time (a drain, a burst) is fetched ten
# times a second, not once per record (each fetch costs a TCG guest ~10 ms of its one CPU).
FOLLOW_S = 0.1
STUCK_DUMP_S = 30.0  # reading a stuck agent's stacks through its machine's channel
STUCK_DUMP_CHARS = 20000  # kept of that dump (the end: the Python stacks)
AGENT_DIR = "/var/tmp/rdmalab-agent"  # where the controller ships its agent on a host


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


def _repo_on_path() -> None:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))


SOFT_DEVICES = ("rxe", "siw")  # devices `rdma link add` makes


def device_label(device: str) -> str:
    """The provider a device name says ("rxe0" -> rxe, "mlx5_0" -> mlx5): metrics' label."""
    return re.sub(r"_?\d+$", "", device) or device


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


# `ip neigh` states in which the kernel has the peer's MAC (NUD_VALID less PERMANENT, NOARP,
# PROBE): what warm_data_path waits for.
_NEIGH_RESOLVED = ("REACHABLE", "STALE", "DELAY")


class AgentPool:
    """Machines with their agents; labs come and go on them. `owner` (the VM lab's guests, an
    inventory's locks) is closed with the pool."""

    def __init__(self, machines: list, *, description: str, switch_control: Optional[str] = None,
                 owner=None, health_check: bool = False,
                 agent_dir: str = AGENT_DIR, log: Callable[[str], None] = lambda m: None):
        self.machines = list(machines)
        self.description = description
        self.switch_control = switch_control
        self.owner, self.check_health = owner, health_check
        self.agent_dir, self.log = agent_dir, log
        self.agents: list[Agent] = []
        self.used: dict[str, int] = {}  # machine name -> labs run on it since its last boot
        self.leaks: list[str] = []  # what health checks after a lab found left behind
        self._installed: dict[str, object] = {}  # machine name -> lab.deploy.Installed
        # A lab's faults (a flush, a link down, frames dropped while the kernel probed a peer)
        # may have left a neighbour entry invalid: warm_data_path before the next lab.
        self.neighbours_unsure = False
        # machine name -> the version whose copy of the controller's engine an agent loaded
        # there (kept across reboots: a copy shipped again needs no import to be trusted)
        self._loaded: dict[str, str] = {}
        self.kernels: dict[str, str] = {}  # machine name -> `uname -r` at its agent's start
        # One install at a time: hosts may share agent_dir (the netns lab's namespaces are one
        # guest), and two copies into one version directory at once undo each other.
        self._deploy_lock = threading.Lock()
        try:  # inventory_pool health-checked them as it chose them
            started: list = [None] * len(self.machines)

            def start(k: int) -> None:
                started[k] = self.start_agent(self.machines[k])

            try:
                each_host(start, range(len(self.machines)))
            finally:  # the ones that started are closed with the pool
                self.agents = [a for a in started if a is not None]
            self.warm_data_path()
        except BaseException:
            self.close()
            raise

    def _ready(self, machine) -> None:
        """Health-checks a machine before it is used (inventory hosts)."""
        if not self.check_health:
            return
        _repo_on_path()
        from lab import hostcheck
        problems = hostcheck.health_check(machine)
        if problems:
            raise RuntimeError(f"host {machine.name} is not healthy: " + "; ".join(problems))

    def warm_data_path(self, machines=None, deadline_s: float = 30.0) -> None:
        """Each machine (of machines, default all) resolves every other's data address (ARP)
        before a scenario does: on a just-booted TCG guest the first rdma_resolve_addr
        otherwise spent over a second on it (seen on siw), and on the netns lab it waits
        its whole timeout (ib-addr-neighbour-update-lost). An entry asked for here (a pool's
        first warm-up) also proves the path carries. After a machine restarts, and before the
        lab after one that applied faults (neighbours_unsure), warm them all: a peer that
        sent to it while it was down, or whose entry a fault flushed or let fail, holds an
        invalid entry, and on 6.1 between two guests with the host's cores busy its next
        rdma_resolve_addr waited its whole 2 s (the ARP answer came back inside the call:
        make test with two VM labs side by side)."""
        machines = list(machines or self.machines)
        end = time.monotonic() + deadline_s

        def warm(m) -> None:
            for peer in self.machines:
                if peer is m:
                    continue
                ip, dev = peer.facts.data_address, m.facts.netdev
                # One command: an entry still valid is left alone (a python start costs a TCG
                # guest most of a second); else a datagram makes the kernel ask, and the entry
                # is watched for up to 2 s, where checked at once the answer may not be there.
                show = f"ip neigh show {ip} dev {dev}"
                send = (f"/usr/bin/python3 -c \"import socket; socket.socket(socket.AF_INET, "
                        f"socket.SOCK_DGRAM).sendto(b'rdmalab', ('{ip}', 9))\"")
                valid = "|".join(f"*{state}*" for state in _NEIGH_RESOLVED)
                poke = (f"out=$({show}); case \"$out\" in {valid}) ;; "
                        f"*) {send}; for i in $(seq 40); do out=$({show}); "
                        f"case \"$out\" in {valid}) break;; esac; "
                        f"sleep 0.05; done;; esac; echo \"$out\"")
                while True:
                    out = m.run(poke, 30).out
                    if any(state in out for state in _NEIGH_RESOLVED):
                        break
                    if time.monotonic() > end:
                        raise Hung(f"{m.name}: ARP {ip}", f"{m.name} cannot resolve {ip} on "
                                   f"{dev} after {deadline_s} s: {out!r}")
                    time.sleep(0.1)

        each_host(warm, machines)
        if len(machines) == len(self.machines):
            self.neighbours_unsure = False

    def start_agent(self, machine) -> Agent:
        """A new agent (its own python process) on machine, over a new SSH session, from the
        controller's own version of the package shipped there (lab.deploy). The install this
        pool made there is started without a check first; where that fails (gone with a
        reboot's fresh tmpfs: "no rdmalab agent deployed at ...", replaced, a gateway that
        died) the install is checked and shipped again. A reboot the pool knows of
        (replace_agent, restart) forgets the install instead: it is looked for before any
        start. An install of this version found there (a pool's first start, after a reboot)
        is taken by its files and started, not imported first (seconds of a TCG guest's CPU);
        where that start fails it is checked, imported, as well."""
        import execnet
        _repo_on_path()
        from lab import deploy
        cached = self._installed.get(machine.name)
        if cached is None:
            with self._deploy_lock:
                cached = deploy.ensure_agent(machine, REPO, agent_dir=self.agent_dir,
                                             log=self.log, trust_installed=True,
                                             loaded_before=self._loaded.get(machine.name, ""))
            self._installed[machine.name] = cached
        gw = execnet.makegateway(machine.execnet_spec())
        try:
            channel = deploy.open_agent_channel(gw, cached.path, cached.version,
                                                machine.name)
        except (deploy.DeployError, EOFError, OSError, execnet.RemoteError) as e:
            # Not WallClockTimeout or KeyboardInterrupt: those end the start.
            gw.exit()
            self._installed.pop(machine.name, None)
            self.log(f"{machine.name}: the agent installed at {cached.path} does not start "
                     f"({str(e).strip()[:300]}); checking it and shipping it again")
        except BaseException:
            gw.exit()
            raise
        else:
            return self._serve_agent(gw, machine, channel, cached)
        # Outside the handler above: an error from here on is not chained to why the old
        # install did not start, and the pool's log says the install was shipped. A start
        # just failed: whatever loaded here before is checked by an import this time.
        self._loaded.pop(machine.name, None)
        with self._deploy_lock:
            inst = deploy.ensure_agent(machine, REPO, agent_dir=self.agent_dir, log=self.log)
        self._installed[machine.name] = inst
        gw = execnet.makegateway(machine.execnet_spec())
        try:
            channel = deploy.open_agent_channel(gw, inst.path, inst.version, machine.name)
        except BaseException:
            gw.exit()
            raise
        return self._serve_agent(gw, machine, channel, inst)

    def _serve_agent(self, gw, machine, channel, inst) -> Agent:
        """The agent started on gw's channel (from install inst), set up for machine."""
        try:
            agent = Agent.start(gw, machine.name, channel=channel)
            progress.forward(agent)  # its CM waits say what they wait for, here
            if machine.facts.device:  # the host's own device, where the kernel lists more
                agent.module("os").environ["RDMALAB_DEVICES"] = machine.facts.device
            # `uname -r` from the agent just started: not one more SSH session (seconds to a
            # TCG guest, on every start after a reboot).
            self.kernels[machine.name] = str(agent.module("os").uname().release)
            agent.pid = int(agent.function("os", "getpid")())
            if not inst.built_on_host:  # the controller's engine loaded there
                self._loaded[machine.name] = inst.version
            return agent
        except BaseException:
            gw.exit()
            raise

    def forget_install(self, machine) -> None:
        """The machine was powered off: what this pool installed there may be gone (a guest's
        agent_dir is on a tmpfs), so the next start checks it (lab.deploy.ensure_agent: one
        round trip where it is still there) instead of starting it blind."""
        self._installed.pop(machine.name, None)

    def replace_agent(self, old: Agent, machine) -> Agent:
        """A fresh agent on machine (after a reboot) in old's place."""
        self.forget_install(machine)
        return self.renew_agent(old, machine)

    def renew_agent(self, old: Agent, machine) -> Agent:
        """A new agent process on machine in old's place (old is closed), from the same
        install: the machine was not rebooted."""
        new = self.start_agent(machine)
        self.agents[self.agents.index(old)] = new
        return new

    def restart(self, i: int) -> None:
        """Brings machine i back: power-cycled where it can be (else it must still answer),
        ready, healthy, with a fresh agent (the deployed agent is checked again: a reboot may
        have wiped it)."""
        m = self.machines[i]
        if m.can_power:
            m.power_cycle()
        m.wait_ready(180.0)
        self.forget_install(m)
        self._ready(m)
        self.used[m.name] = 0
        self.agents[i] = self.start_agent(m)
        self.warm_data_path()  # every machine: its peers' entries for it too

    def heal(self) -> list[str]:
        """Restarts each machine whose agent is broken (a shutdown stuck in the kernel, a lost
        host) and returns what was healed and why."""
        broken = [i for i, agent in enumerate(self.agents) if agent.broken]
        healed = [f"{self.machines[i].name}: {self.agents[i].broken}" for i in broken]

        def heal_one(i: int) -> None:
            self.agents[i].close(deadline_s=5.0)
            self.restart(i)

        each_host(heal_one, broken)
        return healed

    def after_run(self, settle_s: float = 2.0) -> list[str]:
        """The health check after the run (inventory hosts), once the agents are gone: what
        the run left on each host (an object of rdmalab's still in `rdma res`, a port no
        longer ACTIVE). Once per run, not per lab: on TCG guests a check costs seconds."""
        if not self.check_health:
            return []
        _repo_on_path()
        from lab import hostcheck
        def check(m) -> list[str]:
            try:
                problems = hostcheck.health_check(m)
                if problems:  # an agent that just exited: the kernel may still be releasing
                    time.sleep(settle_s)
                    problems = hostcheck.health_check(m)
            except Exception as e:  # the host went away
                problems = [f"{m.name}: health check failed: {e}"]
            return problems

        found = [p for problems in each_host(check, self.machines) for p in problems]
        self.leaks += found
        return found

    def lab(self, seed: int = 1, hosts: Iterable[str] = ("a", "b"), **options) -> "AgentLab":
        if options:  # latency_ns, loss_ppm, ...: the model's simulated fabric
            raise FaultNotSupported("lab options", f"model-only lab options {sorted(options)}: "
                                    f"the fabric of {self.description} is real (wire faults "
                                    "go through lab.faults)")
        if isinstance(hosts, dict):
            raise FaultNotSupported("lab options", f"per-host personalities {hosts}: the hosts "
                                    f"of {self.description} are what their devices are")
        return AgentLab(self, seed, list(hosts))

    def close(self) -> None:
        for agent in self.agents:
            agent.close()
        self.agents.clear()
        try:
            self.after_run()
        finally:
            if self.owner is not None:
                self.owner.close()


def vm_pool(n: int = 2, rdma: str = "rxe", boot_deadline_s: float = 180.0) -> AgentPool:
    """The VM lab: n qemu guests with rdma (rxe or siw) on the fault switch, their agents."""
    if rdma not in ("rxe", "siw"):
        raise ValueError(f"VM lab device {rdma!r}: rxe or siw")
    why = qemu_unavailable()
    if why:
        raise RuntimeError(f"the VM lab cannot run here: {why}")
    _repo_on_path()
    from lab.qemu import VmMachines
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
    """The netns lab: n hosts as network namespaces on one kernel (lab.netns), each with its
    agent. On this machine's kernel where it can host them (root, rdma_rxe with per-namespace
    sockets: 7.1 on); else inside one guest of the VM lab booted with a kernel that can
    (RDMALAB_VM_KERNEL, else sid). The error names the kernel that cannot."""
    if rdma not in SOFT_DEVICES:
        raise ValueError(f"netns lab device {rdma!r}: {' or '.join(SOFT_DEVICES)}")
    _repo_on_path()
    from lab import netns
    from lab.localmachine import LocalMachine
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
        from lab.qemu import VmMachines
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
    """`hosts` machines of an inventory (lab.inventory), the first in file order that are free
    and healthy: each locked for this run (another run, or another pytest-xdist worker, takes
    the next ones), health-checked before use and after each lab, each running the
    controller's own agent version."""
    _repo_on_path()
    from lab import hostcheck, inventory
    from lab.machine import MachineError
    inv = inventory.load(path)
    # Hosts behind one fault switch are one fabric: a lab's hosts come from one of them.
    fabrics: dict[str, list] = {}
    for m in inv.machines():
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
        import fcntl
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


class NftRule:
    """A wire rule installed as nftables rules (rdmalab.nft): in the sending hosts' output hooks
    or in the bridge on their path. `hits` is what their counters saw; `remove()` takes them
    out."""

    def __init__(self, faults: "AgentFaults", action: str, fields: dict, installed: dict):
        self.action, self.fields = action, fields
        # place key (a host name, or "bridge:<machine>") -> (machine, nft place, handle)
        self._faults, self._installed = faults, installed

    @property
    def hits(self) -> int:
        from . import nft
        total = 0
        for key, (machine, place, handle) in self._installed.items():
            total += nft.rule_packets(self._faults._nft_list(machine, key, place), handle)
        return total

    def remove(self) -> None:
        from . import nft
        for key, (machine, place, handle) in list(self._installed.items()):
            self._faults._nft_on(machine, key, nft.delete_rule_command(handle, place))
            del self._installed[key]

    def __repr__(self) -> str:
        return f"<NftRule {self.action} {self.fields} on {sorted(self._installed)}>"


class SwitchRule:
    """A wire rule in the lab's fault switch: `hits` is the frames it acted on (a watch rule:
    the frames it counted); `remove()` takes it out."""

    def __init__(self, faults: "AgentFaults", action: str, rule: dict, rule_id: int):
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


class AgentFaults(NoFaults):
    """The faults an agent lab applies: wire rules in the fault switch on the path (drop,
    delay, duplicate, reorder, corrupt, watch) or as nftables rules in the sending hosts
    (software providers send through the host's stack); link down/up of a host's data NIC;
    removal and re-adding of a soft device; reboots by power cycle. What a host cannot have
    (no switch on its path, no power commands) raises FaultNotSupported naming it."""

    def __init__(self, lab: "AgentLab"):
        super().__init__(lab)
        self._counts: dict[str, int] = {}
        self._down: set[str] = set()
        self._rules: list[NftRule] = []
        self._nft_ready: dict = {}  # place key -> (machine, nft place) with the table made
        self._listers: dict = {}  # place key -> nft.Lister (counters read without a process)
        self._removed: dict = {}  # host -> (device, the background `rdma link delete`)
        self._control = None  # SwitchControl, connected at the first switch rule
        self._switch_rules: list[SwitchRule] = []
        self._switch_records: list[dict] = []
        self._since = 0  # the switch's history seq at this lab's first rule

    # -- wire rules (nftables in the guests, or in the bridge between them)
    @staticmethod
    def _nft_on(machine, key: str, cmd: str) -> str:
        return machine.run(cmd, 30, root=True).check(f"{key}: {cmd}").out

    def _nft_list(self, machine, key: str, place) -> str:
        """`nft -j list chain` of place on machine: from the place's Lister, or (its first
        read, or the lister gone) the one-shot command, which names any error."""
        from . import nft
        lister = self._listers.get(key)
        if lister is None:
            lister = self._listers[key] = nft.Lister(machine)
            return self._nft_on(machine, key, nft.list_command(place))
        return lister.read(place) or self._nft_on(machine, key, nft.list_command(place))

    def _close_listers(self, keys=None) -> None:
        for key in list(self._listers if keys is None else keys):
            lister = self._listers.pop(key, None)
            if lister is not None:
                lister.close()

    def _nft_place(self, host: str, where: str):
        """(key, machine, nft place) where host's packets meet a rule: its own output hook
        (where == "host"), or the bridge machine on its path (where == "bridge")."""
        from . import nft
        m = self._lab.machine_of(host)
        if where == "bridge":
            bridge = getattr(m, "bridge_machine", None)
            if bridge is None:
                raise FaultNotSupported("wire", f"{host} ({m.name}): no nftables bridge on "
                                        "its path")
            return f"bridge:{bridge.name}", bridge, nft.BRIDGE
        return host, m, nft.HOST

    def _transport(self) -> str:
        """How nftables finds RDMA in the hosts' traffic: TCP (iWARP) or UDP 4791 (RoCEv2)."""
        name = next(iter(self._lab.addresses))
        return "iwarp" if self._lab.host(name).caps().transport == "iWARP" else "roce"

    def _wire_rule(self, fault: str, verdict: str, match, count, fields: dict,
                   where: str = "host") -> NftRule:
        from . import nft
        from .faults import expand_cm
        if match is not None:
            raise FaultNotSupported(fault, "a Python predicate cannot run in nftables: give "
                                    "the fields (cm=, opcode=, dest_qpn=, ...)")
        if count is not None:
            raise FaultNotSupported(fault, "nftables counts bytes, not packets: count= needs "
                                    "the fault switch")
        fields = expand_cm(fields)
        src = fields.get("src_host")
        hosts = [src] if src is not None else list(self._lab.addresses)
        for host in hosts:
            why = self._lab.nftables_unusable(host)
            if why:
                raise FaultNotSupported(fault, why)
        places = {}
        for host in hosts:  # a bridge carries every host's packets: one rule there
            key, machine, place = self._nft_place(host, where)
            places.setdefault(key, (machine, place))
        netdev = self._lab.machine_of(hosts[0]).facts.netdev if where == "host" else None
        macs = {n: self._lab.machine_of(n).facts.mac for n in self._lab.addresses}
        installed = {}
        expr = ""
        for key, (machine, place) in places.items():
            expr = nft.match_expr(fields, self._lab.addresses, self._transport(), netdev, place,
                                  macs)
            if key not in self._nft_ready:
                self._nft_on(machine, key, nft.setup_commands(place))
                self._nft_ready[key] = (machine, place)
            out = self._nft_on(machine, key,
                               nft.add_rule_command(expr, verdict, f"rdmalab {fault}", place))
            handle = nft.parse_handle(out)
            if handle is None:
                raise RuntimeError(f"{key}: nft printed no rule handle: {out!r}")
            installed[key] = (machine, place, handle)
        rule = NftRule(self, fault, fields, installed)
        self._rules.append(rule)
        self._lab.record("fault", object="nft", fault=fault, fields=fields, expr=expr,
                         hosts=sorted(installed), place=where)
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
        name = _host_name(host)
        if name in self._removed:
            raise _make_error("rdma link delete", errno.EBUSY, f"{name}: its device is already being removed")
        m = self._lab.machine_of(name)
        dev = m.facts.device
        if device_label(dev) not in SOFT_DEVICES:
            raise FaultNotSupported(fault, f"{name}: {dev} is not a soft device: `rdma link "
                                    "add` could not bring it back (rxe and siw only)")
        self._removed[name] = (dev, m.popen(f"rdma link delete {dev}", root=True))
        self._counts[fault] = self._counts.get(fault, 0) + 1
        self._lab.record("fault", object="device", host=name, fault=fault,
                         command=f"rdma link delete {dev}")

    def rdma_link_add(self, host, deadline_s: float = 30.0) -> None:
        """`rdma link add` of the device rdma_link_delete removed, once the removal has
        finished (Hung if it is still blocked after deadline_s: a context is still open);
        returns when the port is ACTIVE and usable."""
        name = _host_name(host)
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
        m = self._lab.machine_of(name)
        self._link_add(name, m, dev)
        self._lab.record("device_added", object="device", host=name, device=dev)
        self._wait_usable(name, m)

    @staticmethod
    def _link_add(name: str, m, dev: str) -> None:
        """`rdma link add` of soft device dev on m's netdev, as it was before its removal."""
        m.run(f"rdma link add {dev} type {device_label(dev)} netdev {m.facts.netdev}", 30,
              root=True).check(f"{name}: rdma link add {dev}")

    # -- hosts
    def reboot(self, host, down_ns: int) -> None:
        """Power the host off (a qemu guest: SIGKILL of qemu, a crash: nothing is closed,
        nothing sent; an inventory host: its power commands), wait down_ns, power it on (a
        guest on the same switch port, MAC and address), and start a fresh agent and lab
        there. Returns once the host is back: its earlier objects are gone."""
        name = _host_name(host)
        self._lab.reboot_host(name, down_ns)
        self._nft_ready.pop(name, None)  # the rebooted guest has no rules
        self._close_listers([name])
        self._rules = [r for r in self._rules if name not in r._installed]
        self._counts["reboot"] = self._counts.get("reboot", 0) + 1

    # -- wire rules in the fault switch
    def _switch(self):
        from .fabric import SwitchControl
        if self._control is None:
            path = self._lab.switch_unusable()
            if path.startswith("!"):
                raise FaultNotSupported("switch", path[1:])
            self._control = SwitchControl(path)
            since = 0  # the end of what earlier labs left in the switch's history
            while True:
                page = self._control.request("history", since=since)
                if not page["records"]:
                    break
                since = page["last_seq"]
            self._since = since
            self._control.request("hosts", hosts={
                n: {"mac": m.facts.mac, "ip": m.facts.data_address}
                for n, m in ((n, self._lab.machine_of(n)) for n in self._lab.addresses)})
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

    def rule(self, spec: dict) -> SwitchRule:
        """A wire rule given as the fault switch's JSON object ({"action": "drop", "cm":
        "DREP", ...}), sent to the switch as is: the model's lab.faults.rule takes the same
        dict. A bad rule raises ValueError naming the key, checked here by the switch's own
        parser (the model's add_rule gives the same message)."""
        if not isinstance(spec, dict):
            raise TypeError(f"rule: a dict (the switch's JSON rule object), got {spec!r}")
        from . import _core
        _core.check_wire_rule(json.dumps(spec))
        fields = {k: v for k, v in spec.items() if k != "action"}
        return self._switch_rule(spec["action"], None, fields)

    def _where(self, at: Optional[str]) -> str:
        """switch | bridge | host. Default: the fault switch where the path has one, else the
        nftables bridge on the path (the netns lab's), else the sending hosts' nftables."""
        if at is None:
            if not self._lab.switch_unusable().startswith("!"):
                return "switch"
            machines = [self._lab.machine_of(h) for h in self._lab.addresses]
            if all(getattr(m, "bridge_machine", None) is not None for m in machines):
                return "bridge"
            return "host"
        if at not in ("switch", "bridge", "host"):
            raise ValueError(f"at={at!r}: 'switch' (the fault switch), 'bridge' (nftables in "
                             "the bridge on the path) or 'host' (nftables in the sending host)")
        return at

    def drop(self, match=None, *, count=None, every=None, probability=None,
             at: Optional[str] = None, **fields):
        """Drops matching packets: in the fault switch (default where there is one), in the
        nftables bridge on the path (the netns lab's default), or with at="host" where they
        leave the sending host (nftables; all hosts unless src_host=)."""
        where = self._where(at)
        if where != "switch":
            if every is not None or probability is not None:
                raise FaultNotSupported("drop", "nftables counts bytes: every=/probability= "
                                        "need the fault switch")
            rule = self._wire_rule("drop", "drop", match, count, fields, where)
            self._counts["drop"] = self._counts.get("drop", 0)  # read from the counters
            return rule
        return self._switch_rule("drop", match, fields, count=count, every=every,
                                 probability=probability)

    def watch(self, match=None, *, at: Optional[str] = None, **fields):
        """Counts matching packets without touching them (rule.hits)."""
        where = self._where(at)
        if where != "switch":
            return self._wire_rule("watch", "accept", match, None, fields, where)
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
        name = _host_name(host)
        m = self._lab.machine_of(name)
        netdev = m.facts.netdev
        m.run(f"ip link set {netdev} {state}", 30, root=True).check(
            f"{name}: ip link set {state}")
        if state == "up":
            self._wait_usable(name, m)
            # Down flushed this host's neighbours (and a peer that sent meanwhile holds a FAILED
            # entry for it): resolved again here, or the next rdma_resolve_addr of a scenario
            # that is not about it waits its whole timeout (ib-addr-neighbour-update-lost).
            self._lab.pool.warm_data_path()
        self._link_fault(name, f"port_{state}", netdev)
        (self._down.add if state == "down" else self._down.discard)(name)

    @staticmethod
    def _wait_usable(name: str, m, deadline_s: float = 30.0) -> None:
        """Up is not usable yet: the port must be ACTIVE again and the link-local address (the
        GID RoCEv2 routes by) past duplicate address detection, or modify to RTR fails with
        ETIMEDOUT resolving the peer."""
        f = m.facts
        probe = (f"cat /sys/class/infiniband/{f.device}/ports/{f.port}/state; "
                 f"ip -6 addr show dev {f.netdev} tentative")
        end = time.monotonic() + deadline_s
        while True:
            out = m.run(probe, 30).out
            if "ACTIVE" in out and "inet6" not in out:
                return
            if time.monotonic() > end:
                raise Hung(f"{name}: link up", f"{name}: {f.netdev} not usable "
                           f"{deadline_s} s after link up:\n{out}")
            time.sleep(0.1)

    def neigh_flush(self, host) -> None:
        """`ip neigh flush dev <netdev>` on the host: it forgets every neighbour (ARP and
        IPv6 ND entries) of its data NIC, as after a link flap or the neighbour table's garbage
        collection; the next resolution of a peer sends a request again."""
        name = _host_name(host)
        m = self._lab.machine_of(name)
        netdev = m.facts.netdev
        m.run(f"ip neigh flush dev {netdev}", 30, root=True).check(f"{name}: ip neigh flush")
        self._link_fault(name, "neigh_flush", netdev)

    def _link_fault(self, name: str, fault: str, netdev: str) -> None:
        """Counts and records a fault applied to a host's data NIC."""
        self._counts[fault] = self._counts.get(fault, 0) + 1
        self._lab.record("fault", object="link", host=name, fault=fault, netdev=netdev)

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
        if self._counts or any(r.action != "watch" for r in self._rules + self._switch_rules):
            self._lab.pool.neighbours_unsure = True  # resolved again before the next lab
        lost = self._lab.lost_hosts()  # a lost host is restarted before its next lab
        for name in list(self._down):  # the next lab on these hosts starts with links up
            if name not in lost:
                self.port_up(name)
        self._close_listers()
        for key, (machine, place) in list(self._nft_ready.items()):  # and with no rules
            if key not in lost:
                self._nft_on(machine, key, nft.delete_table_command(place))
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
        return (f"{self._lab.description} cannot apply {fault} (injected events and verb "
                "hooks are the model's)")


class AgentProcess:
    """A process of an agent host that is an OS process of its own: a second agent on the
    machine (python over its own SSH session), whose verbs lab has just this process. Its
    objects live there, so kill() is a real SIGKILL: the host's kernel releases them (uverbs,
    ucma) as it does for any process that dies."""

    def __init__(self, lab: "AgentLab", host: str, name: str):
        self._lab, self.name, self._host_name = lab, name, host
        self._agent = lab.pool.start_agent(lab.machine_of(host))
        try:
            self._agent.new_lab(lab.seed, host, lab.addresses)
            self.host = self._agent.lab.host(host)
            self._proc = self.host.process(name)
            self.pid = self._agent.pid
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
        while not _proc_exited(main, self.pid):
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
        return f"<AgentProcess {self.name} pid {self.pid} on {self._host_name} ({state})>"


def _proc_exited(agent: Agent, pid: int) -> bool:
    """pid's threads have all gone through do_exit, so its files are closed (uverbs and ucma
    released everything). A zombie leader is not enough: the leader of a multi-threaded
    process turns zombie while its other threads may still be exiting, and the files close
    with the last of them; a thread leaves the count (Threads:) only once released."""
    try:
        with agent.module("builtins").open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    except Exception:  # no /proc entry: gone (reaped)
        return True
    threads = fields.get("Threads")  # absent once the signal struct is gone
    return "zombie" in fields.get("State", "") and (threads is None or threads.strip() == "1")


class AgentLab:
    """A Lab (rdmalab.protocol) whose hosts are a pool's machines, every host's objects in
    that machine's agent. A host whose agent stops answering mid-scenario (a crash, a reboot
    nobody asked for, a lost SSH session) is recorded as lost, with every record it had
    written until then; the pool restarts it before the next lab."""

    backend = "verbs"
    replayable = False
    # TCG guests: events and round trips the model does not time (docs/vmlab.md). The CM
    # timers once seen ~256 ms "late" were the timer wheel's buckets, which cm_timing now
    # predicts: bounds on those get timer_slack_ns per timer instead.
    tolerance_ns = 500 * 10**6
    timer_slack_ns = 10 * 10**6

    def __init__(self, pool: AgentPool, seed: int, names: list[str]):
        if len(names) > len(pool.agents):
            raise FaultNotSupported("hosts", f"{pool.description} has {len(pool.agents)} hosts; "
                                    f"the scenario wants {len(names)} ({', '.join(names)})")
        healed = pool.heal()  # a stuck or lost host from an earlier lab: restarted first
        if pool.neighbours_unsure:  # an earlier lab's faults (AgentFaults.clear)
            pool.warm_data_path()
        self.pool, self.seed = pool, seed
        self.description = pool.description
        self.replay = ""
        self._t0 = time.monotonic_ns()
        self._agents = dict(zip(names, pool.agents))
        self._machines = dict(zip(names, pool.machines))
        self.addresses = {n: m.facts.data_address for n, m in self._machines.items()}
        for name, agent in self._agents.items():
            agent.new_lab(seed, name, self.addresses)
            mname = self._machines[name].name
            pool.used[mname] = pool.used.get(mname, 0) + 1  # labs since its boot
        self._faults = AgentFaults(self)
        self._records: list[dict] = []
        self._archived: list[dict] = []  # records of agents gone (a reboot, a kill, a loss)
        self._merged: list[dict] = []  # records from outside the agents (evidence: wire, kmsg)
        self._followed: dict[str, list[dict]] = {n: [] for n in names}  # each host's records
        # Hosts whose agent's records were moved to the archive (a reboot under way, shutdown):
        # not fetched again, or the follower would take them all a second time from seq 0.
        self._sealed: set[str] = set()
        self._lost: dict[str, dict] = {}
        self._procs: list[AgentProcess] = []  # killable processes (agents of their own)
        self._hosts: dict[str, tuple] = {}  # name -> (its agent's lab, that lab's Host)
        self._shutdown_hooks: list[Callable[["AgentLab"], None]] = []
        self._lock = threading.RLock()
        self._shut = False
        self.record("lab_start", object="lab", lab=self.description,
                    machines={n: m.name for n, m in self._machines.items()}, healed=healed,
                    kernels={n: pool.kernels.get(m.name, "") for n, m in self._machines.items()})
        self._stop_follow = threading.Event()
        self._followers = [threading.Thread(target=self._follow, args=(n,), daemon=True,
                                            name=f"follow-{n}") for n in names]
        for t in self._followers:
            t.start()

    # -- what this lab can do (rdmalab.protocol)
    @property
    def capabilities(self) -> frozenset:
        caps = set()
        if not self.switch_unusable().startswith("!") and not any(
                self.nftables_unusable(n) for n in self._machines):
            caps.add(WIRE_PLACEMENT)
        return frozenset(caps)

    def has(self, capability: str) -> bool:
        return capability in self.capabilities

    def switch_unusable(self) -> str:
        """The fault switch's control socket, or "!why" when rules cannot go to a switch."""
        if self.pool.switch_control is None:
            return (f"!no fault switch on the path of {self.description}'s hosts (the VM lab "
                    "without build/faults/rdmalab-switch, or no [[switch]] in the inventory)")
        off = [n for n, m in self._machines.items() if m.facts.wire_switch == ""]
        if off:
            return f"!host(s) {', '.join(off)} are not behind the fault switch (wire.via)"
        return self.pool.switch_control

    def nftables_unusable(self, host: str) -> str:
        """Why a wire rule cannot sit in host's own nftables ("" when it can): the host's
        traffic must go through its network stack (rxe, siw) or the inventory says so."""
        from lab.machine import WIRE_NFT_BRIDGE, WIRE_NFTABLES
        m = self._machines[host]
        if m.facts.wire == WIRE_NFTABLES or device_label(m.facts.device) in SOFT_DEVICES:
            return ""
        if m.facts.wire == WIRE_NFT_BRIDGE and getattr(m, "bridge_machine", None) is not None:
            return ""
        if m.facts.wire == WIRE_NFT_BRIDGE:
            return (f"{host} ({m.name}): wire faults through an nftables bridge on the path "
                    f"(wire.bridge = {m.facts.wire_bridge!r}) are not implemented yet")
        return (f"{host} ({m.name}): {m.facts.device} sends past the host's network stack; "
                f"nftables there sees none of it (wire.via is {m.facts.wire!r})")

    def place(self, anchor) -> Optional[Agent]:
        """A host name is built in that host's agent (objects say where they live)."""
        return self._agents.get(anchor) if isinstance(anchor, str) else None

    # -- hosts
    now_ns = property(lambda self: time.monotonic_ns())

    @property
    def hosts(self) -> dict:
        return {n: a.lab.host(n) for n, a in self._agents.items()}

    def host(self, name: str):
        if name not in self._agents:
            raise KeyError(f"no host {name!r} in {self.description}; hosts: "
                           f"{', '.join(self._agents)}")
        self._check_lost(name)
        agent_lab = self._agents[name].lab
        kept = self._hosts.get(name)
        if kept is None or kept[0] is not agent_lab:  # asked once per agent lab: a round trip
            kept = self._hosts[name] = (agent_lab, agent_lab.host(name))
        return kept[1]

    def stalled_ns(self, host: str, from_ns: int, to_ns: int) -> int:
        """How long host's machine stood still in [from_ns, to_ns], as its agent's StallMeter
        measured (a vCPU of a TCG guest on a loaded machine stops for hundreds of ms)."""
        self.host(host)
        return int(self._agents[host].lab.stalled_ns(host, from_ns, to_ns))

    def agent_for(self, name: str) -> Optional[Agent]:
        return self._agents.get(name)

    def machine_of(self, name: str):
        return self._machines[name]

    def share_a_kernel(self, *hosts: str) -> bool:
        """Whether the hosts run on one kernel (the netns lab's namespaces): their boot ids
        are the same. Such hosts answer each other's ARP inside the sender's own system call."""
        ids = {self.machine_of(h).run("cat /proc/sys/kernel/random/boot_id", 30)
               .check(f"{h}: boot_id").out.strip() for h in hosts}
        return len(ids) == 1

    def killable_process(self, host: str, name: str) -> AgentProcess:
        """A process that kill() SIGKILLs: an OS process of its own on the host (a second
        agent, started over SSH: a few seconds on TCG), not a part of the host's agent."""
        if host not in self._agents:
            raise KeyError(f"no host {host!r} in {self.description}; hosts: "
                           f"{', '.join(self._agents)}")
        proc = AgentProcess(self, host, name)
        self._procs.append(proc)
        self.record("process_start", object=f"proc:{name}", host=host, pid=proc.pid)
        return proc

    def kernel_resources(self, host: str, pids: set[int]) -> dict[str, int]:
        """What the host's kernel still holds for these pids (restrack records the creating
        thread's TID, so a process is the set of its threads), by kind (`rdma res show`: qp,
        cq, pd, mr, cm_id, ctx, srq); kinds with none are left out."""
        # One call to the host's agent (its rdma batch process) for all kinds: seven SSH
        # commands cost ~0.5 s each on a TCG guest, and this is polled. The batch stops at
        # the first kind that fails: those after it are asked one at a time.
        kinds = ("qp", "cq", "pd", "mr", "cm_id", "ctx", "srq")
        res = self.agent_for(host).call_copy("rdmalab.evidence", "rdma_res", "", 30.0, kinds)
        failed = [k for k in kinds if isinstance(res.get(k), dict)]
        for kind in failed[1:]:
            r = self._machines[host].run(f"rdma -j res show {kind}", 30, root=True)
            if r.rc == 0:
                try:
                    res[kind] = json.loads(r.out or "[]")
                except ValueError as e:
                    raise RuntimeError(f"{host}: rdma -j res show {kind}: {e}: {r.out!r}") from e
        out = {}
        for kind in kinds:
            entries = res.get(kind)
            if not isinstance(entries, list):  # a kind this iproute2 or kernel does not list
                continue
            n = sum(1 for e in entries if isinstance(e, dict) and e.get("pid") in pids)
            if n:
                out[kind] = n
        return out

    def devices_by_host(self) -> dict[str, str]:
        """host -> the device label metrics use ("rxe", "siw", "mlx5")."""
        return {n: device_label(m.facts.device) for n, m in self._machines.items()}

    def attach_metrics(self, metrics) -> None:
        """The records are on the hosts: counted from the merged history at shutdown."""
        backend = self.description.partition(":")[0]
        self.on_shutdown(lambda lab: metrics.ingest_lab(lab, backend=backend))

    def on_shutdown(self, fn: Callable[["AgentLab"], None]) -> None:
        """fn(lab) after the lab has shut down, its history complete (metrics ingest it)."""
        self._shutdown_hooks.append(fn)

    def address_of(self, host: str) -> str:
        return self.addresses.get(host, host)

    @property
    def faults(self) -> AgentFaults:
        return self._faults

    # -- lost hosts
    def lost_hosts(self) -> dict[str, dict]:
        """host -> what is known of its loss (machine, at_ns, error, records_kept). Asks each
        live agent once, so a loss is known as soon as the scenario's call failed."""
        if not self._shut:
            for name in list(self._agents):
                self._fetch(name)
        with self._lock:
            return {n: dict(v) for n, v in self._lost.items()}

    def _check_lost(self, name: str) -> None:
        lost = self._lost.get(name)
        if lost is not None:
            raise HostLost(name, lost)

    def _lose(self, name: str, error: BaseException) -> None:
        agent = self._agents[name]
        with self._lock:
            if name in self._lost or agent.broken:  # known, or a fault took it on purpose
                return
            m = self._machines[name]
            info = {"machine": m.name, "at_ns": self.now_ns - self._t0,
                    "error": f"{type(error).__name__}: {error}",
                    "records_kept": len(self._followed[name])}
            self._lost[name] = info
            agent.broken = f"host lost: {info['error']}"
        self.record("host_lost", object="host", host=name, **info)

    def _fetch(self, name: str, wait_s: float = 0.0) -> list[dict]:
        """The host's records so far: what was followed, plus anything new from its agent
        (waiting there up to wait_s for the next)."""
        agent, known = self._fetchable(name)
        if known is None:
            return self._followed[name]
        try:
            text = agent.history_after(len(known), wait_s)
        except Exception as e:
            if name in self._sealed:  # archived meanwhile: its agent may be going on purpose
                return self._followed[name]
            if isinstance(e, (EOFError, OSError)) or agent.conn.closed:
                self._lose(name, e)
            return self._followed[name]
        with self._lock:
            if self._followed[name] is not known:  # archived meanwhile: taken there
                return self._followed[name]
            # A record fetched meanwhile by another thread is not taken twice.
            known += [r for r in self._parse(text) if r["host_seq"] >= len(known)]
            return known

    def _parse(self, jsonl: str) -> list[dict]:
        """An agent's records on the lab's time line: its seq kept as host_seq, t_ns from the
        lab's start (the agent's clock is offset onto ours)."""
        out = []
        for line in jsonl.splitlines():
            r = json.loads(line)
            r["host_seq"] = r.pop("seq")
            r["t_ns"] -= self._t0
            out.append(r)
        return out

    def _fetchable(self, name: str) -> tuple[Agent, Optional[list[dict]]]:
        """The host's agent and followed records; None for the records when that agent cannot
        be asked (broken, no lab, archived)."""
        with self._lock:
            agent = self._agents[name]
            if agent.broken or agent.lab is None or name in self._sealed:
                return agent, None
            return agent, self._followed[name]

    def _follow(self, name: str) -> None:
        """Follows one host: each fetch waits in its agent for the next records."""
        while not self._stop_follow.wait(FOLLOW_S):
            self._fetch(name, FOLLOW_WAIT_S)  # at once for a host it cannot ask

    # -- time (wall clock: devices run on their own)
    def run_for(self, duration_ns: int) -> None:
        """Lets duration_ns of wall-clock time pass (a negative duration: Error EINVAL, as on
        every lab)."""
        from .errors import duration_ns as duration_of
        duration_ns = duration_of("run_for", duration_ns)
        with progress.Waiting(f"running for {duration_ns / 1e9:.0f} s", duration_ns / 1e9):
            time.sleep(duration_ns / 1e9)
        self.check_errors()

    def sleep(self, duration_ns: int) -> None:
        """The controller sleeps (run_for; the error names sleep)."""
        from .errors import duration_ns as duration_of
        self.run_for(duration_of("sleep", duration_ns))

    def wait_until(self, pred: Callable[[], bool], timeout_ns: int = 10 * 10**9,
                   what: str = "condition") -> None:
        from .errors import duration_ns as duration_of
        timeout_ns = duration_of("wait_until", timeout_ns, "timeout_ns")
        start = self.now_ns
        end = start + timeout_ns
        with progress.Waiting(f"waiting for {what}", timeout_ns / 1e9):
            while not pred():
                if self._lost:
                    raise HostLost(*next(iter(self._lost.items())))
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
        for name in self._agents:
            merged += [dict(r) for r in self._fetch(name)]
        for proc in self._procs:
            merged += proc.records()
        for r in self._faults.switch_history():  # the switch runs on this machine's clock
            merged.append({"seq": 0, "host_seq": r.get("seq", 0),
                           "t_ns": r.get("t_ns", 0) - self._t0,
                           "host": "switch", "object": f"rule:{r.get('rule', '')}",
                           "kind": f"switch_{r.get('action', 'record')}", "data": r})
        with self._lock:
            merged += [dict(r) for r in self._archived]
            merged += [dict(r) for r in self._merged]
            merged += [dict(r, host_seq=r["seq"]) for r in self._records]
        merged.sort(key=lambda r: (r["t_ns"], r["host"], r["host_seq"]))
        for i, r in enumerate(merged):
            r["seq"] = i
        return merged[since_seq:]

    @property
    def t0_ns(self) -> int:
        """The lab's start on the controller's CLOCK_MONOTONIC: t_ns 0 of its history."""
        return self._t0

    def merge_records(self, records: list[dict]) -> None:
        """Records made outside the agents (rdmalab.evidence: `wire` frames of the capture,
        `kernel_log` splat lines), each {t_ns (lab time), host, object, kind, data}: merged
        into the history on its time line, host_seq their order here."""
        with self._lock:
            base = len(self._merged)
            self._merged += [dict(r, seq=0, host_seq=base + i) for i, r in enumerate(records)]

    def _agent_records(self, agent: Agent) -> list[dict]:
        """All of an agent's records (a killable process's agent, not followed)."""
        return [] if agent.lab is None else self._parse(agent.lab._o.history_jsonl())

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

    def _archive_host(self, name: str) -> None:
        """Moves a host's followed records to the archive (its agent is about to go)."""
        self._fetch(name)
        with self._lock:
            self._archived += self._followed[name]
            self._followed[name] = []
            self._sealed.add(name)

    def _check_hosts(self, names) -> None:
        for name in names:
            if name not in self._agents:
                raise KeyError(f"no host {name!r} in {self.description}")

    def fresh_hosts(self, *names: str) -> None:
        """Makes each of these hosts that earlier labs used as booted: its next QP gets the
        first QPN again (rxe counts QPNs from 17 per device). A soft device (rxe, siw) is
        deleted and added again, with no process holding it (free_devices): its QPN pool is
        the device's, so that is a boot as far as QPNs go, in seconds where a TCG guest's
        reboot takes ~30 s. Any other device: the host is rebooted."""
        self._check_hosts(names)
        for name in names:
            m = self._machines[name]
            if self.pool.used.get(m.name, 0) <= 1:
                continue
            if device_label(m.facts.device) in SOFT_DEVICES:
                self._readd_device(name)
            else:
                self.reboot_host(name, 0)

    def _readd_device(self, name: str) -> None:
        m = self._machines[name]
        dev, t0 = m.facts.device, time.monotonic()
        self.free_devices(name)
        m.run(f"rdma link delete {dev}", 30, root=True).check(f"{name}: rdma link delete {dev}")
        AgentFaults._link_add(name, m, dev)
        AgentFaults._wait_usable(name, m)
        self.pool.used[m.name] = 1  # this lab, on a device as new as after a boot
        self.record("device_readded", object="host", host=name, machine=m.name, device=dev,
                    s=round(time.monotonic() - t0, 3))

    def free_devices(self, *names: str) -> None:
        """No process on these hosts holds an RDMA device open: each host whose agent made an
        earlier lab gets a new agent process. librdmacm keeps a verbs context on every device
        a process used through rdma_cm until the process exits, and a driver that cannot
        disassociate user contexts (rxe, siw, cxgb4) makes `rdma link delete` wait for it.
        Seconds on a TCG guest, where fresh_hosts' reboot costs ~30 s; QPNs count on."""
        self._check_hosts(names)
        for name in names:
            if self._agents[name].labs > 1:
                self._renew_agent(name)

    def _renew_agent(self, name: str) -> None:
        agent, m = self._agents[name], self._machines[name]
        t0 = time.monotonic()
        self._archive_host(name)
        try:
            agent.close_lab()  # Hung if its shutdown is stuck: the device stays held
        finally:
            agent.close(deadline_s=5.0)
        new = self.pool.renew_agent(agent, m)
        new.new_lab(self.seed, name, self.addresses)
        with self._lock:
            self._agents[name] = new
            self._sealed.discard(name)  # the new agent's records, from its seq 0
        self.record("agent_restart", object="host", host=name, machine=m.name,
                    old_pid=agent.pid, pid=new.pid, agent_s=round(time.monotonic() - t0, 3))

    def reboot_host(self, name: str, down_ns: int, boot_deadline_s: float = 180.0) -> None:
        """The reboot fault (AgentFaults.reboot): the history so far is kept, the machine
        powered off, on again after down_ns, and a new agent and lab started there."""
        agent, m = self._agents[name], self._machines[name]
        if not m.can_power:
            raise FaultNotSupported("reboot", f"host {name} ({m.name}) has no power commands "
                                    "(the inventory's power = {on, off, cycle})")
        self._archive_host(name)
        self.record("fault", object="host", host=name, fault="reboot", down_ns=down_ns,
                    machine=m.name)
        agent.broken = "its machine was powered off by a reboot fault"
        m.power_off()
        agent.lab = None
        agent.close(deadline_s=5.0)
        time.sleep(down_ns / 1e9)
        m.power_on()
        boot_s = m.wait_ready(boot_deadline_s)
        t_agent = time.monotonic()
        new = self.pool.replace_agent(agent, m)  # checks the install: a reboot may wipe it
        inst = self.pool._installed.get(m.name)
        agent_s = time.monotonic() - t_agent
        self.pool.warm_data_path()  # the peers' entries for it too (AgentPool.restart)
        new.new_lab(self.seed, name, self.addresses)
        self.pool.used[m.name] = 1  # this lab, on a fresh boot
        with self._lock:
            self._agents[name] = new
            self._sealed.discard(name)  # the new agent's records, from its seq 0
        self.record("host_back", object="host", host=name, boot_s=round(boot_s, 3),
                    agent_s=round(agent_s, 3),
                    agent_shipped=bool(inst is not None and getattr(inst, "copied", False)))

    def write_history(self, path: Union[str, os.PathLike]) -> None:
        os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            for r in self.history():
                f.write(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n")

    # -- diagnostics
    def dump_state(self) -> str:
        lines = []
        for name, agent in self._agents.items():
            m = self._machines[name]
            if name in self._lost:
                lines.append(f"host {name} = {m.name}: LOST {self._lost[name]}")
                continue
            procs = [p.name for p in agent.lab.host(name).processes] if agent.lab else []
            procs += [f"{p.name} (pid {p.pid}{'' if p.alive else ', killed'})"
                      for p in self._procs if p._host_name == name]
            lines.append(f"host {name} = {m.name} ({m.facts.data_address}, "
                         f"{m.facts.device}): processes {procs}")
        return "\n".join(lines)

    def diagnostic(self, headline: str) -> str:
        tail = self.history()[-HISTORY_TAIL:]
        lines = [f"Hung: {headline}", f"lab: {self.description} seed={self.seed} "
                 f"(not replayable: real devices)",
                 "--- state ---", self.dump_state(), f"--- last {len(tail)} history records ---"]
        lines += [json.dumps(r, sort_keys=True) for r in tail]
        return "\n".join(lines)

    def check_errors(self) -> None:
        for name, agent in self._agents.items():
            self._check_lost(name)
            if agent.lab is not None:
                agent.lab.check_errors()
        for proc in self._procs:
            if proc.agent is not None and proc.agent.lab is not None:
                proc.agent.lab.check_errors()

    def record_stuck(self, name: str, agent: Agent) -> None:
        """What a stuck agent (a lab shutdown, an evidence call past its deadline) was doing,
        read through its machine's own channel before the pool restarts it: each thread's
        state, wait channel and kernel stack, and every Python stack (SIGUSR1: rdmalab.agent). The `agent_stuck` record keeps it; stderr
        shows it in the scenario's report."""
        from .agent import stacks_path
        pid, m = agent.pid, self._machines[name]
        cmd = (f"kill -USR1 {pid} && sleep 1; for t in /proc/{pid}/task/*; do "
               "echo \"== thread $(cat $t/comm) state $(cut -d' ' -f3 $t/stat) "
               "wchan $(cat $t/wchan)\"; cat $t/stack; done; "
               f"echo '== python stacks'; cat {stacks_path(pid)}")
        try:
            r = m.run(cmd, STUCK_DUMP_S, root=True)
            text = r.out + (f"\n(stderr) {r.err}" if r.err.strip() else "")
        except Exception as e:  # the machine itself may be gone
            text = f"could not be read: {type(e).__name__}: {e}"
        text = text[-STUCK_DUMP_CHARS:]
        self.record("agent_stuck", object="host", host=name, machine=m.name, pid=pid,
                    stacks=text)
        print(f"rdmalab: {name} ({m.name}): agent pid {pid} stuck ({agent.broken}); its "
              f"threads:\n{text}", file=sys.stderr)

    # -- lifetime
    def shutdown(self) -> None:
        if self._shut:
            return
        self._shut = True
        errors = []
        try:
            self._faults.note_removals()
            self._faults.clear()
        except Exception as e:
            errors.append(e)
        finally:
            for proc in self._procs:  # their own agents, before the hosts' agents
                self._archive(proc.records, proc._host_name, f"proc:{proc.name}")
                try:
                    proc.close()
                except Exception as e:
                    errors.append(e)
            for name, agent in self._agents.items():
                # The history outlives the lab: kept past the agent's lab.
                self._archive_host(name)
                if name in self._lost:
                    continue  # nothing to close there; the pool restarts it
                try:
                    agent.close_lab()
                except Exception as e:  # the others still close; the next lab heals it
                    if isinstance(e, Hung):
                        self.record_stuck(name, agent)
                    agent.broken = agent.broken or f"lab shutdown failed: {e}"
                    errors.append(e)
            self._stop_follow.set()
            for t in self._followers:
                t.join(FOLLOW_WAIT_S + 5.0)
            try:
                self._faults.restore_devices()  # contexts closed: removals can finish
            except Exception as e:
                errors.append(e)
            for hook in self._shutdown_hooks:
                try:
                    hook(self)
                except Exception as e:
                    errors.append(e)
        if errors and not self._lost:
            raise errors[0]

    def __enter__(self) -> "AgentLab":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"<AgentLab {self.description} hosts={list(self._agents)}>"

