"""The agent lab: a Lab (rdmalab.protocol) whose hosts are Machines (bindings/rdmalab/machines/machine.py) each
running the host agent (rdmalab.agent.serve) under execnet over SSH. The machines come from the VM
lab (rdmalab.machines.qemu: qemu guests on the fault switch, `--lab vm:rxe`) or from an inventory of real
machines (rdmalab.machines.inventory, `--lab inventory:PATH`); the lab drives both the same way.
A kind's fleet function (rdmalab.run.labkinds names it) chooses and boots them; the pool
starts their agents.

    pool = AgentPool(qemu.vm_fleet("rxe", 2))  # boots once; reused by every lab
    with pool.lab(seed=1) as lab:              # hosts "a", "b": fresh verbs labs in the agents
        pair = RCPair(lab)                     # built in the agents; proxies here
    pool.close()

The controller's clock is its CLOCK_MONOTONIC; each agent's offset is measured at start, so the
merged history orders records of all hosts on one time line. Each host's records are followed
as they are written (a fetch waits in the agent for the next, up to FOLLOW_WAIT_S), so a host
lost mid-scenario keeps what it said until then.
"""

from __future__ import annotations

from ...errors import Hung
from ...machines.machine import SOFT_DEVICES
from ...machines.deploy import AGENT_DIR
from .common import device_label
from .faults import AgentFaults
from .lab import AgentLab
from .pool import AgentPool
from .process import AgentProcess
from .sinks import NftRule, SwitchRule

__all__ = [
    "AGENT_DIR", "SOFT_DEVICES", "AgentFaults", "AgentLab", "AgentPool", "AgentProcess", "Hung",
    "NftRule", "SwitchRule", "device_label",
]
