"""The kinds of lab a --lab option names, one row each with what it can do: the one table the
CLI (rdmalab.run.cli, rdmalab.run.inputs) and the pytest plugin read, so that no code above the
Lab protocol compares a kind's name. A new kind of lab is a row here.

  model      the model, one column per personality, in this process
  vm         the qemu VM lab, one column per soft device (rxe, siw)
  netns      hosts as network namespaces on one kernel (rdmalab.machines.netns)
  inventory  the machines of a TOML inventory (rdmalab.machines.inventory)

A kind whose hosts are Machines names its fleet function, which lives in the kind's module in
rdmalab.machines: a new Machine kind is that module and a row here. The CLI reads this table
without the engine: the rows' builders import it when they run.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Optional, Sequence

from ..machines.inventory.fleet import inventory_fleet
from ..machines.machine import SOFT_DEVICES
from ..machines.netns.fleet import netns_fleet
from ..machines.qemu import qemu_unavailable, vm_fleet

DEFAULT_LAB = "model"  # --lab when none is given


def _engine():
    from ..labs import engine  # the engine (rdmalab._core): the CLI reads this table without it
    return engine


def personalities() -> list[str]:
    """The model's personalities ("ib", "roce", "iwarp-siw", ...)."""
    return _engine().personalities()


def _model_lab(personality: str, seed: int, hosts, **options):
    """A model lab whose hosts have this personality; a host given as {name: {...}} may
    override it, or the model's xrc_tgt_lifetime."""
    if isinstance(hosts, dict):
        specs = {}
        for name, host in hosts.items():
            host = {"personality": host} if isinstance(host, str) else dict(host or {})
            host.setdefault("personality", personality)
            specs[name] = host
    else:
        specs = {name: personality for name in hosts}
    return _engine().model_lab(seed=seed, hosts=specs, **options)


def _runs_anywhere() -> Optional[str]:
    return None


def _itself(name: str) -> str:
    return name


def _file_stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


@dataclasses.dataclass(frozen=True)
class LabKind:
    """One kind of lab: how --lab names it and what its labs can do."""
    name: str     # the word before the colon
    title: str    # what messages call it ("the VM lab cannot run here")
    usage: str    # its forms, as the refusal of an unknown kind lists them
    example: str  # a form with names, as the refusal of an empty list suggests
    device: bool  # a kernel's RDMA device: evidence, kernel logs, compared with the model
    known: Callable[[], Sequence[str]] = tuple  # the names it takes after the colon
    default: Optional[tuple[str, ...]] = None   # the names when none is given; None: every known
    unknown: str = ""  # the refusal of names it does not know: .format(bad=, known=)
    inventory_file: bool = False  # the name is an inventory file, whose hosts are reached first
    build: Optional[Callable] = None  # (name, seed, hosts, **options) -> a Lab in this process
    fleet: Optional[Callable] = None  # (name, hosts, log) -> the Fleet its labs' agents run on
    unavailable: Callable[[], Optional[str]] = _runs_anywhere  # why it cannot run on this machine
    label: Callable[[str], str] = _itself  # the column's label from the name

    @property
    def pooled(self) -> bool:
        """Its labs take machines from a pool the session starts on its fleet, and closes
        after the kind's column."""
        return self.fleet is not None

    def finding_key(self, caps) -> str:
        """The findings registry's key for a lab of this kind: the driver ("rxe") on a device,
        "model:<personality>" on the model (a personality that copies a device's finding)."""
        return caps.personality if self.device else f"model:{caps.personality}"


LAB_KINDS: dict[str, LabKind] = {kind.name: kind for kind in (
    LabKind("model", "model", "model, model:PERSONALITY[,...]", "model:roce,ib", device=False,
            known=personalities, unknown="unknown personality {bad}; known: {known}",
            build=_model_lab),
    LabKind("vm", "VM lab", "vm[:rxe,siw]", "vm:rxe,siw", device=True,
            known=lambda: SOFT_DEVICES, default=("rxe",),
            unknown="unknown VM lab device {bad}; VM lab devices: {known}",
            fleet=vm_fleet, unavailable=qemu_unavailable),
    LabKind("netns", "netns lab", "netns[:rxe,siw]", "netns:rxe", device=True,
            known=lambda: SOFT_DEVICES, default=("rxe",),
            unknown="unknown netns lab device {bad}; netns lab devices: {known}",
            fleet=netns_fleet),
    LabKind("inventory", "inventory", "inventory:PATH", "inventory:lab.toml", device=True,
            inventory_file=True, fleet=inventory_fleet, label=_file_stem),
)}
