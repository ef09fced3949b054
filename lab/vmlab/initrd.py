"""The guest initrd: busybox-static, the kernel modules, and init.sh as /init.

The archive is written here in the cpio "newc" format (no cpio tool, no root needed for the
/dev/console node) with fixed owners and times, so the same inputs give the same bytes and
the cached file is named by their hash.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import os
import pathlib
import shutil

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


def ensure(k: kmod.Kernel) -> pathlib.Path:
    """Build (or reuse) the gzip'd initrd for kernel k; returns its path."""
    if not BUSYBOX.exists():
        raise kmod.KernelError(f"{BUSYBOX} missing: apt-get install busybox-static")
    mods = [(n, kmod.module_bytes(p)) for n, p in kmod.guest_modules(k)]
    busybox, init = BUSYBOX.read_bytes(), INIT_SH.read_bytes()
    h = hashlib.sha256(busybox + init)
    for n, data in mods:
        h.update(n.encode() + hashlib.sha256(data).digest())
    out = kmod.CACHE / f"initrd-{k.release}-{h.hexdigest()[:12]}.gz"
    if out.exists():
        return out
    tmp = out.with_suffix(f".{os.getpid()}.tmp")  # then an atomic rename
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        gz.write(archive(mods, busybox, init))
    shutil.move(tmp, out)
    for old in kmod.CACHE.glob(f"initrd-{k.release}-*.gz"):  # built from an older init.sh
        if old != out:
            old.unlink(missing_ok=True)
    return out
