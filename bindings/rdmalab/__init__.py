"""rdmalab: a test and fault-injection harness for the Linux RDMA stack.

The host API (pyverbs-flavoured) over the C++ engine in rdmalab._core:

    import rdmalab
    with rdmalab.model_lab(seed=1, hosts={"a": "ib", "b": "ib"}) as lab:
        pair = rdmalab.resources.RCPair(lab)
        ...

Errors: rdmalab.Error (.verb, .errno, .detail), DeadlineExceeded, Hung, FaultNotSupported.
Scenarios use the pytest plugin (rdmalab.run.pytest_plugin): fixtures lab, lab_factory, hosts,
personality; marker requires(...). The CLI: python3 -m rdmalab run.

The rooms (docs/DESIGN.md): api (the host API), labs (the engine labs and the agent lab),
agent (what runs on a host), faults, schedules (and the swarm), checkers, findings, report,
run (the pytest plugin and the CLI), machines (where hosts come from: qemu guests, namespaces,
an inventory, containers).

This face resolves its names on first use (PEP 562): the engine (rdmalab._core, a compiled
module) loads only when a name needs it, so the rooms that do without it (machines, report,
findings) import before it is built.
"""

from __future__ import annotations

import importlib

# name -> the module that is its one home (a module itself when the name is the module's)
_FACE = {
    "_core": "._core",
    "api": ".api", "cm": ".api.cm", "resources": ".api.resources", "stack": ".api.stack",
    **dict.fromkeys(("CmChannel", "CmId"), ".api.cm"),
    **dict.fromkeys(("CmEvent", "CmEventError"), ".api.cm_values"),
    **dict.fromkeys(("DeadlineExceeded", "Error", "FaultNotSupported", "HostLost", "Hung",
                     "WallClockTimeout", "WorkloadError", "make_error"), ".errors"),
    **dict.fromkeys(("CM_ATTR_ID", "Faults", "NoFaults", "WireRule"), ".faults"),
    **dict.fromkeys(("Host", "Process", "model_lab", "personalities"), ".labs.engine"),
    **dict.fromkeys(("CM_PROTOCOL_STATE", "KERNEL_ULP", "SRQ_OCCUPANCY", "STATE_DUMP",
                     "VIRTUAL_TIME", "WIRE_PLACEMENT", "Lab"), ".protocol"),
    "workloads": ".workloads", "NvmeOf": ".workloads", "Iser": ".workloads", "Nfs": ".workloads", "Srp": ".workloads",
    **dict.fromkeys(("NS_PER_MS", "NS_PER_SEC", "NS_PER_US", "ms", "sec", "us"), ".names"),
    "MODIFY_KEYWORDS": ".api.requests",
    **dict.fromkeys(("WC", "AsyncEvent", "Context", "Cq", "DeviceCaps", "Mr", "Pd", "Qp", "Srq",
                     "Xrcd", "unwrap"), ".api.verbs"),
}
_MODULES = {"_core", "api", "cm", "resources", "stack"}

__all__ = sorted(_FACE)


def __getattr__(name: str):
    home = _FACE.get(name)
    if home is None:
        raise AttributeError(f"module 'rdmalab' has no attribute {name!r}")
    module = importlib.import_module(home, __name__)
    value = module if name in _MODULES else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_FACE))
