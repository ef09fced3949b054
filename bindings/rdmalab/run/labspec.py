"""The columns of a run: each --lab parsed into LabSpecs (a kind of lab and what it runs on), the
caps of each probed once, each inventory's hosts reached before any scenario, and the command
that replays a test on a spec."""

from __future__ import annotations

import dataclasses
import functools
import os

import pytest

from . import inputs
from .labkinds import DEFAULT_LAB, LAB_KINDS, LabKind
from .pools import agent_pool
from ..agent.remote import obtain
from ..api.verbs import DeviceCaps
from ..machines.sshmachine import inventory_machines, unreachable
from ..protocol import Lab

DEFAULT_HOSTS = ("a", "b")
PROBE_DEADLINE_S = 30.0  # reaching every inventory host once at the session's start


@dataclasses.dataclass(frozen=True)
class LabSpec:
    """One column of the result table: a kind of lab and what it runs on: a model
    personality ("model", "ib"), a VM lab device ("vm", "rxe"), an inventory file
    ("inventory", "lab.toml")."""
    backend: str
    personality: str

    @property
    def kind(self) -> LabKind:
        return LAB_KINDS[self.backend]

    @property
    def id(self) -> str:
        return f"{self.backend}-{self.kind.label(self.personality)}"

    @property
    def option(self) -> str:
        return f"{self.backend}:{self.personality}"

    def build(self, seed: int, hosts=DEFAULT_HOSTS, **options) -> Lab:
        """A lab of this spec (a host given as {name: {...}} may override the model's
        xrc_tgt_lifetime or personality; labs of real devices refuse model-only options)."""
        if self.kind.pooled:
            return agent_pool(self).lab(seed, list(hosts), **options)
        return self.kind.build(self.personality, seed, hosts, **options)

    def caps(self) -> DeviceCaps:
        return _caps_of(self)


def _caps_of(spec: LabSpec) -> DeviceCaps:
    try:
        return _probe_caps(spec)
    except (pytest.UsageError, KeyboardInterrupt):
        raise
    except Exception as e:  # a lab that cannot start: say why, no INTERNALERROR trace
        raise pytest.UsageError(f"--lab {spec.option}: the lab cannot start: "
                                f"{type(e).__name__}: {e}") from e


@functools.lru_cache(maxsize=None)
def _probe_caps(spec: LabSpec) -> DeviceCaps:
    with spec.build(seed=1, hosts=("probe",)) as lab:
        return obtain(lab.host("probe").caps())


def parse_lab_options(texts) -> list[LabSpec]:
    """Every --lab given, in order, without repeats."""
    specs: list[LabSpec] = []
    for text in texts or [DEFAULT_LAB]:
        specs += [s for s in parse_lab_option(text) if s not in specs]
    return specs


def parse_lab_option(text: str) -> list[LabSpec]:
    """"model" -> every model personality; "model:ib,roce" -> those; "vm" = "vm:rxe";
    "vm:rxe,siw" -> the VM lab with each device; "netns:rxe" -> the netns lab;
    "inventory:PATH" -> the inventory's hosts. The text is checked by rdmalab.run.inputs (the
    one place labs are validated; a colon with nothing after it is refused); its BadInput is
    a pytest.UsageError, as is a kind that cannot run here. The inventory's content is checked
    by check_inventories."""
    try:
        name, names = inputs.lab_parts(text)
    except inputs.BadInput as e:
        raise pytest.UsageError(str(e)) from None
    kind = LAB_KINDS[name]
    why = kind.unavailable()
    if why:
        raise pytest.UsageError(f"--lab {text!r}: the {kind.title} cannot run here: {why}")
    return [LabSpec(name, n) for n in names]


def check_inventories(specs: list[LabSpec], deadline_s: float = PROBE_DEADLINE_S) -> None:
    """Before any scenario: each inventory read and checked (rdmalab.run.inputs), and each of its
    hosts reached once over ssh, all at once, within deadline_s. A malformed file, or hosts
    that cannot be reached (no route, refused, unknown or changed host key, login refused, no
    answer), is one pytest.UsageError naming the file, line and field, or each host and why;
    never an error per scenario. A pytest-xdist worker does not probe again."""
    for spec in specs:
        if not spec.kind.inventory_file:
            continue
        try:
            inv = inputs.inventory(spec.personality)
        except inputs.BadInput as e:
            raise pytest.UsageError(str(e)) from None
        if os.environ.get("PYTEST_XDIST_WORKER"):
            continue
        problems = unreachable(inventory_machines(inv), deadline_s)
        if problems:
            raise pytest.UsageError(
                f"--lab {spec.option}: {len(problems)} of the inventory's {len(inv.hosts)} "
                f"hosts cannot be reached over ssh (each tried once, {deadline_s:g} s "
                "deadline); fix them or take them out of the inventory:\n"
                + "\n".join(f"  {inv.path}:{m.entry.line}: host \"{m.name}\": {why}"
                            for m, why in problems))


def replay_command(item, spec: LabSpec, seed: int) -> str:
    return (f"python3 -m rdmalab run --lab {spec.option} --seed {seed} -k '{item.name}'"
            f"  (or: python3 -m pytest -p rdmalab.run.pytest_plugin '{item.nodeid}' "
            f"--lab {spec.option} --seed {seed})")
