"""rdmalab: a test and fault-injection harness for the Linux RDMA stack.

The host API (pyverbs-flavoured) over the C++ engine in rdmalab._core:

    import rdmalab
    with rdmalab.model_lab(seed=1, hosts={"a": "ib", "b": "ib"}) as lab:
        pair = rdmalab.resources.RCPair(lab)
        ...

Errors: rdmalab.Error (.verb, .errno, .detail), DeadlineExceeded, Hung, FaultNotSupported.
Scenarios use the pytest plugin (rdmalab.pytest_plugin): fixtures lab, lab_factory, hosts,
personality; marker requires(...). The CLI: python3 -m rdmalab run.
"""

from . import _core  # noqa: F401  (rdmalab._core: the engine bindings)
from .cm import CmChannel, CmEvent, CmEventError, CmId
from .errors import (DeadlineExceeded, Error, FaultNotSupported, HostLost, Hung, WallClockTimeout,
                     make_error)
from .faults import CM_ATTR_ID, Faults, NoFaults, WireRule
from .lab import Host, Lab, Process, model_lab, personalities
from .protocol import (CM_PROTOCOL_STATE, SRQ_OCCUPANCY, STATE_DUMP, VIRTUAL_TIME,
                       WIRE_PLACEMENT, LabProtocol)
from .names import NS_PER_MS, NS_PER_SEC, NS_PER_US, ms, sec, us
from .requests import MODIFY_KEYWORDS
from .verbs import WC, AsyncEvent, Context, Cq, DeviceCaps, Mr, Pd, Qp, Srq, Xrcd, unwrap
from . import cm, resources, stack  # noqa: E402  (they import the names above)

__all__ = [
    "AsyncEvent", "CM_ATTR_ID", "CM_PROTOCOL_STATE", "LabProtocol", "SRQ_OCCUPANCY",
    "STATE_DUMP", "VIRTUAL_TIME", "WIRE_PLACEMENT", "CmChannel", "CmEvent", "CmEventError", "CmId", "Context", "Cq",
    "DeadlineExceeded", "DeviceCaps", "Error", "FaultNotSupported", "Faults", "Host", "HostLost",
    "Hung",
    "Lab", "MODIFY_KEYWORDS", "Mr", "NS_PER_MS", "NS_PER_SEC", "NS_PER_US", "NoFaults",
    "Pd", "Process", "Qp", "Srq", "WC", "WallClockTimeout", "WireRule", "Xrcd", "cm",
    "make_error", "model_lab", "ms", "personalities", "resources", "sec", "stack", "unwrap", "us",
]
