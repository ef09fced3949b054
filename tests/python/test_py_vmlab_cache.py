"""The VM lab's artifact cache (bindings/rdmalab/machines/vmlab/cache.py, kernel.py, initrd.py): where it lives,
what names an artifact, and that nothing cut short, changed or stale is used again.

Debian is faked: kernel.run answers apt-cache, apt-get download, dpkg -x, modinfo and make
from the tables below, so these tests fetch and build nothing and take about a second.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

from rdmalab.machines.vmlab import (buildroot, cache, initrd, kernel, modbuild, modules, prepare,
                                     ssh, up)
from rdmalab.machines.vmlab import debian as debian_mod  # `debian` is the fixture below

REL = "6.1.0-99-amd64"
VERSION = "6.1.999-1"
COMMON = "linux-headers-6.1.0-99-common"
MODULES = sorted(set(modules.BASE_MODULES + modules.RDMA_MODULES + modules.NFT_MODULES
                     + modules.NETNS_MODULES))


def _tree(pkg: str) -> dict[str, bytes | str]:
    """What dpkg -x of the fake pkg writes: bytes a file, str a symlink's target."""
    if pkg == f"linux-image-{REL}":
        files: dict[str, bytes | str] = {
            f"boot/vmlinuz-{REL}": b"VMLINUZ" * 4096,
            f"boot/config-{REL}": b"CONFIG_RDMA_RXE=m\n",
            f"lib/modules/{REL}/modules.builtin": b"kernel/lib/crc32.ko\n"}
        for m in MODULES:
            files[f"lib/modules/{REL}/kernel/{m}.ko"] = b"\x7fELF " + m.encode() * 64
        return files
    if pkg == f"linux-headers-{REL}":
        return {f"usr/src/linux-headers-{REL}/Makefile":
                f"include /usr/src/{COMMON}/Makefile\n".encode(),
                f"lib/modules/{REL}/build": f"/usr/src/linux-headers-{REL}"}
    if pkg == COMMON:
        return {f"usr/src/{COMMON}/Makefile": b"# the common part\n" * 8}
    if pkg == "linux-kbuild-6.1":
        return {"usr/lib/linux-kbuild-6.1/scripts/mod/modpost": b"\x7fELF modpost" * 32}
    return {"usr/src/linux-source-6.1.tar.xz": b"the whole tree" * 64}


class FakeDebian:
    """apt's index and archive, dpkg, modinfo and kbuild for the kernel REL."""

    def __init__(self) -> None:
        self.versions = {p: VERSION for p in (f"linux-image-{REL}", f"linux-headers-{REL}",
                                              COMMON, "linux-kbuild-6.1", "linux-source-6.1")}
        self.depends = {"linux-image-amd64": [f"linux-image-{REL}"],
                        f"linux-image-{REL}": ["kmod", "linux-base"],
                        f"linux-headers-{REL}": [COMMON, "linux-kbuild-6.1", "gcc-12"],
                        COMMON: [], "linux-kbuild-6.1": []}
        self.calls: list[list[str]] = []

    def deb(self, pkg: str) -> bytes:
        head = json.dumps({"package": pkg, "version": self.versions[pkg]}).encode()
        return head + b"\n" + b"\0" * 4000  # big enough to cut short

    def arch(self, pkg: str) -> str:
        return "all" if pkg in (COMMON, "linux-source-6.1") else "amd64"

    def run(self, argv: list[str], cwd: pathlib.Path | None = None, what: str = "") -> str:
        self.calls.append(argv)
        tool, args = argv[0], [a for a in argv[1:] if not a.startswith("-")]
        if tool == "apt-cache" and args[0] == "depends":
            return f"{args[1]}\n" + "".join(f"  Depends: {d}\n" for d in self.depends[args[1]])
        if tool == "apt-cache" and args[0] == "show":
            return "\n".join(self.stanza(p) for p in args[1:])
        if tool == "apt-get" and args[0] == "download":
            pkg, version = args[1].split("=")
            assert cwd is not None and version == self.versions[pkg]
            (cwd / f"{pkg}_{version}_{self.arch(pkg)}.deb").write_bytes(self.deb(pkg))
            return ""
        if tool == "dpkg" and argv[1] == "-x":
            self.unpack(pathlib.Path(argv[2]), pathlib.Path(argv[3]))
            return ""
        if tool == "modinfo":
            return "\n"  # no dependencies between the fake modules
        if tool == "make":
            out = pathlib.Path(argv[3].removeprefix("M="))
            name = "siw" if "siw.o" in (out / "Kbuild").read_text() else modbuild.TESTMOD
            (out / f"{name}.ko").write_bytes(b"\x7fELF " + name.encode() * 512)
            return ""
        raise AssertionError(f"unexpected command {argv}")

    def stanza(self, pkg: str) -> str:
        sha = hashlib.sha256(self.deb(pkg)).hexdigest()
        return (f"Package: {pkg}\nVersion: {self.versions[pkg]}\nArchitecture: "
                f"{self.arch(pkg)}\nDescription: fake\n SHA256: not this one\nSHA256: {sha}\n")

    def unpack(self, deb: pathlib.Path, dest: pathlib.Path) -> None:
        pkg = json.loads(deb.read_bytes().split(b"\n")[0])["package"]
        for rel, data in _tree(pkg).items():
            path = dest / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(data, str):
                path.unlink(missing_ok=True)
                path.symlink_to(data)
            else:
                path.write_bytes(data)

    def siw_sources(self, deb: pathlib.Path, out: pathlib.Path, major: str) -> None:
        assert json.loads(deb.read_bytes().split(b"\n")[0])["package"] == f"linux-source-{major}"
        (out / "siw_main.c").write_text("/* siw */\n")

    def count(self, tool: str, sub: str = "") -> int:
        return sum(1 for c in self.calls if c[0] == tool and (not sub or sub in c))


