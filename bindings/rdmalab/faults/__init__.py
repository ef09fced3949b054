"""Faults: the one front-end of wire rules (wire.py) and each backend's sinks and fault verbs
(model.py: the model's fabric; the agent lab's switch and nftables sinks live with it in
rdmalab.labs.agent), nftables' translation of the rule language (nft.py), the fault switch's
control client (fabric.py)."""

from .common import NoFaults, host_name
from .model import Faults, WireRule
from .wire import AT, CM_ATTR_ID, WireFaults, expand_cm, rule_spec

__all__ = ["AT", "CM_ATTR_ID", "Faults", "NoFaults", "WireFaults", "WireRule", "expand_cm",
           "host_name", "rule_spec"]
