"""The modules the guest loads (its initrd's insmod list): which ones, where each is in an
unpacked kernel, which are built in, and the order that loads dependencies first."""
from __future__ import annotations

import lzma
import pathlib
from typing import Callable, Iterable

from . import kernel
from .kernel import Kernel, KernelError

# Modules the guest loads: virtio devices, the 9p root, the overlay, the RDMA stack.
# crc32_generic (rxe ICRC) and crc32c_generic (siw) are reached through the crypto API,
# not symbols, so modinfo does not list them; without them "rdma link add" gets ENOENT.
BASE_MODULES = ("virtio_pci", "virtio_net", "9pnet_virtio", "9p", "overlay")
RDMA_MODULES = ("crc32_generic", "crc32c_generic", "rdma_rxe", "ib_uverbs", "rdma_ucm",
                "ib_umad")
# Gone where the providers call the crc32 library directly (rxe and siw since 6.15): loaded
# where the kernel has them.
OPTIONAL_MODULES = ("crc32_generic", "crc32c_generic")
# In-guest wire faults (rdmalab.faults.nft): nf_tables carries the payload, counter and cmp
# expressions and the inet family in Debian's build.
NFT_MODULES = ("nf_tables", "nft_meta_bridge")  # the bridge family's meta (l4proto, ...)
# The netns lab inside a guest (rdmalab.machines.netns): a veth pair per host into a bridge.
NETNS_MODULES = ("veth", "bridge")


def _norm(name: str) -> str:
    return name.replace("-", "_")


def module_index(moddir: pathlib.Path) -> dict[str, pathlib.Path]:
    """Module name -> .ko (or .ko.xz, Debian 13 on) path, read from the tree (the unpacked
    package has no modules.dep)."""
    return {_norm(p.name.split(".ko")[0]): p for p in moddir.rglob("*.ko*")
            if p.name.endswith((".ko", ".ko.xz"))}


def module_bytes(path: pathlib.Path) -> bytes:
    """A module's ELF image: busybox's insmod hands the file to init_module as it is, so a
    compressed module is unpacked here."""
    data = path.read_bytes()
    return lzma.decompress(data) if path.name.endswith(".xz") else data


def builtin_modules(moddir: pathlib.Path) -> set[str]:
    """Modules this kernel has built in (modules.builtin: kernel/.../name.ko per line)."""
    try:
        lines = (moddir / "modules.builtin").read_text().split()
    except FileNotFoundError:
        return set()
    return {_norm(pathlib.PurePath(l).name.split(".ko")[0]) for l in lines}


def module_depends(path: pathlib.Path) -> list[str]:
    out = kernel.run(["modinfo", "-F", "depends", str(path)]).strip()
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


def guest_modules(k: Kernel) -> list[tuple[str, pathlib.Path]]:
    """(name, path) for every module the guest loads, in load order (siw last, where built)."""
    index = module_index(k.moddir)
    extra: tuple[str, ...] = ()
    if k.siw_ko is not None:
        index["siw"] = k.siw_ko
        extra = ("siw",)

    builtin = builtin_modules(k.moddir)

    def depends(name: str) -> list[str]:
        if name not in index:
            raise KernelError(f"module {name} is not in {k.moddir}")
        return [d for d in module_depends(index[name]) if d not in builtin]

    wanted = [m for m in BASE_MODULES + RDMA_MODULES + NFT_MODULES + NETNS_MODULES + extra
              if m not in builtin and (m in index or m not in OPTIONAL_MODULES)]
    names = load_order(wanted, depends)
    return [(n, index[n]) for n in names]
