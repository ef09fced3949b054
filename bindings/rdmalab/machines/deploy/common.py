"""What the deploy rooms share: the error, where the agent goes on a host, and how the
controller runs a command or a Python script there."""
from __future__ import annotations

import shlex
from typing import Callable

from ..machine import Machine

AGENT_DIR = "/var/tmp/rdmalab-agent"
PYTHON = "/usr/bin/python3"   # Debian's: the one that sees python3-rpyc (see README)

Log = Callable[[str], None]


class DeployError(RuntimeError):
    """The agent could not be installed or started on a host: the message names the host and
    what to do."""


def py(script: str, *args: str) -> str:
    """The shell command that runs script with args under the host's PYTHON."""
    # The interpreter CMake builds for (CMakeLists.txt names /usr/bin/python3). -I: the host's
    # PYTHONPATH and user site must not decide what loads; cd /: nor the cwd.
    return " ".join(["cd / &&", PYTHON, "-I", "-c", shlex.quote(script),
                     *map(shlex.quote, args)])


def ok(machine: Machine, cmd: str, what: str, timeout: float = 120) -> str:
    """cmd's output; DeployError naming what failed where, with its output's end."""
    r = machine.run(cmd, timeout=timeout)
    if r.rc != 0 or r.timed_out:
        raise DeployError(f"{machine.name}: {what} failed (rc {r.rc}): {(r.err or r.out)[-1000:]}")
    return r.out
