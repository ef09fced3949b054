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

import json
import os
import pathlib
import shutil
import sys
import threading
import time
from typing import Callable, Iterable, Optional, Union

from .errors import FaultNotSupported, Hung
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
        self.boot_s = 0.0
        t0 = time.monotonic()
        try:
            self.vmlab.start_all()
            self.vmlab.wait_all_ready(boot_deadline_s)
            self.boot_s = time.monotonic() - t0
            for vm in self.vmlab.vms:
                self.agents.append(self._start_agent(vm))
        except BaseException:
            self.close()
            raise

    def _start_agent(self, vm) -> Agent:
        import execnet
        gw = execnet.makegateway(f"ssh=-F {self.vmlab.ssh_config} {vm.spec.name}"
                                 f"//python=/usr/bin/python3")
        return Agent.start(gw, vm.spec.name)

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
            self.agents[i] = self._start_agent(vm)
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


class VmFaults(NoFaults):
    """The faults the VM lab applies so far: link down/up of a host's data NIC (rxe and siw
    raise PORT_ERR / PORT_ACTIVE from the netdev's carrier). Wire rules, reboots and process
    kills come with the fault switch; until then they raise FaultNotSupported."""

    def __init__(self, lab: "VmLab"):
        super().__init__(lab)
        self._counts: dict[str, int] = {}
        self._down: set[str] = set()

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
        return dict(self._counts)

    def clear(self) -> None:
        for name in list(self._down):  # the next lab on these VMs starts with links up
            self.port_up(name)

    def _unsupported_reason(self, fault: str) -> str:
        return (f"the VM lab ({self._lab.description}) cannot apply {fault} yet: wire, reboot "
                "and process faults need the fault switch")


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
        self._faults = VmFaults(self)
        self._records: list[dict] = []
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
        for name, agent in self._agents.items():
            if agent.lab is None:
                continue
            text = agent.lab._o.history_jsonl()
            for line in text.splitlines():
                r = json.loads(line)
                r["host_seq"] = r.pop("seq")
                r["t_ns"] -= self._t0  # the agent's clock is offset onto ours
                merged.append(r)
        with self._lock:
            merged += [dict(r, host_seq=r["seq"]) for r in self._records]
        merged.sort(key=lambda r: (r["t_ns"], r["host"], r["host_seq"]))
        for i, r in enumerate(merged):
            r["seq"] = i
        return merged[since_seq:]

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
        for agent in self._agents.values():
            if agent.lab is not None:
                agent.lab.check_errors()

    # -- lifetime
    def shutdown(self) -> None:
        if self._shut:
            return
        self._shut = True
        errors = []
        try:
            self._faults.clear()
        finally:
            for name, agent in self._agents.items():
                try:
                    agent.close_lab()
                except Exception as e:  # the others still close; the next lab heals it
                    agent.broken = agent.broken or f"lab shutdown failed: {e}"
                    errors.append(e)
        if errors:
            raise errors[0]

    def __enter__(self) -> "VmLab":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"<VmLab {self.description} hosts={list(self._agents)}>"