@pytest.fixture
def debian(tmp_path, monkeypatch) -> FakeDebian:
    fake = FakeDebian()
    monkeypatch.setattr(kernel, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(kernel, "STATE", tmp_path / "clone" / ".cache" / "vmlab")
    monkeypatch.setattr(kernel, "_noted_old_layout", False)
    monkeypatch.setattr(kernel, "run", fake.run)
    monkeypatch.setattr(modbuild, "_siw_sources", fake.siw_sources)
    fake.said = []  # type: ignore[attr-defined]
    monkeypatch.setattr(kernel, "say", fake.said.append)  # type: ignore[attr-defined]
    testmod = tmp_path / "testmod"
    testmod.mkdir()
    for f in modbuild.TESTMOD_SRC.iterdir():
        (testmod / f.name).write_bytes(f.read_bytes())
    monkeypatch.setattr(modbuild, "TESTMOD_SRC", testmod)
    return fake


def _prepare(siw: bool = True) -> kernel.Kernel:
    return prepare.ensure("bookworm", siw=siw, testmod=True)


def _cut(path: pathlib.Path, keep: int = 100) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def _flip(path: pathlib.Path, at: int = 10) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


# ---- where -----------------------------------------------------------------------------

def test_default_homes_honour_xdg_cache_home_and_vmlab_cache(tmp_path):
    repo, home, xdg, own = (tmp_path / n for n in ("clone", "home", "xdg", "own"))
    assert cache.artifact_home({"HOME": str(home)}) == home / ".cache" / "rdmalab" / "vmlab"
    assert cache.artifact_home({"HOME": str(home), "XDG_CACHE_HOME": str(xdg)}) == \
        xdg / "rdmalab" / "vmlab"
    assert cache.artifact_home({"HOME": str(home), "XDG_CACHE_HOME": "rel"}) == \
        home / ".cache" / "rdmalab" / "vmlab"  # XDG: a relative value is ignored
    assert cache.state_home(repo, {"XDG_CACHE_HOME": str(xdg)}) == repo / ".cache" / "vmlab"
    both = {"HOME": str(home), "XDG_CACHE_HOME": str(xdg), "VMLAB_CACHE": str(own)}
    assert cache.artifact_home(both) == cache.state_home(repo, both) == own
    # The module's own homes, as a fresh process computes them from its environment.
    code = "from rdmalab.machines.vmlab import kernel; print(kernel.CACHE); print(kernel.STATE)"
    env = {k: v for k, v in os.environ.items() if k != "VMLAB_CACHE"}
    for extra, want in (({"XDG_CACHE_HOME": str(tmp_path)}, tmp_path / "rdmalab" / "vmlab"),
                        ({"VMLAB_CACHE": str(tmp_path / "v")}, tmp_path / "v")):
        r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, text=True, timeout=60,
                           capture_output=True, env=dict(env, PYTHONPATH=str(ROOT / "bindings"), **extra))
        assert r.returncode == 0, r.stderr
        got_cache, got_state = r.stdout.split()
        assert pathlib.Path(got_cache) == want
        assert pathlib.Path(got_state) == (want if "VMLAB_CACHE" in extra
                                           else ROOT / ".cache" / "vmlab")


