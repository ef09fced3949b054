"""The guests' module folder for modprobe (bindings/rdmalab/machines/vmlab/moddep.py): depmod's
indexes over the unpacked kernel's modules, and the kernel command line that mounts it.

The artifact test uses the 6.1 kernel the VM lab unpacked into its shared cache (it builds
its own moddep folder in a temporary cache: about 4 s); without that kernel it is skipped.
"""
from __future__ import annotations

import dataclasses
import pathlib
import shutil

import pytest

from rdmalab.machines.vmlab import cache, kernel, moddep
from rdmalab.machines.vmlab.vm import Vm, VmError, VmSpec

REAL_CACHE = kernel.CACHE  # before any test points kernel.CACHE elsewhere


def _cached_kernel_61() -> kernel.Kernel | None:
    for root in sorted(REAL_CACHE.glob("kernel-6.1.0-*-amd64-*")):
        if (root / cache.DONE).is_file():
            release, key = root.name.removeprefix("kernel-").rsplit("-", 1)
            return kernel.Kernel(release, root, None, key=key)
    return None


def _deps(moddir: pathlib.Path, module: str) -> list[str]:
    """modules.dep's dependencies of the module whose file is <module>.ko (names as files)."""
    for line in (moddir / "modules.dep").read_text().splitlines():
        path, _, deps = line.partition(":")
        if pathlib.PurePath(path).name.split(".ko")[0] == module:
            return [pathlib.PurePath(d).name.split(".ko")[0] for d in deps.split()]
    raise AssertionError(f"{module} not in {moddir / 'modules.dep'}")


@pytest.fixture
def k61(tmp_path, monkeypatch) -> kernel.Kernel:
    k = _cached_kernel_61()
    if k is None:
        pytest.skip(f"no unpacked 6.1 kernel in {REAL_CACHE} "
                    "(`python3 -m rdmalab.machines.vmlab prepare` makes it)")
    try:
        moddep._depmod()
    except kernel.KernelError as exc:
        pytest.skip(str(exc))
    monkeypatch.setattr(kernel, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(kernel, "say", lambda msg: None)
    return k


def test_modules_dep_names_nvme_rdmas_dependencies_and_reuse_runs_no_depmod(k61, tmp_path,
                                                                           monkeypatch):
    built = tmp_path / f"siw-{k61.release}-000000000000"  # an out-of-tree siw.ko's artifact
    built.mkdir()
    shutil.copy(next(k61.moddir.rglob("libcrc32c.ko*")), built / "siw.ko")  # any module
    k = dataclasses.replace(k61, siw_ko=built / "siw.ko")
    assert moddep.inputs(k)["siw"] == built.name and moddep.inputs(k61)["siw"] is None
    moddir = moddep.ensure(k)
    assert moddir.is_relative_to(kernel.CACHE)
    assert moddir.parts[-3:] == ("lib", "modules", k.release)  # what depmod -b wants
    assert {"nvme-fabrics", "nvme-core", "rdma_cm", "ib_core"} <= set(_deps(moddir, "nvme-rdma"))
    assert {"nvmet", "rdma_cm"} <= set(_deps(moddir, "nvmet-rdma"))
    assert "extra/siw.ko:" in (moddir / "modules.dep").read_text()
    assert (moddir / "modules.alias.bin").is_file() and not (moddir / "build").exists()
    src = next(k.moddir.rglob("nvme-rdma.ko*"))
    copy = moddir / src.relative_to(k.moddir)
    if src.stat().st_dev == copy.stat().st_dev:  # hard links: no space of their own
        assert copy.stat().st_ino == src.stat().st_ino
    assert cache.problem(moddir.parents[2]) is None
    ran: list[list[str]] = []
    monkeypatch.setattr(kernel, "run", lambda argv, **kw: ran.append(argv) or "")
    assert moddep.ensure(k) == moddir and ran == []


def test_the_guest_is_told_where_its_modules_are(tmp_path):
    def append(moddir: pathlib.Path | None) -> list[str]:
        argv = Vm(VmSpec(1), tmp_path, tmp_path / "sw.sock", tmp_path / "vmlinuz",
                  tmp_path / "initrd.gz", moddir=moddir).argv()
        return argv[argv.index("-append") + 1].split()

    folder = tmp_path / "moddep-x" / "lib" / "modules" / "6.1.0-56-amd64"
    assert f"vmlab.moddir={folder}" in append(folder)
    assert "vmlab.moddir=none" in append(None)
    with pytest.raises(VmError, match="cannot mount"):
        append(tmp_path / "with blank")
