"""One home for what a user types or hands over: command-line values and input files are
checked here, before anything runs, by every command (run, swarm, replay, report, findings,
matrix) and by the pytest plugin. A refusal is a BadInput whose message names the option or the
file, the place in it and what is wrong; the commands print it as one line and exit with
EXIT_BAD_INPUT, never with a traceback.

Exit statuses, the same for every command (README "Exit statuses"):"""
from __future__ import annotations

import os
import re
import sys
import traceback
from pathlib import Path
from typing import Callable, Iterable, Optional

from ..findings.registry import FindingsError
from ..machines.inventory import InventoryError, load as load_inventory
from ..machines.inventory import is_secret_name as secret_rule
from ..machines.vmlab.debian import SUITES
from .labkinds import DEFAULT_LAB, LAB_KINDS, LabKind

EXIT_PASSED = 0      # every result passed (or the command did what was asked)
EXIT_FAILED = 1      # a result failed: a scenario, a checker, a divergence, a stale table
EXIT_BAD_INPUT = 2   # bad input: an option, a lab, a file; nothing ran

EXIT_HELP = """exit status: 0 passed; 1 a result failed; 2 bad input (an option, a lab or a file
was refused before anything ran; the message names it)."""
__doc__ += "\n\n" + EXIT_HELP


class BadInput(ValueError):
    """A value or file refused before anything ran: the message names it and what is wrong."""


# ---- labs ------------------------------------------------------------------------------------

def lab_parts(text: str, cwd: Optional[str] = None) -> tuple[str, list[str]]:
    """(kind, names): ("model", [personalities]) | ("vm"|"netns", [devices]) |
    ("inventory", [absolute path]); the kinds are rdmalab.run.labkinds'.

    A kind alone is its default names ("model": every personality; "vm", "netns": rxe). A colon
    with nothing after it is refused (it names nothing), as is an unknown kind, personality or
    device. An inventory path is taken relative to cwd (the caller's directory) and must be
    a file; its content is checked by inventory()."""
    if not isinstance(text, str) or not text.strip():
        raise BadInput(f"--lab {text!r}: name a lab: {', '.join(LAB_KINDS)}")
    name, colon, rest = text.partition(":")
    kind = LAB_KINDS.get(name)
    if kind is None:
        raise BadInput(f"--lab {text!r}: unknown lab {name!r}; available: "
                       + ", ".join(k.usage for k in LAB_KINDS.values()))
    if colon and not rest.strip():
        raise BadInput(f"--lab {text!r}: nothing after the colon; write {name} alone or "
                       f"{kind.example}")
    if kind.inventory_file:
        return name, [_inventory_path(text, kind, rest if colon else None, cwd)]
    names = [n.strip() for n in rest.split(",")] if colon else []
    if any(not n for n in names):
        raise BadInput(f"--lab {text!r}: an empty name in the list")
    known = list(kind.known())
    bad = [n for n in names if n not in known]
    if bad:
        raise BadInput(f"--lab {text!r}: "
                       + kind.unknown.format(bad=", ".join(bad), known=", ".join(known)))
    return name, names or list(kind.default or known)


def _inventory_path(text: str, kind: LabKind, rest: Optional[str], cwd: Optional[str]) -> str:
    if rest is None:
        raise BadInput(f"--lab {text!r}: give the {kind.title} file: {kind.usage}")
    given = os.path.expanduser(rest)
    path = Path(given) if os.path.isabs(given) else Path(cwd or os.getcwd(), given).resolve()
    if not path.is_file():
        raise BadInput(f"--lab {text!r}: no {kind.title} file {path}")
    return str(path)


def personalities() -> list[str]:
    """What --lab model:NAME takes: the model's personalities."""
    return LAB_KINDS["model"].known()


def lab(text: str, cwd: Optional[str] = None, *, read_inventory: bool = True) -> str:
    """The lab option made canonical (an inventory path absolute), its inventory read and
    checked; BadInput otherwise."""
    kind, names = lab_parts(text, cwd)
    if LAB_KINDS[kind].inventory_file:
        if read_inventory:
            inventory(names[0])
        return f"{kind}:{names[0]}"
    colon = text.partition(":")[1]
    return f"{kind}:{','.join(names)}" if colon else kind


def labs(texts: Optional[Iterable[str]], cwd: Optional[str] = None, *,
         default: str = DEFAULT_LAB) -> list[str]:
    out: list[str] = []
    for text in texts or [default]:
        canon = lab(text, cwd)
        if canon not in out:
            out.append(canon)
    return out


