"""The guest kernel as the VM lab keeps it (Kernel), and what every step of its preparation
stands on: the two homes, how a long step runs, and the artifacts the steps make.

Nothing is installed into the host: Debian's packages are fetched and unpacked into the
artifact cache (CACHE, shared by every clone on the machine; cache.py), and what is built from
them lands there too. Each result is a folder named by a digest of what it was made from
(artifact_name) and checked against its manifest before reuse, so a second run, or a second
clone, only checks them. STATE is this clone's own. Long steps say what they do and how long
they have run (rdmalab.progress, stderr).

The preparation's rooms: debian (suites, apt's index, the .debs), prepare (ensure: the kernel
unpacked, siw.ko and the test module built), modbuild and buildroot (out-of-tree modules, in a
build chroot for a newer suite), modules (what the guest loads, in which order),
moddep (the guests' /lib/modules, for modprobe).

The other rooms read CACHE, STATE, say and run as kernel.<name>, never by importing the name:
one binding, which the tests replace.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import pathlib
import subprocess
import time
from typing import Callable, Iterable, Iterator

from ...paths import REPO
from ... import progress
from . import cache

CACHE = cache.artifact_home()   # downloads and built artifacts, shared by every clone
STATE = cache.state_home(REPO)  # this clone's run/, up/, ssh/ and inventories
# Part of every artifact's key: bump a kind's number when the way it is made changes, so that
# no clone reuses what the older code made.
RECIPES = {"kernel": 1, "siw": 1, "testmod": 1, "buildroot": 1, "initrd": 1, "moddep": 1}
STEP_TIMEOUT_S = 600  # deadline for any one download, unpack or build step


def say(msg: str) -> None:
    progress.say(f"vmlab: {msg}")


def waiting(what: str, deadline_s: float, started: float | None = None):
    """A progress.Waiting for one of the VM lab's long steps ("vmlab: <what>: 20 s, ...");
    started: when the step began (time.monotonic()), if before now."""
    return progress.Waiting(what, deadline_s, source="vmlab", started=started)


class KernelError(RuntimeError):
    """A step of the guest kernel's preparation failed: the message names the step."""


@dataclasses.dataclass(frozen=True)
class Kernel:
    release: str            # e.g. 6.1.0-56-amd64
    root: pathlib.Path      # dpkg -x of image + headers + kbuild
    siw_ko: pathlib.Path | None  # None: not built (only rxe asked for)

    suite: str = "bookworm"  # the Debian suite it came from
    testmod_ko: pathlib.Path | None = None  # rdmalab_warn.ko; None: not built for it
    key: str = ""  # the digest of its packages that names root: part of every later key

    @property
    def vmlinuz(self) -> pathlib.Path:  # Debian 12's layout, or 13's split packages'
        return _find(self.root, (f"boot/vmlinuz-{self.release}",
                                 f"usr/lib/modules/{self.release}/vmlinuz"), "vmlinuz")

    @property
    def moddir(self) -> pathlib.Path:
        return _find(self.root, (f"lib/modules/{self.release}",
                                 f"usr/lib/modules/{self.release}"), "the modules folder")

    @property
    def config(self) -> pathlib.Path:
        return _find(self.root, (f"boot/config-{self.release}",
                                 f"usr/lib/modules/{self.release}/config"), "the kernel config")


def _find(root: pathlib.Path, candidates: Iterable[str], what: str) -> pathlib.Path:
    for c in candidates:
        if (root / c).exists():
            return root / c
    raise KernelError(f"{what} not found under {root} (looked for {', '.join(candidates)})")


def run(argv: list[str], cwd: pathlib.Path | None = None, what: str = "") -> str:
    """argv with STEP_TIMEOUT_S; what: the step's name in progress lines (long steps)."""
    try:
        with waiting(what or " ".join(argv[:2]), STEP_TIMEOUT_S):
            res = subprocess.run(argv, cwd=cwd, capture_output=True, text=True,
                                 timeout=STEP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise KernelError(f"{argv[0]}: no result after {STEP_TIMEOUT_S} s") from exc
    if res.returncode != 0:
        raise KernelError(f"{' '.join(argv)} failed ({res.returncode}):\n{res.stderr[-2000:]}")
    return res.stdout


# ---- artifacts ---------------------------------------------------------------------------

def artifact_name(kind: str, label: str, inputs: object) -> str:
    """<kind>-<label>-<digest of the kind's recipe and inputs>, e.g. siw-6.1.0-56-amd64-<12>."""
    return f"{kind}-{label}-{cache.key(f'{kind}/{RECIPES[kind]}', inputs)}"


def artifact(kind: str, label: str, inputs: object,
             make: Callable[[pathlib.Path], list[str]]) -> pathlib.Path:
    """CACHE/artifact_name(...): reused when it matches its manifest, else made again from
    scratch by make (cache.build: it fills a fresh folder and returns the files to verify).
    The caller holds cache_lock()."""
    name = artifact_name(kind, label, inputs)
    root = CACHE / name
    if root.exists():
        why = cache.problem(root)
        if why is None:
            return root
        say(f"{root}: {why}: making it again from scratch")
    note_old_layout()
    return cache.build(CACHE, name, make, {"kind": f"{kind}/{RECIPES[kind]}", "inputs": inputs})


def complete(kind: str, label: str, inputs: object) -> bool:
    """Whether the artifact was made here before (checked when it is used)."""
    return (CACHE / artifact_name(kind, label, inputs) / cache.DONE).exists()


@contextlib.contextmanager
def cache_lock(deadline_s: float = 2 * STEP_TIMEOUT_S) -> Iterator[None]:
    """Serialises builders of the artifact cache (two sessions, or two clones, may prepare at
    once); whoever takes it first removes what a builder that died left half made."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as fh:
        end = time.monotonic() + deadline_s
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > end:
                    raise KernelError(f"{CACHE}/.lock still held after {deadline_s} s")
                time.sleep(0.5)
        try:
            cache.remove_leftovers(CACHE)
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


_OLD_LAYOUT = ("debs", "kernel-*", "siw-*", "testmod-*", "buildroot-*", "initrd-*")
_noted_old_layout = False


def note_old_layout() -> None:
    """Once per process, when something is fetched or built: a clone's own .cache/vmlab from
    before the shared cache may still hold the same, which nothing reads any more (ignored,
    never removed here)."""
    global _noted_old_layout
    if _noted_old_layout or STATE.resolve() == CACHE.resolve():
        return
    _noted_old_layout = True
    old = [p.name for pattern in _OLD_LAYOUT for p in sorted(STATE.glob(pattern))]
    if old:
        say(f"note: downloads and builds are cached in {CACHE} now, for every clone; "
            f"{', '.join(old)} in {STATE} are no longer used and may be removed")
