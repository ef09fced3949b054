"""AgentPool: a lab's machines (a Fleet, from its kind's fleet function in rdmalab.machines)
with their agents, started, warmed, healed and health-checked; labs (AgentLab) come and go on
them."""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterable

from ... import progress
from ...errors import FaultNotSupported, Hung
from ...agent.remote import Agent
from ...machines import deploy, hostcheck
from ...paths import REPO
from ...machines.deploy import AGENT_DIR
from ...machines.machine import Fleet, each_host
from .lab import AgentLab

# `ip neigh` states in which the kernel has the peer's MAC (NUD_VALID less PERMANENT, NOARP,
# PROBE): what warm_data_path waits for.
_NEIGH_RESOLVED = ("REACHABLE", "STALE", "DELAY")


class AgentPool:
    """A fleet's machines with their agents; labs come and go on them. The fleet's owner (the
    VM lab's guests, an inventory's locks) is closed with the pool."""

    def __init__(self, fleet: Fleet, *, log: Callable[[str], None] = lambda m: None):
        self.machines = list(fleet.machines)
        self.description = fleet.description
        self.switch_control = fleet.switch_control
        self.owner, self.check_health = fleet.owner, fleet.health_check
        self.agent_dir, self.log = fleet.agent_dir or AGENT_DIR, log
        self.agents: list[Agent] = []
        self.used: dict[str, int] = {}  # machine name -> labs run on it since its last boot
        self.leaks: list[str] = []  # what health checks after a lab found left behind
        self._installed: dict[str, object] = {}  # machine name -> rdmalab.machines.deploy.Installed
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
        try:  # inventory_fleet health-checked them as it chose them
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
        controller's own version of the package shipped there (rdmalab.machines.deploy). The install this
        pool made there is started without a check first; where that fails (gone with a
        reboot's fresh tmpfs: "no rdmalab agent deployed at ...", replaced, a gateway that
        died) the install is checked and shipped again. A reboot the pool knows of
        (replace_agent, restart) forgets the install instead: it is looked for before any
        start. An install of this version found there (a pool's first start, after a reboot)
        is taken by its files and started, not imported first (seconds of a TCG guest's CPU);
        where that start fails it is checked, imported, as well."""
        import execnet  # deferred: optional; only the agent labs need it, not their import
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
        agent_dir is on a tmpfs), so the next start checks it (rdmalab.machines.deploy.ensure_agent: one
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
