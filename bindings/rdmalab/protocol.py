"""The Lab protocol: what every lab offers a scenario, whatever its hosts are.

Two kinds implement it: the engine labs of rdmalab.labs.engine (the model, and a machine's own devices
in an agent) and rdmalab.labs.agent.AgentLab (hosts reached through agents on Machines: qemu
guests, inventory hosts). Nothing above this protocol (the host API's helpers, resources,
stack wrappers, metrics, the pytest plugin, scenarios) asks which kind it has: it asks
`lab.has(capability)`, and where an object is built it asks `lab.place(anchor)`.

Capabilities a lab may have (lab.capabilities):
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Protocol, runtime_checkable

# Waits are instant and every thread is scheduled by the seed: one seed replays one run, and a
# scenario may place an action between two protocol steps (the model).
VIRTUAL_TIME = "virtual_time"
# CmId.protocol_state answers the IB CM state of the id (ESTABLISHED, TIMEWAIT, ...): the
# model's; the kernel keeps it inside cm.c.
CM_PROTOCOL_STATE = "cm_protocol_state"
# Srq.outstanding answers the receives still queued in an SRQ: the model's; libibverbs has no
# verb for it (a device scenario counts from the completion ledger).
SRQ_OCCUPANCY = "srq_occupancy"
# Where a wire rule sits changes its effect: a fault switch and the sending host (nftables) are
# different places on the path (rules take at="switch" / at="host").
WIRE_PLACEMENT = "wire_placement"
# dump_state() describes every live object (a hung wait's dump includes it).
STATE_DUMP = "state_dump"

# The hosts run kernels whose ULPs (nvme-rdma, nvmet-rdma, ...) a workload drives: run_on runs
# a workload's host side in the host's own process (rdmalab.workloads).
KERNEL_ULP = "kernel_ulp"

CAPABILITIES = (VIRTUAL_TIME, CM_PROTOCOL_STATE, SRQ_OCCUPANCY, WIRE_PLACEMENT, STATE_DUMP,
                KERNEL_ULP)


@runtime_checkable
class Lab(Protocol):
    """A lab of named hosts. Time is in ns on the lab's clock."""

    description: str        # "model:ib", "vm:rxe", "inventory:lab.toml" (a column of the table)
    seed: int
    replay: str             # how to replay this run (the plugin sets it)
    backend: str            # a label for reports ("model", "verbs"); never branch on it
    tolerance_ns: int       # slack a device gets in time bounds the model does not predict
    timer_slack_ns: int     # per kernel timer whose run cm_timing predicts (0 on the model)
    addresses: dict         # host name -> what rdma_cm resolves for it
    capabilities: frozenset
    t0_ns: int              # the lab clock's time of the history's t_ns 0 (0: the same clock)

    def has(self, capability: str) -> bool: ...
    @property
    def now_ns(self) -> int: ...
    @property
    def hosts(self) -> dict: ...
    def host(self, name: str) -> Any: ...
    def address_of(self, host: str) -> str: ...
    @property
    def faults(self) -> Any: ...
    @property
    def replayable(self) -> bool: ...

    def stalled_ns(self, host: str, from_ns: int, to_ns: int) -> int: ...
    def run_for(self, duration_ns: int) -> None: ...
    def sleep(self, duration_ns: int) -> None: ...
    def wait_until(self, pred: Callable[[], bool], timeout_ns: int = ...,
                   what: str = ...) -> None: ...
    def spawn(self, name: str, fn: Callable[[], None]) -> None: ...

    def history(self, since_seq: int = 0) -> list: ...
    def write_history(self, path) -> None: ...
    def record(self, kind: str, object: str = "scenario", host: str = "", **data) -> int: ...

    def dump_state(self) -> str: ...
    def diagnostic(self, headline: str) -> str: ...
    def check_errors(self) -> None: ...

    def place(self, anchor: Any) -> Optional[Any]:
        """Where an object anchored to `anchor` (a host name, a Host, a QP, a context) is
        built: the agent it lives in, or None for this process."""

    def run_on(self, host: str, module: str, function: str, *args,
               deadline_s: float = ...) -> Any:
        """module.function(the host's lab, *args) in the host's own process, its plain-data
        result copied back; past deadline_s a Hung (the host's agent is then restarted before
        the next lab). Without KERNEL_ULP: FaultNotSupported."""

    def devices_by_host(self) -> dict: ...
    def kernels_by_host(self) -> dict:
        """host -> the release of the kernel its device runs under (`uname -r`; the model's:
        the kernel it models); "" where it is not known."""
    def attach_metrics(self, metrics: Any) -> None: ...
    def lost_hosts(self) -> dict: ...
    def killable_process(self, host: str, name: str) -> Any: ...
    def fresh_hosts(self, *names: str) -> None: ...
    def free_devices(self, *names: str) -> None: ...
    def on_shutdown(self, fn: Callable[[Any], None]) -> None: ...
    def shutdown(self) -> None: ...
