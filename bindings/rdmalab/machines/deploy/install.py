"""Installing the agent on a host: the controller's bundle copied to <agent_dir>/<version>/ when
the host has none, or another version; its own engine tried first, else one built there. A
version directory counts only once its READY file exists: a copy or a build that stopped
half-way is redone, never used."""
from __future__ import annotations

import dataclasses
import shlex
import time
from pathlib import Path

from ..machine import Machine
from .common import AGENT_DIR, DeployError, Log, ok, py
from .hostbuild import build_on_host
from .hostcode import FIT_CHECK, INSTALLED, PREPARE_FAILED, UNPACK_FAILED, fit_failure
from .shipment import bundle, tarball


@dataclasses.dataclass(frozen=True)
class Installed:
    path: str             # put this on sys.path: it holds rdmalab/
    version: str
    built_on_host: bool   # the engine was built there (the controller's did not fit)
    copied: bool = False  # this call installed it (False: it was there already)


def ensure_agent(machine: Machine, repo: Path, agent_dir: str = AGENT_DIR,
                 log: Log = print, loaded_before: str = "",
                 trust_installed: bool = False) -> Installed:
    """The controller's agent on the host, installed if missing: one round trip when the host
    has it already. loaded_before: a version whose copy (the controller's engine, not one built
    there) an agent already ran from on this host, e.g. before a reboot emptied its tmpfs: when
    it is this bundle's, a new copy is checked for its files only, not imported (seconds on a
    TCG guest); the agent's own start imports it (open_agent_channel says if that fails).
    trust_installed: an install already there (its READY says it loaded, or was built, when it
    was made) is found by its files, not imported: the caller starts the agent from it and,
    where that fails (the host's libraries changed since), calls again without trust."""
    b = bundle(repo)
    v = f"{agent_dir}/{b.version}"
    q = shlex.quote
    tmp = f"{v}.tmp"
    prepare = f"mkdir -p {q(agent_dir)} && rm -rf {q(tmp)} {q(v)} && mkdir {q(tmp)}"
    # One round trip either way (each is seconds to a TCG guest): the install is there and
    # loads, or the directory is made ready for a copy (after a guest's reboot its tmpfs has
    # nothing). A host build leaves build.log beside READY; a copy does not.
    t0 = time.monotonic()
    # An install of a version an agent ran from here already (a reboot that kept agent_dir) is
    # checked for its files, not imported: the agent's own start imports it.
    fits = (f"test -f {q(v)}/rdmalab/{q(Path(b.engine).name)}"
            if trust_installed or loaded_before == b.version else py(FIT_CHECK, v))
    probe = machine.run(f"if test -f {q(v)}/READY && {fits}; then "
                        f"{{ test -f {q(v)}/build.log && echo BUILT-ON-HOST; echo {INSTALLED}; }}"
                        f"; else {prepare} || exit {PREPARE_FAILED}; fi", timeout=60)
    if probe.rc == 0 and not probe.timed_out and INSTALLED in probe.out.split():
        return Installed(v, b.version, built_on_host="BUILT-ON-HOST" in probe.out, copied=False)
    if probe.timed_out or probe.rc != 0:  # a probe that hung, or the directory not made
        ok(machine, prepare, "prepare the agent directory")

    packed = tarball(b)
    try:
        machine.copy_to(str(packed), f"{tmp}/bundle.tar.gz", timeout=600)
    except Exception as e:
        raise DeployError(f"{machine.name}: copying the rdmalab agent to {tmp} failed: {e}") from e
    # Unpacked under .tmp and renamed whole; READY only once the engine loads (or, for a
    # version that loaded here before, once it is there).
    check = (f"test -f {q(v)}/rdmalab/{q(Path(b.engine).name)} || "
             f"{{ echo 'no engine {Path(b.engine).name} in the copy'; exit 3; }}"
             if loaded_before == b.version else py(FIT_CHECK, v))
    r = machine.run(f"{{ cd {q(tmp)} && tar -xzf bundle.tar.gz && rm bundle.tar.gz && "
                    f"mv {q(tmp)} {q(v)}; }} || exit {UNPACK_FAILED}; " + check
                    + f" && touch {q(v)}/READY", timeout=300)
    log(f"{machine.name}: rdmalab agent {b.version} copied to {v} "
        f"({packed.stat().st_size / 1e6:.1f} MB, {time.monotonic() - t0:.1f} s)")
    if r.rc == 0 and not r.timed_out:
        return Installed(v, b.version, built_on_host=False, copied=True)
    fit_failure(machine, r, v, after_build=False)
    why = (r.out or r.err).strip()
    log(f"{machine.name}: the controller's engine ({b.platform}) does not load there "
        f"({why}); building it on the host")
    build_on_host(machine, b, v, why, log)
    return Installed(v, b.version, built_on_host=True, copied=True)