def inventory(path: str):
    """The inventory read and checked (rdmalab.machines.inventory); its InventoryError as BadInput. The
    message names the file, line and field, never a refused secret's value."""
    try:
        return load_inventory(path)
    except InventoryError as e:
        raise BadInput(str(e)) from None


# ---- numbers, names, files -------------------------------------------------------------------

def count(value, option: str, minimum: int = 1, maximum: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInput(f"{option} {value!r}: a whole number expected")
    if value < minimum or (maximum is not None and value > maximum):
        top = f" to {maximum}" if maximum is not None else " or more"
        raise BadInput(f"{option} {value}: must be {minimum}{top}")
    return value


def duration(value, option: str, unit: str = "minutes") -> float:
    """A positive, finite duration (0 would mean no deadline at all)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value \
            or value in (float("inf"), float("-inf")):
        raise BadInput(f"{option} {value!r}: a number of {unit} expected")
    if value <= 0:
        raise BadInput(f"{option} {value:g}: must be more than 0 {unit}")
    return float(value)


def mutations(names: Iterable[str], option: str = "--mutation") -> list[str]:
    """Planted defect names, each one the model knows (rdmalab.labs.engine.MUTATIONS)."""
    from ..labs.engine import MUTATIONS  # the engine: inputs imports without it (run.matrix)
    out = []
    for name in names or []:
        if name not in MUTATIONS:
            raise BadInput(f"{option} {name!r}: unknown mutation; known: "
                           f"{', '.join(sorted(MUTATIONS))}")
        if name not in out:
            out.append(name)
    return out


def kernel(spec: Optional[str], option: str = "--kernel") -> Optional[str]:
    """A Debian suite, or a release name such as 6.12.117+deb13-amd64 (bindings/rdmalab/machines/vmlab/kernel.py
    resolves it when the lab starts; here only its form is checked)."""
    if spec is None:
        return None
    if spec in SUITES or re.fullmatch(r"\d+\.\d+(\.\d+)?[-+][A-Za-z0-9.+~-]+", spec):
        return spec
    raise BadInput(f"{option} {spec!r}: a Debian suite ({', '.join(SUITES)}) or a kernel "
                   "release such as 6.12.117+deb13-amd64")


def schedule(path: str):
    """A schedule file read and checked (rdmalab.schedules); ScheduleError names the step and
    field."""
    from ..schedules import Schedule  # the engine: inputs imports without it (run.matrix)
    return Schedule.load(path)


def out_dir(value: str, option: str = "--out", cwd: Optional[str] = None) -> str:
    """An output folder: named, absolute against the caller's directory, not a file."""
    if not value or not value.strip():
        raise BadInput(f"{option} {value!r}: name a folder")
    path = Path(cwd or os.getcwd(), os.path.expanduser(value)).resolve()
    if path.exists() and not path.is_dir():
        raise BadInput(f"{option} {path}: not a directory")
    return str(path)


def host_port(value: Optional[str], option: str) -> Optional[str]:
    if value is None:
        return None
    host, colon, port = value.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadInput(f"{option} {value!r}: HOST:PORT expected (port 1-65535)")
    return value


# ---- secrets ---------------------------------------------------------------------------------

def is_secret_name(name: str) -> bool:
    """A field whose name says it holds a secret: its value is never shown. The rule's one
    home is rdmalab.machines.inventory (it needs no engine build there)."""
    return secret_rule(name)


# ---- running a command -----------------------------------------------------------------------

def refusals() -> tuple[type, ...]:
    """Every error type that means bad input: BadInput and the file parsers' own errors."""
    from ..schedules import ScheduleError  # the engine: inputs imports without it (run.matrix)
    return (BadInput, ScheduleError, FindingsError, InventoryError)


def guard(command: str, fn: Callable[[], int]) -> int:
    """Runs one command: bad input is one line on stderr and EXIT_BAD_INPUT; an interrupt is
    130; an error of the harness itself is named as one (with its traceback: a bug to report),
    never passed off as a result."""
    try:
        return fn()
    except refusals() as e:
        print(f"rdmalab {command}: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"rdmalab {command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_FAILED
    except Exception:  # noqa: BLE001 - a harness bug: say so, with its traceback
        print(f"rdmalab {command}: internal error (a bug in rdmalab, please report it):",
              file=sys.stderr)
        traceback.print_exc()
        return 3
