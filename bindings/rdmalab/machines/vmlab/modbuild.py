"""Modules built out of tree for a guest kernel: siw.ko (Debian 12's kernel has rdma_rxe but no
siw, CONFIG_RDMA_SIW unset: built from linux-source against the unpacked headers) and
rdmalab_warn.ko (bindings/rdmalab/machines/vmlab/testmod, a test aid for the kernel-log
oracle). Each is an artifact keyed by its kernel and sources; a kernel of this machine's suite
is built for here, a newer suite's in a build chroot (buildroot.py)."""
from __future__ import annotations

import pathlib
import shutil
import subprocess
import tarfile
import time

from . import buildroot, cache, debian, kernel
from .kernel import STEP_TIMEOUT_S, Kernel, KernelError

SIW_FILES = ("siw_cm.o siw_cq.o siw_main.o siw_mem.o siw_qp.o siw_qp_tx.o siw_qp_rx.o "
             "siw_verbs.o")
SIW_KBUILD = f"obj-m += siw.o\nsiw-y := {SIW_FILES}\n"
TESTMOD_SRC = pathlib.Path(__file__).with_name("testmod")  # rdmalab_warn.c and its Kbuild
TESTMOD = "rdmalab_warn"


def siw_inputs(k: Kernel, memo: dict, lookup: bool) -> dict | None:
    """siw.ko's inputs: the kernel, linux-source's index record (kept in the kernel's memo
    once read: None when it is not and lookup is False, as siw.ko was never built here) and
    the Kbuild text."""
    source = memo.get("source")
    if not debian.valid_record(source):
        if not lookup:
            return None
        (source,) = debian.index_records([f"linux-source-{debian.major(k.release)}"],
                                         debian.apt_options(k.suite))
        memo["source"] = source
        cache.write_json(debian.memo_path(k.release), memo)
    return {"kernel": k.key, "source": source, "kbuild": SIW_KBUILD}


def build_siw(k: Kernel, inputs: dict) -> pathlib.Path:
    """siw.ko for k: CACHE/siw-<release>-<key of its inputs>."""
    def make(out: pathlib.Path) -> list[str]:
        (deb,) = debian.fetch([inputs["source"]], k.suite)
        _siw_sources(deb, out, debian.major(k.release))
        (out / "Kbuild").write_text(SIW_KBUILD)
        _make_modules("siw.ko", k, out)
        if not (out / "siw.ko").exists():
            raise KernelError(f"kbuild left no siw.ko in {out}")
        return ["siw.ko"]
    return kernel.artifact("siw", k.release, inputs, make) / "siw.ko"


def _siw_sources(deb: pathlib.Path, out: pathlib.Path, major: str) -> None:
    """drivers/infiniband/sw/siw/* of linux-source-<major>'s tree into out."""
    member = f"./usr/src/linux-source-{major}.tar.xz"
    prefix = f"linux-source-{major}/drivers/infiniband/sw/siw/"
    # Stream: the .deb holds a 140 MB tar.xz of the whole tree; only siw/ is kept.
    # dpkg-deb gets SIGPIPE when the loop stops early: expected, so its stderr is dropped.
    end = time.monotonic() + STEP_TIMEOUT_S
    kernel.say(f"extracting siw's sources from {deb.name} (about a minute, once per kernel)")
    with kernel.waiting(f"extracting siw's sources from {deb.name}", STEP_TIMEOUT_S), \
            subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL) as proc:
        assert proc.stdout is not None
        with tarfile.open(fileobj=proc.stdout, mode="r|") as outer:
            for entry in outer:
                if entry.name != member:
                    continue
                src = outer.extractfile(entry)
                assert src is not None
                with tarfile.open(fileobj=src, mode="r|xz") as inner:
                    for m in inner:
                        if time.monotonic() > end:
                            proc.kill()
                            raise KernelError(f"siw sources from {deb.name}: no result after "
                                              f"{STEP_TIMEOUT_S} s")
                        data = inner.extractfile(m) if m.name.startswith(prefix) else None
                        if data is not None and "/" not in m.name.removeprefix(prefix):
                            (out / m.name.removeprefix(prefix)).write_bytes(data.read())
                break
        proc.stdout.close()
        proc.wait(timeout=STEP_TIMEOUT_S)
    if not (out / "siw_main.c").exists():
        raise KernelError(f"{deb.name} has no {prefix}siw_main.c in {member}")


def _make_modules(what: str, k: Kernel, out: pathlib.Path) -> None:
    """make modules for the sources (and Kbuild) in out against k's headers."""
    if k.suite.split("-")[0] == "bookworm":
        # This machine's own suite: the kernel's compiler (gcc-12) and Debian's kbuild tools
        # (glibc 2.36) run here as they are.
        kernel.say(f"building {what} for {k.release}")
        headers = k.root / "usr" / "src" / f"linux-headers-{k.release}"
        kernel.run(["make", "-C", str(headers), f"M={out}", "modules", "-j2"],
                   what=f"building {what} for {k.release}")
    else:
        buildroot.build(what, k, out)


def testmod_inputs(k: Kernel) -> dict:
    sources = {f.name: cache.sha256(f) for f in sorted(TESTMOD_SRC.iterdir()) if f.is_file()}
    return {"kernel": k.key, "sources": sources}


def build_testmod(k: Kernel, inputs: dict) -> pathlib.Path:
    """rdmalab_warn.ko for k: CACHE/testmod-<release>-<key of its sources and the kernel>."""
    def make(out: pathlib.Path) -> list[str]:
        shutil.copytree(TESTMOD_SRC, out, dirs_exist_ok=True)
        _make_modules(f"{TESTMOD}.ko", k, out)
        if not (out / f"{TESTMOD}.ko").exists():
            raise KernelError(f"kbuild left no {TESTMOD}.ko in {out}")
        return [f"{TESTMOD}.ko"]
    return kernel.artifact("testmod", k.release, inputs, make) / f"{TESTMOD}.ko"
