"""The guest's /lib/modules/<release>: the kernel's module tree with depmod's indexes, so
that `modprobe nvme-rdma` in a guest loads it and its dependencies as on a real host.

The guest runs the host's userspace (init.sh chroots into an overlay of the host root), and
the host has no /lib/modules for the guest's release; init.sh bind-mounts this folder there
(vmlab.moddir, before any hide). It is an artifact of the shared cache (cache.py):
moddep-<release>-<key>/lib/modules/<release>/, keyed by the kernel and the out-of-tree siw.ko
it adds under extra/. The modules are hard links into the unpacked kernel (one filesystem: no
space of their own) rather than symlinks, which would not resolve in a guest that hides the
cache; the unpacked package has no modules.dep, so depmod -b makes the indexes here
(kmod 30 has no -o: its base must hold lib/modules/<release>).
"""
from __future__ import annotations

import os
import pathlib
import shutil

from . import kernel as kmod
from .kernel import Kernel, KernelError

# What depmod reads besides the modules (copied as links; modules.builtin* say which
# names need no file).
TREE = ("kernel", "modules.order", "modules.builtin", "modules.builtin.modinfo")
# What modprobe reads: hashed again on every reuse (modules.dep: for people and tests).
VERIFY = ("modules.dep", "modules.dep.bin", "modules.alias.bin", "modules.symbols.bin",
          "modules.builtin.bin")


def _extra_siw(k: Kernel) -> pathlib.Path | None:
    """siw.ko built out of tree for k, else None (none built, or Debian's own in the tree)."""
    if k.siw_ko is None or k.siw_ko.is_relative_to(k.moddir):
        return None
    return k.siw_ko


def inputs(k: Kernel) -> dict:
    siw = _extra_siw(k)
    return {"kernel": k.key, "release": k.release,
            "siw": None if siw is None else siw.parent.name}


def _link(src: str, dst: str) -> None:
    """A hard link; a copy where the cache spans filesystems (a kernel folder moved by hand)."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _depmod() -> str:
    for found in (shutil.which("depmod"), "/usr/sbin/depmod", "/sbin/depmod"):
        if found and os.access(found, os.X_OK):
            return found
    raise KernelError("depmod not found: apt-get install kmod")


def ensure(k: Kernel) -> pathlib.Path:
    """The modules folder for k's guests (made, or reused when it checks out)."""
    siw = _extra_siw(k)

    def make(tree: pathlib.Path) -> list[str]:
        out = tree / "lib" / "modules" / k.release
        out.mkdir(parents=True)
        for name in TREE:
            src = k.moddir / name
            if src.is_dir():
                shutil.copytree(src, out / name, symlinks=True, copy_function=_link)
            elif src.is_file():
                _link(str(src), str(out / name))
        if siw is not None:
            (out / "extra").mkdir()
            _link(str(siw), str(out / "extra" / siw.name))
        kmod.say(f"indexing the {k.release} modules for modprobe in the guests (depmod)")
        kmod.run([_depmod(), "-b", str(tree.resolve()), k.release],
                 what=f"depmod {k.release}")
        return [f"lib/modules/{k.release}/{v}" for v in VERIFY]

    with kmod.cache_lock():
        root = kmod.artifact("moddep", k.release, inputs(k), make)
    return root / "lib" / "modules" / k.release
