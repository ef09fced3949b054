"""What the guests need for --kernel, fetched, unpacked and built (ensure): the kernel's
packages unpacked into the cache, siw.ko where Debian did not build it, and rdmalab_warn.ko.
`python3 -m rdmalab.machines.vmlab prepare` runs it; every later step reuses what checks out."""
from __future__ import annotations

import dataclasses
import pathlib
import re

from . import debian, kernel, modbuild, modules
from .kernel import Kernel, KernelError

def ensure(spec: str | None = None, siw: bool = True, testmod: bool | None = None) -> Kernel:
    """Fetch, unpack and build what the guest needs for --kernel spec (a suite or a release;
    None: kernel_choice()); reuses the cache where it checks out. siw=False: siw.ko only if
    it was made before (a lab of rxe guests does not wait for its build). testmod: build
    rdmalab_warn.ko (True), only where it was made before (False), or None: also where it
    costs seconds, a kernel of this machine's suite (no build chroot to make)."""
    with kernel.cache_lock():
        release, suite = debian.resolve(spec)
        memo = debian.kernel_memo(release, suite)
        k = _unpack_kernel(release, suite, memo)
        ko: pathlib.Path | None = None
        if _config_has(k.root, release, "CONFIG_RDMA_SIW"):  # Debian built it: use theirs
            ko = modules.module_index(k.moddir)["siw"]
        elif (inputs := modbuild.siw_inputs(k, memo, lookup=siw)) is not None and \
                (siw or kernel.complete("siw", release, inputs)):
            ko = modbuild.build_siw(k, inputs)
        if testmod is None:
            testmod = suite.split("-")[0] == "bookworm"
        tko: pathlib.Path | None = None
        tinputs = modbuild.testmod_inputs(k)
        if testmod or kernel.complete("testmod", release, tinputs):
            tko = modbuild.build_testmod(k, tinputs)
        return dataclasses.replace(k, siw_ko=ko, testmod_ko=tko)


def _unpack_kernel(release: str, suite: str, memo: dict) -> Kernel:
    """CACHE/kernel-<release>-<key>: dpkg -x of the kernel's packages, keyed by their index
    records (name, version, sha256)."""
    inputs = {"release": release, "packages": memo["packages"]}
    final = kernel.CACHE / kernel.artifact_name("kernel", release, inputs)

    def make(tree: pathlib.Path) -> list[str]:
        debs = debian.fetch(memo["packages"], suite)
        kernel.say(f"unpacking the {release} kernel from {suite} ({len(debs)} packages) "
                   f"into {final}")
        for deb in debs:
            kernel.run(["dpkg", "-x", str(deb), str(tree)], what=f"unpacking {deb.name}")
        _repoint_headers(tree, final)
        return _kernel_reads(Kernel(release, tree, None, suite))

    root = kernel.artifact("kernel", release, inputs, make)
    return Kernel(release, root, None, suite, key=root.name.rsplit("-", 1)[1])


def _repoint_headers(tree: pathlib.Path, final: pathlib.Path) -> None:
    """The headers' Makefiles include each other by absolute /usr/src paths: point them into
    the unpacked tree, where it will be once renamed into place."""
    for mk in (tree / "usr" / "src").glob("linux-headers-*/Makefile"):
        text = mk.read_text()
        fixed = re.sub(r"(?<=[\s=])/usr/src/", f"{final}/usr/src/", text)
        if fixed != text:
            mk.write_text(fixed)


def _kernel_reads(k: Kernel) -> list[str]:
    """What the lab reads from an unpacked kernel (hashed again on every reuse): vmlinuz, the
    config, modules.builtin and the modules the guest loads. A kernel the guests cannot boot
    (a module missing) keeps the first three: its initrd build says what is wrong."""
    paths = [k.vmlinuz, k.config, k.moddir / "modules.builtin"]
    siw = modules.module_index(k.moddir).get("siw") \
        if _config_has(k.root, k.release, "CONFIG_RDMA_SIW") else None
    try:
        paths += [p for _, p in modules.guest_modules(dataclasses.replace(k, siw_ko=siw))]
    except KernelError:
        pass
    return [p.relative_to(k.root).as_posix() for p in paths if p.is_file()]


def _config_has(kernel_root: pathlib.Path, release: str, option: str) -> bool:
    k = Kernel(release, kernel_root, None)
    return f"\n{option}=" in "\n" + k.config.read_text()
