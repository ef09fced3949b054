"""PodmanMachine: a lab host that is a container on this machine (rdmalab.machines.machine's protocol).

The container (bindings/rdmalab/machines/container/hosts.sh: PREFIX-h<i> on network namespace PREFIX<i>) shares this
machine's kernel; commands run in it with `podman exec`, files go in with `podman cp`, and
execnet reaches it with the spec `popen//python=podman exec -i <name> /usr/bin/python3`, so
rdmalab.machines.deploy ships and starts the agent there exactly as on a VM or a real host. Power is the
container's: off = `podman stop`, on = `podman start` (the network namespace, and with it the
host's address and rxe device, stay).

    from rdmalab.machines.container.machine import container_hosts
    machines = container_hosts(2)            # rlc-h1, rlc-h2 as hosts.sh started them
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Optional

from ..machine import (WIRE_NFTABLES, HostFacts, MachineError, MachineUnreachable,
                       OwnKernelMachine, Result)

PODMAN = "podman"


class PodmanMachine(OwnKernelMachine):
    """One running container, reached with `podman exec` (root in the container). Its kernel
    is this machine's, but it reads its own kmsg view through its agent: its own kernel_machine."""

    def __init__(self, name: str, facts: Optional[HostFacts] = None):
        self.name = name
        self.facts = facts or HostFacts(device="")

    def _exec(self, cmd: str, stdin: bool, timeout: Optional[float] = None) -> list[str]:
        inner = ["/bin/sh", "-c", cmd]
        if timeout is not None:  # the command dies in the container too, not only our client
            inner = ["timeout", "-s", "KILL", f"{max(1, int(timeout))}"] + inner
        return [PODMAN, "exec", *(["-i"] if stdin else []), self.name, *inner]

    def run(self, cmd: str, timeout: float = 60.0, *, root: bool = False) -> Result:
        start = time.monotonic()
        try:
            p = subprocess.Popen(self._exec(cmd, False, timeout), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                 start_new_session=True)
        except OSError as e:
            raise MachineUnreachable(f"{self.name}: cannot run {PODMAN}: {e}") from e
        try:
            out, err = p.communicate(timeout=timeout + 5)
            timed_out = p.returncode == 137 and time.monotonic() - start >= timeout
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            timed_out = True
        why = err.lower()
        # podman's own errors: 125 (no such container), 255 (stopped: "container state
        # improper"); the command's are its own.
        if p.returncode in (125, 255) and ("no such container" in why
                                           or "state improper" in why):
            raise MachineUnreachable(f"{self.name}: {err.strip()}")
        return Result(p.returncode, out, err, timed_out, time.monotonic() - start)

    def popen(self, cmd: str, *, root: bool = False, stdin: bool = False) -> subprocess.Popen:
        return subprocess.Popen(self._exec(cmd, stdin), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT,
                                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                text=True, start_new_session=True)

    def _podman(self, *args: str, timeout: float = 120.0) -> str:
        try:
            r = subprocess.run([PODMAN, *args], capture_output=True, text=True,
                               timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise MachineError(f"{self.name}: {PODMAN} {' '.join(args)}: {e}") from e
        if r.returncode != 0:
            raise MachineError(f"{self.name}: {PODMAN} {' '.join(args)} failed "
                               f"(rc {r.returncode}): {r.stderr.strip()[-1000:]}")
        return r.stdout

    def copy_to(self, local: str, remote: str, timeout: float = 300.0) -> None:
        if os.path.isdir(local):  # the tree's contents into remote, as LocalMachine does
            self.run(f"mkdir -p '{remote}'", 30).check(f"{self.name}: mkdir {remote}")
            local = local.rstrip("/") + "/."
        self._podman("cp", local, f"{self.name}:{remote}", timeout=timeout)

    def copy_from(self, remote: str, local: str, timeout: float = 300.0) -> None:
        self._podman("cp", f"{self.name}:{remote}", local, timeout=timeout)

    def execnet_spec(self, python: str = "/usr/bin/python3") -> str:
        return f"popen//python={PODMAN} exec -i {self.name} {python}"

    def ssh_argv(self) -> list[str]:
        raise MachineError(f"{self.name}: a container host has no SSH target "
                           f"(use {PODMAN} exec -i {self.name})")

    @property
    def can_power(self) -> bool:
        return True

    def power_off(self) -> None:
        self._podman("stop", "-t", "5", self.name)

    def power_on(self) -> None:
        self._podman("start", self.name)

    def power_cycle(self) -> None:
        self._podman("restart", "-t", "5", self.name)

    def wait_ready(self, deadline_s: float = 180.0) -> float:
        start = time.monotonic()
        last = ""
        while time.monotonic() - start < deadline_s:
            try:
                r = self.run("true", timeout=15)
                if r.rc == 0:
                    return time.monotonic() - start
                last = r.err.strip()
            except MachineUnreachable as e:
                last = str(e)
            time.sleep(0.2)
        raise MachineUnreachable(f"{self.name}: not ready within {deadline_s} s: {last}")

    def alive(self) -> bool:
        r = subprocess.run([PODMAN, "container", "inspect", "--format", "{{.State.Running}}",
                            self.name], capture_output=True, text=True)
        return r.returncode == 0 and r.stdout.strip() == "true"


def container_hosts(n: int, prefix: str = "rlc", subnet: str = "10.78.0") -> list[PodmanMachine]:
    """The machines hosts.sh starts with `hosts.sh start N PREFIX` (RLC_SUBNET=subnet):
    device PREFIXrxe<i> (with RLC_RXE=1), netdev eth0, address subnet.<i>, wire faults by
    nftables in the host's namespace."""
    return [PodmanMachine(f"{prefix}-h{i}",
                          HostFacts(device=f"{prefix}rxe{i}", netdev="eth0",
                                    data_address=f"{subnet}.{i}", wire=WIRE_NFTABLES))
            for i in range(1, n + 1)]
