"""The guest initrd: busybox-static, the kernel modules, and init.sh as /init.

The archive is written here in the cpio "newc" format (no cpio tool, no root needed for the
/dev/console node) with fixed owners and times, so the same inputs give the same bytes. It is
an artifact of the shared cache (bindings/rdmalab/machines/vmlab/cache.py): initrd-<release>-<key>/initrd.gz, keyed
by the kernel, busybox, init.sh and every module it packs.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import pathlib

from . import cache, modules
from . import kernel as kmod

BUSYBOX = pathlib.Path("/bin/busybox")  # from busybox-static: no shared libraries
INIT_SH = pathlib.Path(__file__).with_name("init.sh")

S_IFDIR, S_IFREG, S_IFLNK, S_IFCHR = 0o040000, 0o100000, 0o120000, 0o020000
DIRS = ("bin", "dev", "proc", "sys", "host", "ovl", "newroot", "modules", "tmp")


class Cpio:
    """Writer for the newc format the kernel unpacks (include/linux/initramfs docs)."""

    def __init__(self) -> None:
        self._buf = io.BytesIO()
        self._ino = 1

    def _entry(self, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0),
               nlink: int = 1) -> None:
        fields = (self._ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rdev[0], rdev[1],
                  len(name) + 1, 0)
        self._ino += 1
        head = b"070701" + b"".join(b"%08X" % f for f in fields)
        self._buf.write(head + name.encode() + b"\0")
        self._pad()
        self._buf.write(data)
        self._pad()

    def _pad(self) -> None:
        self._buf.write(b"\0" * (-self._buf.tell() % 4))

    def dir(self, name: str) -> None:
        self._entry(name, S_IFDIR | 0o755, nlink=2)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self._entry(name, S_IFREG | mode, data)

    def symlink(self, name: str, target: str) -> None:
        self._entry(name, S_IFLNK | 0o777, target.encode())

    def chardev(self, name: str, major: int, minor: int) -> None:
        self._entry(name, S_IFCHR | 0o600, rdev=(major, minor))

    def finish(self) -> bytes:
        self._entry("TRAILER!!!", 0)
        return self._buf.getvalue()


def archive(modules: list[tuple[str, bytes]], busybox: bytes, init: bytes) -> bytes:
    """The uncompressed cpio; modules are (name, contents) in load order."""
    cp = Cpio()
    for d in DIRS:
        cp.dir(d)
    cp.chardev("dev/console", 5, 1)
    cp.file("bin/busybox", busybox, 0o755)
    cp.symlink("bin/sh", "busybox")
    cp.file("init", init, 0o755)
    for name, data in modules:
        cp.file(f"modules/{name}.ko", data)
    cp.file("modules/order", "".join(f"{n}\n" for n, _ in modules).encode())
    return cp.finish()


KEEP = 4  # initrds kept per kernel release: the last used (a clone may be older or newer)


def inputs(k: kmod.Kernel, modules: list[tuple[str, bytes]], busybox: bytes,
           init: bytes) -> dict:
    """What the initrd is made of: its key's input and its manifest's record."""
    def sha(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()
    return {"kernel": k.key, "busybox": sha(busybox), "init": sha(init),
            "modules": [[name, sha(data)] for name, data in modules]}


def ensure(k: kmod.Kernel) -> pathlib.Path:
    """Build (or reuse) the gzip'd initrd for kernel k; returns its path."""
    if not BUSYBOX.exists():
        raise kmod.KernelError(f"{BUSYBOX} missing: apt-get install busybox-static")
    mods = [(n, modules.module_bytes(p)) for n, p in modules.guest_modules(k)]
    busybox, init = BUSYBOX.read_bytes(), INIT_SH.read_bytes()

    def make(d: pathlib.Path) -> list[str]:
        with open(d / "initrd.gz", "wb") as raw, \
                gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
            gz.write(archive(mods, busybox, init))
        return ["initrd.gz"]

    with kmod.cache_lock():
        root = kmod.artifact("initrd", k.release, inputs(k, mods, busybox, init), make)
        (root / cache.DONE).touch()  # its last use, which _prune keeps by
        _prune(k.release)
    return root / "initrd.gz"


def _prune(release: str) -> None:
    """Keeps the KEEP initrds of release used last (one per init.sh or module change)."""
    made = [d for d in kmod.CACHE.glob(f"initrd-{release}-*") if (d / cache.DONE).is_file()]
    made.sort(key=lambda d: (d / cache.DONE).stat().st_mtime, reverse=True)
    for old in made[KEEP:]:
        cache.remove(old)
