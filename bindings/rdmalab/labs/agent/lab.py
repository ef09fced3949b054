"""AgentLab: the agent lab's Lab (rdmalab.protocol), its hosts a pool's machines (labs.agent.pool)
each running the host agent. Its history (following the hosts, lost hosts, records merged from
outside) is a LabHistory it holds (labs.agent.records)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable, Optional, Union

from ... import progress
from ...errors import FaultNotSupported, Hung
from ...errors import duration_ns as duration_of
from ...faults import records as wire_records
from ...protocol import KERNEL_ULP, WIRE_PLACEMENT
from ...agent.remote import Agent
from ...agent.serve import stacks_path
from ...machines.machine import SOFT_DEVICES, WIRE_NFT_BRIDGE, WIRE_NFTABLES
from .common import HISTORY_TAIL, POLL_S, STUCK_DUMP_CHARS, STUCK_DUMP_S, device_label
from .faults import AgentFaults
from .process import AgentProcess
from .records import LabHistory, kernel_holds

if TYPE_CHECKING:
    from .pool import AgentPool


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
        t0_ns = time.monotonic_ns()
        self._agents = dict(zip(names, pool.agents))
        self._machines = dict(zip(names, pool.machines))
        self._history = LabHistory(self._machines, self.agent_for, t0_ns, self._other_records)
        self.addresses = {n: m.facts.data_address for n, m in self._machines.items()}
        for name, agent in self._agents.items():
            agent.new_lab(seed, name, self.addresses)
            mname = self._machines[name].name
            pool.used[mname] = pool.used.get(mname, 0) + 1  # labs since its boot
        self._faults = AgentFaults(self)
        self._procs: list[AgentProcess] = []  # killable processes (agents of their own)
        self._hosts: dict[str, tuple] = {}  # name -> (its agent's lab, that lab's Host)
        self._shutdown_hooks: list[Callable[["AgentLab"], None]] = []
        self._shut = False
        self.record("lab_start", object="lab", lab=self.description,
                    machines={n: m.name for n, m in self._machines.items()}, healed=healed,
                    kernels={n: pool.kernels.get(m.name, "") for n, m in self._machines.items()})
        self._history.follow()

    # -- what this lab can do (rdmalab.protocol)
    @property
    def capabilities(self) -> frozenset:
        caps = {KERNEL_ULP}  # every host is a kernel of its own, or a namespace of one
        if not self.switch_unusable() and not any(
                self.nftables_unusable(n) for n in self._machines):
            caps.add(WIRE_PLACEMENT)
        return frozenset(caps)

    def has(self, capability: str) -> bool:
        return capability in self.capabilities

    def switch_unusable(self) -> str:
        """Why wire rules cannot go to a fault switch; "" when they can (switch_path)."""
        if self.pool.switch_control is None:
            return (f"no fault switch on the path of {self.description}'s hosts (the VM lab "
                    "without build/faults/rdmalab-switch, or no [[switch]] in the inventory)")
        off = [n for n, m in self._machines.items() if m.facts.wire_switch == ""]
        if off:
            return f"host(s) {', '.join(off)} are not behind the fault switch (wire.via)"
        return ""

    def switch_path(self) -> Optional[str]:
        """The fault switch's control socket; None where switch_unusable says why not."""
        return None if self.switch_unusable() else self.pool.switch_control

    def nftables_unusable(self, host: str) -> str:
        """Why a wire rule cannot sit in host's own nftables ("" when it can): the host's
        traffic must go through its network stack (rxe, siw) or the inventory says so."""
        m = self._machines[host]
        if m.facts.wire == WIRE_NFTABLES or device_label(m.facts.device) in SOFT_DEVICES:
            return ""
        if m.facts.wire == WIRE_NFT_BRIDGE and m.bridge_machine is not None:
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
        self._history.check_lost(name)
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
        proc = AgentProcess(self, host, name, self._history)
        self._procs.append(proc)
        self.record("process_start", object=f"proc:{name}", host=host, pid=proc.pid)
        return proc

    def devices_by_host(self) -> dict[str, str]:
        """host -> the device label metrics use ("rxe", "siw", "mlx5")."""
        return {n: device_label(m.facts.device) for n, m in self._machines.items()}

    def kernels_by_host(self) -> dict[str, str]:
        """host -> `uname -r` of its machine, read when its agent started."""
        return {n: self.pool.kernels.get(m.name, "") for n, m in self._machines.items()}

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

    # -- time (wall clock: devices run on their own)
    def run_for(self, duration_ns: int) -> None:
        """Lets duration_ns of wall-clock time pass (a negative duration: Error EINVAL, as on
        every lab)."""
        duration_ns = duration_of("run_for", duration_ns)
        with progress.Waiting(f"running for {duration_ns / 1e9:.0f} s", duration_ns / 1e9):
            time.sleep(duration_ns / 1e9)
        self.check_errors()

    def sleep(self, duration_ns: int) -> None:
        """The controller sleeps (run_for; the error names sleep)."""
        self.run_for(duration_of("sleep", duration_ns))

    def wait_until(self, pred: Callable[[], bool], timeout_ns: int = 10 * 10**9,
                   what: str = "condition") -> None:
        timeout_ns = duration_of("wait_until", timeout_ns, "timeout_ns")
        start = self.now_ns
        end = start + timeout_ns
        with progress.Waiting(f"waiting for {what}", timeout_ns / 1e9):
            while not pred():
                self._history.check_lost()
                if self.now_ns >= end:
                    raise Hung(what, self.diagnostic(f"waited {timeout_ns} ns for {what}"))
                time.sleep(POLL_S)
        self.check_errors()

    def spawn(self, name: str, fn: Callable[[], None]) -> None:
        threading.Thread(target=fn, name=name, daemon=True).start()

    # -- fresh hosts, new agents, reboots
    def _check_hosts(self, names) -> None:
        for name in names:
            if name not in self._agents:
                raise KeyError(f"no host {name!r} in {self.description}")

    def fresh_hosts(self, *names: str) -> None:
        """Makes each of these hosts that earlier labs used as booted: its next QP gets the
        first QPN again (rxe counts QPNs from 17 per device). A soft device (rxe, siw) is
        deleted and added again, with no process holding it (free_devices): its QPN pool is
        the device's, so that is a boot as far as QPNs go, in seconds where a TCG guest's
        reboot takes ~30 s. Any other device, or a soft one `rdma link delete` cannot remove
        (a ULP still holding it): the host is rebooted (a `device_readd_failed` record)."""
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
        r = m.run(f"rdma link delete {dev}", 30, root=True)
        if r.rc != 0 or r.timed_out:
            # A kernel client that cannot let the device go (ib_srp's removal waits for I/O
            # that an earlier campaign's fault left hanging): a boot makes it new instead.
            self.record("device_readd_failed", object="host", host=name, machine=m.name,
                        device=dev, rc=r.rc, timed_out=r.timed_out, err=r.err[-300:])
            self.reboot_host(name, 0)
            return
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
        self._history.archive_host(name)
        try:
            agent.close_lab()  # Hung if its shutdown is stuck: the device stays held
        finally:
            agent.close(deadline_s=5.0)
        new = self.pool.renew_agent(agent, m)
        new.new_lab(self.seed, name, self.addresses)
        self._agents[name] = new
        self._history.follow_new_agent(name)
        self.record("agent_restart", object="host", host=name, machine=m.name,
                    old_pid=agent.pid, pid=new.pid, agent_s=round(time.monotonic() - t0, 3))

    def reboot_host(self, name: str, down_ns: int, boot_deadline_s: float = 180.0) -> None:
        """The reboot fault (AgentFaults.reboot): the history so far is kept, the machine
        powered off, on again after down_ns, and a new agent and lab started there."""
        agent, m = self._agents[name], self._machines[name]
        if not m.can_power:
            raise FaultNotSupported("reboot", f"host {name} ({m.name}) has no power commands "
                                    "(the inventory's power = {on, off, cycle})")
        self._history.archive_host(name)
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
        self._agents[name] = new
        self._history.follow_new_agent(name)
        self.record("host_back", object="host", host=name, boot_s=round(boot_s, 3),
                    agent_s=round(agent_s, 3),
                    agent_shipped=bool(inst is not None and getattr(inst, "copied", False)))

    # -- diagnostics
    def dump_state(self) -> str:
        lines, lost = [], self._history.lost()
        for name, agent in self._agents.items():
            m = self._machines[name]
            if name in lost:
                lines.append(f"host {name} = {m.name}: LOST {lost[name]}")
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
            self._history.check_lost(name)
            if agent.lab is not None:
                agent.lab.check_errors()
        for proc in self._procs:
            if proc.agent is not None and proc.agent.lab is not None:
                proc.agent.lab.check_errors()

    def record_stuck(self, name: str, agent: Agent) -> None:
        """What a stuck agent (a lab shutdown, an evidence call past its deadline) was doing,
        read through its machine's own channel before the pool restarts it: each thread's
        state, wait channel and kernel stack, and every Python stack (SIGUSR1:
        rdmalab.agent.serve). The `agent_stuck` record keeps it; stderr shows it in the
        scenario's report."""
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

    # -- the history (its LabHistory)
    @property
    def t0_ns(self) -> int:
        """The lab's start on the controller's CLOCK_MONOTONIC: t_ns 0 of its history."""
        return self._history.t0_ns

    def record(self, kind: str, object: str = "scenario", host: str = "", **data) -> int:
        return self._history.record(kind, object, host, **data)

    def history(self, since_seq: int = 0) -> list[dict]:
        """Every host's records and the controller's, on the lab's time line (LabHistory)."""
        return self._history.history(since_seq)

    def write_history(self, path: Union[str, os.PathLike]) -> None:
        self._history.write(path)

    def merge_records(self, records: list[dict]) -> None:
        """Records made outside the agents (rdmalab.report.evidence: `wire` frames of the capture,
        `kernel_log` splat lines), merged into the history (LabHistory.merge)."""
        self._history.merge(records)

    def _other_records(self) -> list[dict]:
        """What no follower fetches: the killable processes' records (agents of their own) and
        the fault switch's (it runs on this machine's clock)."""
        records = [r for proc in self._procs for r in proc.records()]
        return records + [wire_records.from_switch(r, self.t0_ns)
                          for r in self._faults.switch_history()]

    def lost_hosts(self) -> dict[str, dict]:
        """host -> what is known of its loss (machine, at_ns, error, records_kept). Asks each
        live agent once, so a loss is known as soon as the scenario's call failed."""
        if not self._shut:
            self._history.fetch_all()
        return self._history.lost()

    def run_on(self, host: str, module: str, function: str, *args,
               deadline_s: float = 60.0):
        """module.function(host's agent lab, *args) in host's agent, its result copied back
        (rdmalab.protocol.Lab.run_on); past deadline_s Hung, the agent marked broken."""
        self.host(host)  # KeyError, HostLost
        agent = self._agents[host]
        return agent.call_copy(module, function, agent.lab, *args, deadline_s=deadline_s,
                               what=f"{module}.{function} on {host}")

    def kernel_resources(self, host: str, pids: set[int]) -> dict[str, int]:
        """What the host's kernel still holds for these pids, by kind (records.kernel_holds)."""
        return kernel_holds(self.agent_for(host), self._machines[host], pids)

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
                self._history.archive(proc.records, proc._host_name, f"proc:{proc.name}")
                try:
                    proc.close()
                except Exception as e:
                    errors.append(e)
            for name, agent in self._agents.items():
                # The history outlives the lab: kept past the agent's lab.
                self._history.archive_host(name)
                if name in self._history.lost():
                    continue  # nothing to close there; the pool restarts it
                try:
                    agent.close_lab()
                except Exception as e:  # the others still close; the next lab heals it
                    if isinstance(e, Hung):
                        self.record_stuck(name, agent)
                    agent.broken = agent.broken or f"lab shutdown failed: {e}"
                    errors.append(e)
            self._history.stop()
            try:
                self._faults.restore_devices()  # contexts closed: removals can finish
            except Exception as e:
                errors.append(e)
            for hook in self._shutdown_hooks:
                try:
                    hook(self)
                except Exception as e:
                    errors.append(e)
        if errors and not self._history.lost():
            raise errors[0]

    def __enter__(self) -> "AgentLab":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"<AgentLab {self.description} hosts={list(self._agents)}>"