def test_run_state_stays_with_the_clone_and_guests_see_neither_home(debian, tmp_path):
    assert ssh.key_dir() == kernel.STATE / "ssh"
    hidden = up.default_hide()
    assert kernel.CACHE.resolve() in hidden and kernel.STATE.resolve() in hidden
    inventory = kernel.STATE / "inventory-rxe.toml"  # make's default, in a fresh clone
    assert not kernel.STATE.exists()
    up.inventory_folder(inventory)
    assert kernel.STATE.is_dir()
    with pytest.raises(up.UpError, match="not a directory"):
        up.inventory_folder(tmp_path / "nowhere" / "inv.toml")


# ---- reuse -----------------------------------------------------------------------------

def test_a_second_prepare_and_a_second_clone_reuse_everything(debian, monkeypatch, tmp_path):
    k = _prepare()
    assert debian.count("apt-get") == 5 and debian.count("dpkg") == 4
    assert debian.count("make") == 2
    for path, kind in ((k.root, "kernel"), (k.siw_ko.parent, "siw"),
                       (k.testmod_ko.parent, "testmod")):
        assert path.parent == kernel.CACHE
        assert path.name.startswith(f"{kind}-{REL}-") and len(path.name.rsplit("-", 1)[1]) == 12
        assert not cache.problem(path)
    debian.calls.clear()
    monkeypatch.setattr(kernel, "STATE", tmp_path / "clone2" / ".cache" / "vmlab")
    again = _prepare()
    assert again == k and debian.calls == []  # not even apt's index is read again
    assert not kernel.STATE.exists()  # preparing writes nothing into the clone
    assert debian_mod.resolve(REL) == (REL, "bookworm") and debian.calls == []


def test_a_build_that_fails_leaves_nothing_and_a_dead_builders_leftovers_go(debian):
    def broken(d: pathlib.Path) -> list[str]:
        (d / "half").write_text("x")
        raise kernel.KernelError("compiler crashed")

    with kernel.cache_lock(), pytest.raises(kernel.KernelError, match="crashed"):
        kernel.artifact("testmod", REL, {"x": 1}, broken)
    assert sorted(p.name for p in kernel.CACHE.iterdir()) == [".lock"]
    (kernel.CACHE / f"{cache.TMP}siw-{REL}-abc-99999").mkdir()  # its builder was killed
    with kernel.cache_lock():
        assert sorted(p.name for p in kernel.CACHE.iterdir()) == [".lock"]


