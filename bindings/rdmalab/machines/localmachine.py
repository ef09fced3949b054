"""LocalMachine: this machine as a Machine (rdmalab.machines.machine's protocol), with /bin/sh and cp.

For tests of what drives machines (deploying the agent, an agent lab over execnet popen), and
the base a network-namespace host can wrap. It has no power and no SSH.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from typing import Optional

from .machine import HostFacts, MachineError, OwnKernelMachine, PowerNotSupported, Result


class LocalMachine(OwnKernelMachine):
    """Runs commands here. env: the environment commands see (None: this process's), e.g. a
    PATH without some tool to play a host that lacks it."""

    def __init__(self, name: str = "local", facts: Optional[HostFacts] = None,
                 env: Optional[dict[str, str]] = None):
        self.name = name
        self.facts = facts or HostFacts(device="")
        self.env = env

    def _argv(self, cmd: str, root: bool) -> list[str]:
        if root and os.geteuid() != 0:
            return ["sudo", "-n", "/bin/sh", "-c", cmd]
        return ["/bin/sh", "-c", cmd]

    def run(self, cmd: str, timeout: float = 60.0, *, root: bool = False) -> Result:
        start = time.monotonic()
        # Its own session, so a timeout kills the command's children too, not only the shell.
        p = subprocess.Popen(self._argv(cmd, root), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                             env=self.env, start_new_session=True)
        try:
            out, err = p.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            timed_out = True
        return Result(p.returncode, out, err, timed_out, time.monotonic() - start)

    def popen(self, cmd: str, *, root: bool = False, stdin: bool = False) -> subprocess.Popen:
        return subprocess.Popen(self._argv(cmd, root), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT,
                                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                text=True, env=self.env, start_new_session=True)

    def copy_to(self, local: str, remote: str, timeout: float = 300.0) -> None:
        self._copy(local, remote)

    def copy_from(self, remote: str, local: str, timeout: float = 300.0) -> None:
        self._copy(remote, local)

    def _copy(self, src: str, dst: str) -> None:
        try:
            if os.path.isdir(src):
                shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
            else:
                shutil.copy2(src, dst)
        except OSError as e:
            raise MachineError(f"{self.name}: copy {src} -> {dst}: {e}") from e

    def execnet_spec(self, python: str = "/usr/bin/python3") -> str:
        return f"popen//python={python}"

    def ssh_argv(self) -> list[str]:
        raise MachineError(f"{self.name}: a local machine has no SSH target")

    @property
    def can_power(self) -> bool:
        return False

    def power_off(self) -> None:
        raise PowerNotSupported(f"{self.name}: a local machine cannot be powered off")

    def power_on(self) -> None:
        raise PowerNotSupported(f"{self.name}: a local machine cannot be powered on")

    def power_cycle(self) -> None:
        raise PowerNotSupported(f"{self.name}: a local machine cannot be power-cycled")

    def wait_ready(self, deadline_s: float = 180.0) -> float:
        return 0.0

    def alive(self) -> bool:
        return True
