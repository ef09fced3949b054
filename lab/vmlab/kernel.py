"""The guest kernel: Debian's linux-image package unpacked into the cache, plus siw.ko.

Nothing is installed into the host: the packages are fetched with `apt-get download` and
unpacked with `dpkg -x` under .cache/vmlab. Debian 12's kernel has rdma_rxe but no siw
(CONFIG_RDMA_SIW unset), so siw.ko is built out of tree from linux-source against the
unpacked headers. Every step leaves a marker file, so a second run only checks them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import pathlib
import shutil
import subprocess
import tarfile
import time
from typing import Callable, Iterable, Iterator

REPO = pathlib.Path(__file__).resolve().parents[2]
CACHE = pathlib.Path(os.environ.get("VMLAB_CACHE", REPO / ".cache" / "vmlab"))

# Modules the guest loads: virtio devices, the 9p root, the overlay, the RDMA stack.
# crc32_generic (rxe ICRC) and crc32c_generic (siw) are reached through the crypto API,
# not symbols, so modinfo does not list them; without them "rdma link add" gets ENOENT.
BASE_MODULES = ("virtio_pci", "virtio_net", "9pnet_virtio", "9p", "overlay")
RDMA_MODULES = ("crc32_generic", "crc32c_generic", "rdma_rxe", "ib_uverbs", "rdma_ucm",
                "ib_umad")
# In-guest wire faults (rdmalab.nft): nf_tables carries the payload, counter and cmp
# expressions and the inet family in Debian's build.
NFT_MODULES = ("nf_tables",)
SIW_FILES = ("siw_cm.o siw_cq.o siw_main.o siw_mem.o siw_qp.o siw_qp_tx.o siw_qp_rx.o "
             "siw_verbs.o")

STEP_TIMEOUT_S = 600  # deadline for any one download, unpack or build step


class KernelError(RuntimeError):
    pass


@dataclasses.dataclass(frozen=True)
class Kernel:
    release: str            # e.g. 6.1.0-56-amd64
    root: pathlib.Path      # dpkg -x of image + headers + kbuild
    siw_ko: pathlib.Path

    @property
    def vmlinuz(self) -> pathlib.Path:
        return self.root / "boot" / f"vmlinuz-{self.release}"

    @property
    def moddir(self) -> pathlib.Path:
        return self.root / "lib" / "modules" / self.release


def _run(argv: list[str], cwd: pathlib.Path | None = None) -> str:
    try:
        res = subprocess.run(argv, cwd=cwd, capture_output=True, text=True,
                             timeout=STEP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise KernelError(f"{argv[0]}: no result after {STEP_TIMEOUT_S} s") from exc
    if res.returncode != 0:
        raise KernelError(f"{' '.join(argv)} failed ({res.returncode}):\n{res.stderr[-2000:]}")
    return res.stdout


def current_release() -> str:
    """The release the meta package linux-image-amd64 names, or the one already cached."""
    env = os.environ.get("VMLAB_KERNEL")
    if env:
        return env
    cached = sorted(CACHE.glob("kernel-*/.done"))
    if cached:
        return cached[-1].parent.name.removeprefix("kernel-")
    out = _run(["apt-cache", "depends", "linux-image-amd64"])
    for line in out.splitlines():
        word = line.split(":")[-1].strip()
        if line.strip().startswith("Depends:") and word.startswith("linux-image-"):
            return word.removeprefix("linux-image-")
    raise KernelError("apt-cache depends linux-image-amd64 names no linux-image-<release>")


def _download(packages: Iterable[str], into: pathlib.Path) -> list[pathlib.Path]:
    into.mkdir(parents=True, exist_ok=True)
    debs = []
    for pkg in packages:
        found = sorted(into.glob(f"{pkg}_*.deb"))
        if not found:
            _run(["apt-get", "download", "-q", pkg], cwd=into)
            found = sorted(into.glob(f"{pkg}_*.deb"))
        if not found:
            raise KernelError(f"apt-get download {pkg} left no .deb in {into}")
        debs.append(found[-1])
    return debs


def _unpack_kernel(release: str) -> pathlib.Path:
    root = CACHE / f"kernel-{release}"
    if (root / ".done").exists():
        return root
    flavour = release.split("-")[-1]
    abi = release.removesuffix(f"-{flavour}")
    major = ".".join(abi.split(".")[:2])
    debs = _download([f"linux-image-{release}", f"linux-headers-{release}",
                      f"linux-headers-{abi}-common", f"linux-kbuild-{major}"], CACHE / "debs")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for deb in debs:
        _run(["dpkg", "-x", str(deb), str(root)])
    # The flavour's Makefile includes the common one by its absolute /usr/src path.
    headers = root / "usr" / "src" / f"linux-headers-{release}"
    common = root / "usr" / "src" / f"linux-headers-{abi}-common" / "Makefile"
    (headers / "Makefile").write_text(f"include {common}\n")
    (root / ".done").write_text(release + "\n")
    return root


def _build_siw(release: str, root: pathlib.Path) -> pathlib.Path:
    out = CACHE / f"siw-{release}"
    ko = out / "siw.ko"
    if (out / ".done").exists() and ko.exists():
        return ko
    major = ".".join(release.split(".")[:2])
    (deb,) = _download([f"linux-source-{major}"], CACHE / "debs")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    member = f"./usr/src/linux-source-{major}.tar.xz"
    prefix = f"linux-source-{major}/drivers/infiniband/sw/siw/"
    # Stream: the .deb holds a 140 MB tar.xz of the whole tree; only siw/ is kept.
    # dpkg-deb gets SIGPIPE when the loop stops early: expected, so its stderr is dropped.
    with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE,
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
                        data = inner.extractfile(m) if m.name.startswith(prefix) else None
                        if data is not None and "/" not in m.name.removeprefix(prefix):
                            (out / m.name.removeprefix(prefix)).write_bytes(data.read())
                break
        proc.stdout.close()
        proc.wait(timeout=STEP_TIMEOUT_S)
    (out / "Kbuild").write_text(f"obj-m += siw.o\nsiw-y := {SIW_FILES}\n")
    headers = root / "usr" / "src" / f"linux-headers-{release}"
    _run(["make", "-C", str(headers), f"M={out}", "modules", "-j2"])
    if not ko.exists():
        raise KernelError(f"kbuild left no {ko}")
    (out / ".done").write_text(release + "\n")
    return ko


@contextlib.contextmanager
def cache_lock(deadline_s: float = 2 * STEP_TIMEOUT_S) -> Iterator[None]:
    """Serialises builders of the cache (two sessions may prepare at once)."""
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
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure(release: str | None = None) -> Kernel:
    """Fetch, unpack and build what the guest needs; reuses the cache when it is complete."""
    with cache_lock():
        release = release or current_release()
        root = _unpack_kernel(release)
        return Kernel(release=release, root=root, siw_ko=_build_siw(release, root))


# ---- module dependencies -------------------------------------------------------------

def _norm(name: str) -> str:
    return name.replace("-", "_")


def module_index(moddir: pathlib.Path) -> dict[str, pathlib.Path]:
    """Module name -> .ko path, read from the tree (the unpacked package has no modules.dep)."""
    return {_norm(p.name.removesuffix(".ko")): p for p in moddir.rglob("*.ko")}


def module_depends(path: pathlib.Path) -> list[str]:
    out = _run(["modinfo", "-F", "depends", str(path)]).strip()
    return [_norm(d) for d in out.split(",") if d]


def load_order(wanted: Iterable[str], depends: Callable[[str], list[str]]) -> list[str]:
    """Dependencies first, each module once, in a stable order; raises on a cycle."""
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "busy":
            raise KernelError("module dependency cycle: " + " -> ".join(chain + (name,)))
        state[name] = "busy"
        for dep in depends(name):
            visit(dep, chain + (name,))
        state[name] = "done"
        order.append(name)

    for name in wanted:
        visit(_norm(name), ())
    return order


def guest_modules(kernel: Kernel) -> list[tuple[str, pathlib.Path]]:
    """(name, path) for every module the guest loads, in load order (siw last)."""
    index = module_index(kernel.moddir)
    index["siw"] = kernel.siw_ko

    def depends(name: str) -> list[str]:
        if name not in index:
            raise KernelError(f"module {name} is not in {kernel.moddir}")
        return module_depends(index[name])

    names = load_order(BASE_MODULES + RDMA_MODULES + NFT_MODULES + ("siw",), depends)
    return [(n, index[n]) for n in names]
