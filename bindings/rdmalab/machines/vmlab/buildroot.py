"""The build chroot for a newer suite's kernel modules.

A newer suite's kernel (trixie's 6.12, sid's 7.x) was built with that suite's compiler
(gcc-14, gcc-16), and Debian's kbuild host tools for it (modpost, objtool, resolve_btfids) are
linked against that suite's glibc (2.38 on; bookworm has 2.36). Its modules are built in a
minimal chroot of the kernel's own suite, made once per suite and package list by debootstrap
from Debian's archive (an artifact like the others, keyed by that list), with each kernel's
headers and kbuild unpacked into it (their own manifest): the compiler the headers depend on,
Debian's modpost and objtool, and pahole run there on their own glibc. Every command runs in
new mount and pid namespaces (unshare) with a /proc of its own, which debootstrap and 7.x's
objtool (it reads /proc/self/maps) need: no mount can outlive the command or show outside it,
and a command past its deadline is killed with all it started.
"""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

from . import cache, debian, kernel
from .kernel import STEP_TIMEOUT_S, Kernel, KernelError

DEBOOTSTRAP_TIMEOUT_S = 2 * STEP_TIMEOUT_S  # once per suite: about 30 s and 500 MB here
BUILDROOT_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LC_ALL": "C"}
DEBOOTSTRAP_SCRIPTS = pathlib.Path("/usr/share/debootstrap/scripts")


def _isolated(argv: list[str], chroot: pathlib.Path | None = None) -> list[str]:
    """argv in private mount and pid namespaces with a fresh /proc; chrooted into chroot
    (whose /proc gets it) when given."""
    pre = ["unshare", "--mount", "--propagation", "private", "--pid", "--kill-child",
           "--mount-proc"]
    if chroot is not None:
        pre += [f"--root={chroot}", "--wd=/"]
    return pre + argv


def _step(step: str, argv: list[str], timeout: float,
          log: pathlib.Path | None = None) -> str:
    """Runs one step of a module build with a deadline and a clean environment; a failure is
    a KernelError naming the step, with the tail of its output (and of log, if given)."""
    def tail(out: str | bytes | None, err: str | bytes | None) -> str:
        text = "".join(s.decode(errors="replace") if isinstance(s, bytes) else (s or "")
                       for s in (out, err))
        if log is not None and log.exists():
            text += f"\n--- {log}:\n" + log.read_text(errors="replace")[-2000:]
        return text[-3000:]
    try:
        with kernel.waiting(step, timeout):
            res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                 env=BUILDROOT_ENV, check=False)
    except subprocess.TimeoutExpired as exc:
        raise KernelError(f"module build, {step}: no result after {timeout:.0f} s "
                          f"({' '.join(argv)}):\n{tail(exc.stdout, exc.stderr)}") from exc
    except OSError as exc:
        raise KernelError(f"module build, {step}: cannot run {argv[0]}: {exc}") from exc
    if res.returncode != 0:
        raise KernelError(f"module build, {step} failed ({res.returncode}): {' '.join(argv)}\n"
                          f"{tail(res.stdout, res.stderr)}")
    return res.stdout