def test_concurrent_builders_build_once(debian):
    made, results = [], []

    def make(d: pathlib.Path) -> list[str]:
        made.append(d)
        time.sleep(0.3)  # long enough for the other builder to be waiting
        (d / "x.ko").write_bytes(b"module")
        return ["x.ko"]

    def builder() -> None:
        with kernel.cache_lock():
            results.append(kernel.artifact("testmod", REL, {"x": 1}, make))

    threads = [threading.Thread(target=builder) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(made) == 1 and len(results) == 2 and results[0] == results[1]
    assert (results[0] / "x.ko").read_bytes() == b"module"


# ---- verification ----------------------------------------------------------------------

def test_a_truncated_vmlinuz_is_noticed_and_the_kernel_unpacked_again(debian):
    k = _prepare()
    size = k.vmlinuz.stat().st_size
    _cut(k.vmlinuz)
    debian.calls.clear()
    assert _prepare().root == k.root
    assert k.vmlinuz.stat().st_size == size and not cache.problem(k.root)
    assert debian.count("dpkg") == 4 and debian.count("apt-get") == 0  # the .debs were fine
    assert debian.count("make") == 0  # siw.ko and the test module were not touched
    assert any("vmlinuz" in s and "from scratch" in s for s in debian.said)


def test_a_changed_byte_in_a_module_the_guest_loads_is_noticed(debian):
    k = _prepare()
    rxe = k.moddir / "kernel" / "rdma_rxe.ko"
    _flip(rxe)  # same size: only its sha256 tells
    debian.calls.clear()
    _prepare()
    assert debian.count("dpkg") == 4
    assert rxe.read_bytes() == _tree(f"linux-image-{REL}")[f"lib/modules/{REL}/kernel/rdma_rxe.ko"]
    assert any("rdma_rxe.ko does not match its sha256" in s for s in debian.said)


def test_a_truncated_siw_ko_is_rebuilt_alone(debian):
    k = _prepare()
    _cut(k.siw_ko)
    debian.calls.clear()
    again = _prepare()
    assert again.siw_ko == k.siw_ko and not cache.problem(k.siw_ko.parent)
    assert debian.count("make") == 1 and debian.count("dpkg") == 0
    assert debian.count("apt-get") == 0  # linux-source's .deb was checked and kept
    assert any("siw.ko has 100 bytes" in s for s in debian.said)


def test_a_deb_with_the_wrong_sha256_is_fetched_again(debian):
    k = _prepare()
    image = kernel.CACHE / "debs" / f"linux-image-{REL}_{VERSION}_amd64.deb"
    _flip(image, at=200)
    _cut(k.vmlinuz)  # so that the kernel is unpacked from its packages again
    debian.calls.clear()
    _prepare()
    assert [c[-1] for c in debian.calls if c[0] == "apt-get"] == [f"linux-image-{REL}={VERSION}"]
    assert image.read_bytes() == debian.deb(f"linux-image-{REL}")
    assert any(f"{image} is not the {VERSION}" in s for s in debian.said)


def test_the_manifest_notices_what_sizes_and_hashes_can(tmp_path):
    d = tmp_path / "a"
    d.mkdir()
    (d / "read.ko").write_bytes(b"module" * 10)
    (d / "sub").mkdir()
    (d / "sub" / "other").write_bytes(b"data")
    (d / "link").symlink_to("sub/other")
    cache.write_json(d / cache.MANIFEST, cache.manifest(d, ["read.ko"], {"why": "test"}))
    assert cache.problem(d) == "incomplete (no done marker)"
    (d / cache.DONE).write_text("a\n")
    assert cache.problem(d) is None
    (d / "link").unlink()
    (d / "link").symlink_to("elsewhere")
    assert cache.problem(d) == "link no longer links to sub/other"
    (d / "link").unlink()
    (d / "link").symlink_to("sub/other")
    (d / "sub" / "other").unlink()
    assert cache.problem(d) == "sub/other is missing"
    (d / "sub" / "other").write_bytes(b"dat")
    assert cache.problem(d) == "sub/other has 3 bytes, the manifest says 4"
    (d / "sub" / "other").write_bytes(b"DATA")  # same size, not verified: sizes only
    _flip(d / "read.ko")
    assert cache.problem(d) == "read.ko does not match its sha256"
    (d / cache.MANIFEST).write_text('{"files": ')
    assert cache.problem(d) == f"{cache.MANIFEST} is missing or unreadable"


# ---- keys ------------------------------------------------------------------------------

def test_keys_follow_the_inputs(debian, monkeypatch):
    k = _prepare()
    names = {"kernel": k.root.name, "siw": k.siw_ko.parent.name,
             "testmod": k.testmod_ko.parent.name}
    # The test module's sources: a new testmod folder, the rest kept.
    (modbuild.TESTMOD_SRC / f"{modbuild.TESTMOD}.c").write_text("/* changed */\n")
    k2 = _prepare()
    assert k2.testmod_ko.parent.name != names["testmod"] and k2.root == k.root
    assert k2.siw_ko == k.siw_ko
    # siw's Kbuild: a new siw folder.
    monkeypatch.setattr(modbuild, "SIW_KBUILD", modbuild.SIW_KBUILD + "ccflags-y += -DX\n")
    k3 = _prepare()
    assert k3.siw_ko.parent.name != names["siw"] and k3.root == k.root
    # A recipe's number: the same inputs, another name.
    monkeypatch.setitem(kernel.RECIPES, "testmod", kernel.RECIPES["testmod"] + 1)
    assert _prepare().testmod_ko.parent != k3.testmod_ko.parent
    # A new build of one package in the index (read again once the memo is gone): a new
    # kernel, and siw.ko and the test module built for it.
    debian.versions["linux-kbuild-6.1"] = "6.1.999-2"
    debian_mod.memo_path(REL).unlink()
    k4 = _prepare()
    assert k4.root.name != k.root.name and k4.key != k.key
    assert k4.siw_ko.parent.name != k3.siw_ko.parent.name
    assert k4.testmod_ko.parent.parent == kernel.CACHE
    inputs = json.loads((k4.root / cache.MANIFEST).read_text())["inputs"]["inputs"]
    assert {"package": "linux-kbuild-6.1", "version": "6.1.999-2", "architecture": "amd64",
            "sha256": cache.sha256(kernel.CACHE / "debs" /
                                   "linux-kbuild-6.1_6.1.999-2_amd64.deb")} in inputs["packages"]


def test_the_initrd_key_covers_init_busybox_modules_and_kernel(debian):
    k = _prepare(siw=False)
    mods = [("rdma_rxe", b"rxe"), ("siw", b"siw")]
    base = initrd.inputs(k, mods, b"busybox", b"init")
    for other in (initrd.inputs(k, mods, b"busybox", b"init2"),
                  initrd.inputs(k, mods, b"busybox2", b"init"),
                  initrd.inputs(k, [("rdma_rxe", b"rxe"), ("siw", b"siw2")], b"busybox", b"init"),
                  initrd.inputs(k, mods[::-1], b"busybox", b"init"),
                  initrd.inputs(dataclasses.replace(k, key="0" * 12), mods, b"busybox",
                                b"init")):
        assert kernel.artifact_name("initrd", REL, other) != \
            kernel.artifact_name("initrd", REL, base)


def test_the_initrd_is_reused_rebuilt_when_cut_short_and_renamed_by_init_sh(debian, tmp_path,
                                                                           monkeypatch):
    busybox, init = tmp_path / "busybox", tmp_path / "init.sh"
    busybox.write_bytes(b"\x7fELF busybox" * 100)
    init.write_text("#!/bin/sh\necho one\n")
    monkeypatch.setattr(initrd, "BUSYBOX", busybox)
    monkeypatch.setattr(initrd, "INIT_SH", init)
    k = _prepare(siw=False)
    first = initrd.ensure(k)
    data = first.read_bytes()
    assert first.name == "initrd.gz" and first.parent.parent == kernel.CACHE
    assert initrd.ensure(k) == first and first.read_bytes() == data
    _cut(first, 50)
    assert initrd.ensure(k) == first and first.read_bytes() == data  # reproducible bytes
    assert any("initrd.gz has 50 bytes" in s for s in debian.said)
    init.write_text("#!/bin/sh\necho two\n")
    second = initrd.ensure(k)
    assert second.parent != first.parent and first.exists()  # the older one is kept a while


# ---- the build chroot's headers and the old layout -----------------------------------

def test_headers_in_a_build_chroot_are_checked_like_an_artifact(debian, tmp_path, monkeypatch):
    k = _prepare(siw=False)
    d = tmp_path / "buildroot"
    (d / "usr" / "src").mkdir(parents=True)
    (d / "lib").symlink_to("usr/lib")  # merged /usr, as debootstrap makes it
    (d / "usr" / "lib").mkdir()

    def step(what: str, argv: list[str], timeout: float, log=None) -> str:
        return debian.run(argv)

    monkeypatch.setattr(buildroot, "_step", step)
    records = debian_mod.records_named([f"linux-headers-{REL}", COMMON, "linux-kbuild-6.1"], REL,
                                       "bookworm")
    buildroot._headers(d, k, records)
    makefile = d / "usr" / "src" / f"linux-headers-{REL}" / "Makefile"
    assert makefile.read_text() == f"include /usr/src/{COMMON}/Makefile\n"  # not repointed
    assert os.readlink(d / "usr" / "lib" / "modules" / REL / "build") == f"/usr/src/linux-headers-{REL}"
    assert not (d / ".headers-stage").exists()
    debian.calls.clear()
    buildroot._headers(d, k, records)
    assert debian.count("dpkg") == 0
    _cut(makefile, 5)
    buildroot._headers(d, k, records)
    assert debian.count("dpkg") == 3 and makefile.read_text().startswith("include")
    assert any("Makefile has 5 bytes" in s for s in debian.said)


def test_the_old_layout_in_a_clone_is_left_alone_and_noted_once(debian):
    old = kernel.STATE / f"kernel-{REL}"
    (old / "boot").mkdir(parents=True)
    (old / "boot" / f"vmlinuz-{REL}").write_bytes(b"old")
    (kernel.STATE / "debs").mkdir()
    k = _prepare()
    _prepare()
    assert k.root.parent == kernel.CACHE
    assert (old / "boot" / f"vmlinuz-{REL}").read_bytes() == b"old"
    notes = [s for s in debian.said if "no longer used" in s]
    assert len(notes) == 1 and f"debs, kernel-{REL}" in notes[0] and notes[0].startswith("note:")
    kernel._noted_old_layout = False  # a later process, which only reuses: nothing to say
    debian.said.clear()
    _prepare()
    assert debian.said == []