def _chroot(suite: str, packages: list[str]) -> pathlib.Path:
    """CACHE/buildroot-<suite>-<key of packages>: debootstrap --variant=minbase of suite with
    packages (a kernel whose headers want another gcc gets a chroot of its own)."""
    inputs = {"suite": suite, "packages": sorted(packages)}
    final = kernel.CACHE / kernel.artifact_name("buildroot", suite, inputs)
    mounted = [p for p in (final / "proc", final / "sys", final / "dev", final / "dev" / "pts")
               if p.is_mount()]
    if mounted:  # never: every mount is made in a namespace of its own (rmtree would empty it)
        raise KernelError(f"module build for {suite}: {', '.join(map(str, mounted))} mounted; "
                          f"unmount and remove {final}")

    def make(d: pathlib.Path) -> list[str]:
        if shutil.which("debootstrap") is None:
            raise KernelError(f"module build for {suite}: debootstrap is not installed on this "
                              "machine (apt-get install debootstrap)")
        # debootstrap 1.0.128 (bookworm) knows suites up to trixie by name; newer: sid's.
        script = [] if (DEBOOTSTRAP_SCRIPTS / suite).exists() else \
            [str(DEBOOTSTRAP_SCRIPTS / "sid")]
        kernel.say(f"making the {suite} build chroot with debootstrap ({final}; about a "
                   "minute and 500 MB, once per suite)")
        _step(f"debootstrap {suite}", _isolated(
            ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite,
             str(d), debian.MIRROR, *script]), DEBOOTSTRAP_TIMEOUT_S,
            log=d / "debootstrap" / "debootstrap.log")
        for deb in (d / "var" / "cache" / "apt" / "archives").glob("*.deb"):
            deb.unlink()  # about 100 MB the build never reads
        return []  # nothing the lab reads itself: every size is checked

    return kernel.artifact("buildroot", suite, inputs, make)


def _headers(d: pathlib.Path, k: Kernel, records: list[dict]) -> None:
    """k's headers and kbuild unpacked into the chroot d, once per kernel key: staged first,
    so that their manifest (kept in d/.headers-<release>-<key>.json) lists just their files,
    which are then moved into place and checked like an artifact on every later use."""
    mark = d / f".headers-{k.release}-{k.key}.json"
    m = cache.read_json(mark)
    if m is not None:
        why = cache.problem(d, m)
        if why is None:
            return
        kernel.say(f"{d}: the {k.release} headers: {why}: unpacking them again")
    stage = d / ".headers-stage"
    cache.remove(stage)
    for deb in debian.fetch(records, k.suite):
        _step(f"unpack {deb.name}", ["dpkg", "-x", str(deb), str(stage)], STEP_TIMEOUT_S)
    m = cache.manifest(stage, [], {"kernel": k.key, "packages": records})
    for rel in [*m["files"], *m["links"]]:
        dst = d / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.is_symlink() or dst.is_file():
            dst.unlink()
        os.rename(stage / rel, dst)
    cache.remove(stage)
    cache.write_json(mark, m)


def build(what: str, k: Kernel, out: pathlib.Path) -> None:
    """make modules for the sources in out (siw's, the test module's), in the build chroot of
    k's suite, against linux-headers-<release> unpacked there; the results are copied back."""
    opts = debian.apt_options(k.suite)
    deps = debian.depends(f"linux-headers-{k.release}", opts)
    cc = [p for p in deps if re.fullmatch(r"gcc-[0-9]+(-for-host)?", p)]
    kbuild = [p for p in deps if p.startswith("linux-kbuild-")]
    common = [p for p in deps if p.startswith("linux-headers-")]
    if not cc or not kbuild:
        raise KernelError(f"module build: linux-headers-{k.release} of {k.suite} names no gcc-N "
                          f"or linux-kbuild-* among its Depends ({', '.join(deps)})")
    packages = list(dict.fromkeys([cc[0], "make", "libc6-dev",
                                   *debian.depends(kbuild[0], opts)]))
    d = _chroot(k.suite, packages)
    _headers(d, k, debian.records_named([f"linux-headers-{k.release}", *common, kbuild[0]],
                                        k.release, k.suite))
    scratch = d / "build" / out.name
    cache.remove(scratch)
    shutil.copytree(out, scratch)
    kernel.say(f"building {what} for {k.release} in the {k.suite} chroot (about 30 s the "
               "first time)")
    try:
        _step(f"building {what} for {k.release} in {d.name}", _isolated(
            ["make", "-C", f"/usr/src/linux-headers-{k.release}", f"M=/build/{out.name}",
             "modules", "-j2"], chroot=d), STEP_TIMEOUT_S)
        shutil.copytree(scratch, out, dirs_exist_ok=True)
    finally:
        cache.remove(scratch)  # scratch: the chroot keeps only what its manifests list
