"""The guest kernel: Debian's linux-image package unpacked into the cache, plus siw.ko.

Nothing is installed into the host: the packages are fetched with `apt-get download` and
unpacked with `dpkg -x` under .cache/vmlab. Debian 12's kernel has rdma_rxe but no siw
(CONFIG_RDMA_SIW unset), so siw.ko is built out of tree from linux-source against the
unpacked headers. Every step leaves a marker file, so a second run only checks them.
The same build makes rdmalab_warn.ko (lab/vmlab/testmod), a test aid for the kernel-log
oracle. Long steps say what they do and how long they have run (progress(), stderr).
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.util
import lzma
import os
import pathlib
import re
import shutil
import subprocess
import sys
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
# Gone where the providers call the crc32 library directly (rxe and siw since 6.15): loaded
# where the kernel has them.
OPTIONAL_MODULES = ("crc32_generic", "crc32c_generic")
# In-guest wire faults (rdmalab.nft): nf_tables carries the payload, counter and cmp
# expressions and the inet family in Debian's build.
NFT_MODULES = ("nf_tables", "nft_meta_bridge")  # the bridge family's meta (l4proto, ...)
# The netns lab inside a guest (lab.netns): a veth pair per host into a bridge.
NETNS_MODULES = ("veth", "bridge")
SIW_FILES = ("siw_cm.o siw_cq.o siw_main.o siw_mem.o siw_qp.o siw_qp_tx.o siw_qp_rx.o "
             "siw_verbs.o")

STEP_TIMEOUT_S = 600  # deadline for any one download, unpack or build step
TESTMOD_SRC = pathlib.Path(__file__).with_name("testmod")  # rdmalab_warn.c and its Kbuild
TESTMOD = "rdmalab_warn"


def progress():
    """rdmalab.progress (say, Waiting): the package's module where it is loaded (pytest, the
    CLI: its sink writes past pytest's capture), else the same file loaded by its path, as
    `python3 -m lab.vmlab` runs without bindings/ on sys.path."""
    mod = sys.modules.get("rdmalab.progress") or sys.modules.get("_vmlab_progress")
    if mod is None:
        path = REPO / "bindings" / "rdmalab" / "progress.py"
        spec = importlib.util.spec_from_file_location("_vmlab_progress", path)
        assert spec is not None and spec.loader is not None, path
        mod = importlib.util.module_from_spec(spec)
        sys.modules["_vmlab_progress"] = mod
        spec.loader.exec_module(mod)
    return mod


def say(msg: str) -> None:
    progress().say(f"vmlab: {msg}")


def waiting(what: str, deadline_s: float, started: float | None = None):
    """A progress.Waiting for one of the VM lab's long steps ("vmlab: <what>: 20 s, ...");
    started: when the step began (time.monotonic()), if before now."""
    return progress().Waiting(what, deadline_s, source="vmlab", started=started)


class KernelError(RuntimeError):
    pass


@dataclasses.dataclass(frozen=True)
class Kernel:
    release: str            # e.g. 6.1.0-56-amd64
    root: pathlib.Path      # dpkg -x of image + headers + kbuild
    siw_ko: pathlib.Path | None  # None: not built (only rxe asked for)

    suite: str = "bookworm"  # the Debian suite it came from
    testmod_ko: pathlib.Path | None = None  # rdmalab_warn.ko; None: not built for it

    @property
    def vmlinuz(self) -> pathlib.Path:  # Debian 12's layout, or 13's split packages'
        return _find(self.root, (f"boot/vmlinuz-{self.release}",
                                 f"usr/lib/modules/{self.release}/vmlinuz"), "vmlinuz")

    @property
    def moddir(self) -> pathlib.Path:
        return _find(self.root, (f"lib/modules/{self.release}",
                                 f"usr/lib/modules/{self.release}"), "the modules folder")

    @property
    def config(self) -> pathlib.Path:
        return _find(self.root, (f"boot/config-{self.release}",
                                 f"usr/lib/modules/{self.release}/config"), "the kernel config")


def _run(argv: list[str], cwd: pathlib.Path | None = None, what: str = "") -> str:
    """argv with STEP_TIMEOUT_S; what: the step's name in progress lines (long steps)."""
    try:
        with waiting(what or " ".join(argv[:2]), STEP_TIMEOUT_S):
            res = subprocess.run(argv, cwd=cwd, capture_output=True, text=True,
                                 timeout=STEP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise KernelError(f"{argv[0]}: no result after {STEP_TIMEOUT_S} s") from exc
    if res.returncode != 0:
        raise KernelError(f"{' '.join(argv)} failed ({res.returncode}):\n{res.stderr[-2000:]}")
    return res.stdout


# The kernels --kernel names: Debian suites (their linux-image-amd64), or a release such as
# 6.12.117+deb13-amd64 found in one of them. bookworm is this machine's own suite: its apt
# configuration is used as it is; every other suite gets a private sources list and lists
# folder under the cache (apt-get -o Dir::Etc::sourcelist=...), never the machine's.
DEFAULT_KERNEL = "bookworm"
SUITES = ("bookworm", "bookworm-backports", "trixie", "sid")
MIRROR = os.environ.get("RDMALAB_DEBIAN_MIRROR", "http://deb.debian.org/debian")


def kernel_choice(spec: str | None = None) -> str:
    """--kernel's value: the argument, else RDMALAB_VM_KERNEL, else VMLAB_KERNEL (a release,
    the older spelling), else bookworm."""
    return (spec or os.environ.get("RDMALAB_VM_KERNEL") or os.environ.get("VMLAB_KERNEL")
            or DEFAULT_KERNEL).strip()


def _apt_options(suite: str) -> list[str]:
    """apt-get/apt-cache options for suite: none for the machine's own (bookworm), else a
    private sources list, lists and cache folder (updated on first use)."""
    if suite == "bookworm":
        return []
    d = CACHE / "apt" / suite
    opts = ["-o", f"Dir::Etc::sourcelist={d / 'sources.list'}", "-o", "Dir::Etc::sourceparts=-",
            "-o", f"Dir::State::Lists={d / 'lists'}", "-o", f"Dir::Cache={d / 'cache'}",
            "-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root"]
    if not (d / ".updated").exists():
        (d / "lists" / "partial").mkdir(parents=True, exist_ok=True)
        (d / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
        (d / "sources.list").write_text(f"deb {MIRROR} {suite} main\n")
        say(f"reading Debian {suite}'s package lists ({MIRROR}), once")
        _run(["apt-get", *opts, "-q", "update"], what=f"apt-get update of {suite}")
        (d / ".updated").write_text(time.strftime("%Y-%m-%d %H:%M:%S\n"))
    return opts


def _depends(pkg: str, opts: list[str]) -> list[str]:
    """pkg's direct Depends (first of each alternative group only)."""
    out = _run(["apt-cache", *opts, "depends", pkg])
    deps = []
    for line in out.splitlines():
        s = line.strip()
        if s.startswith("Depends:"):
            deps.append(s.split(":", 1)[1].strip().strip("<>"))
    return deps


def _has_package(pkg: str, opts: list[str]) -> bool:
    res = subprocess.run(["apt-cache", *opts, "show", "--no-all-versions", pkg],
                         capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
    return res.returncode == 0 and "Package:" in res.stdout


def resolve(spec: str | None = None) -> tuple[str, str]:
    """(release, suite) for a --kernel value: a suite's current linux-image-amd64, or a
    release looked up in the suites in order. Remembered per suite under the cache, so that a
    suite's kernel does not change under a run (prepare --refresh forgets it)."""
    spec = kernel_choice(spec)
    if spec in SUITES:
        memo = CACHE / "apt" / f"{spec}.release"
        if memo.exists():
            return memo.read_text().strip(), spec
        release = ""
        if not release:
            for dep in _depends("linux-image-amd64", _apt_options(spec)):
                if dep.startswith("linux-image-") and dep != "linux-image-amd64":
                    release = dep.removeprefix("linux-image-")
                    break
        if not release:
            raise KernelError(f"--kernel {spec}: linux-image-amd64 of {spec} names no "
                              "linux-image-<release>")
        memo.parent.mkdir(parents=True, exist_ok=True)
        memo.write_text(release + "\n")
        return release, spec
    if not re.fullmatch(r"[0-9]+\.[0-9]+[0-9A-Za-z.+~-]*-amd64", spec):
        raise KernelError(f"--kernel {spec!r}: a Debian suite ({', '.join(SUITES)}) or a "
                          "Debian kernel release such as 6.1.0-56-amd64 or "
                          "6.12.117+deb13-amd64")
    if (CACHE / f"kernel-{spec}" / ".done").exists():
        return spec, (CACHE / f"kernel-{spec}" / ".suite").read_text().strip()
    for suite in SUITES:
        if _has_package(f"linux-image-{spec}", _apt_options(suite)):
            return spec, suite
    raise KernelError(f"--kernel {spec}: no linux-image-{spec} in Debian's "
                      f"{', '.join(SUITES)} ({MIRROR})")


def _suite_of(opts: list[str] | None) -> str:
    """The suite a private apt configuration (_apt_options) is for; none: this machine's."""
    for o in opts or []:
        if o.startswith("Dir::Etc::sourcelist="):
            return pathlib.Path(o.split("=", 1)[1]).parent.name
    return "bookworm"


def _download(packages: Iterable[str], into: pathlib.Path,
              opts: list[str] | None = None) -> list[pathlib.Path]:
    into.mkdir(parents=True, exist_ok=True)
    debs = []
    for pkg in packages:
        found = sorted(into.glob(f"{pkg}_*.deb"))
        if not found:
            suite = _suite_of(opts)
            say(f"fetching {pkg} from {suite}")
            _run(["apt-get", *(opts or []), "download", "-q", pkg], cwd=into,
                 what=f"fetching {pkg} from {suite}")
            found = sorted(into.glob(f"{pkg}_*.deb"))
        if not found:
            raise KernelError(f"apt-get download {pkg} left no .deb in {into}")
        debs.append(found[-1])
    return debs


def _closure(start: str, release: str, opts: list[str]) -> list[str]:
    """start and the kernel packages it depends on: linux-(image|binary|modules|base|headers|
    kbuild)-* that name this release or its ABI (Debian 13 splits the image into binary,
    modules and base; 6.1's headers name their kbuild by major only)."""
    flavour = release.split("-")[-1]
    abi = release.removesuffix(f"-{flavour}")
    major = ".".join(abi.split(".")[:2])
    keep = re.compile(r"linux-(image|binary|modules|base|headers|kbuild)-")
    seen, queue = [start], [start]
    while queue:
        for dep in _depends(queue.pop(0), opts):
            if dep in seen or not keep.match(dep) or "unsigned" in dep:
                continue
            if dep.startswith("linux-image-") and not start.startswith("linux-image-"):
                continue  # the headers' dependency on an image: fetched by itself
            if abi in dep or dep == f"linux-kbuild-{major}":
                seen.append(dep)
                queue.append(dep)
    return seen


def _unpack_kernel(release: str, suite: str) -> pathlib.Path:
    root = CACHE / f"kernel-{release}"
    if (root / ".done").exists():
        return root
    opts = _apt_options(suite)
    pkgs = _closure(f"linux-image-{release}", release, opts)
    pkgs += [p for p in _closure(f"linux-headers-{release}", release, opts) if p not in pkgs]
    debs = _download(pkgs, CACHE / "debs", opts)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    say(f"unpacking the {release} kernel from {suite} ({len(debs)} packages) into {root}")
    for deb in debs:
        _run(["dpkg", "-x", str(deb), str(root)], what=f"unpacking {deb.name}")
    # The headers' Makefiles include each other by absolute /usr/src paths: point them into
    # the unpacked tree.
    for mk in (root / "usr" / "src").glob("linux-headers-*/Makefile"):
        text = mk.read_text()
        fixed = re.sub(r"(?<=[\s=])/usr/src/", f"{root}/usr/src/", text)
        if fixed != text:
            mk.write_text(fixed)
    (root / ".suite").write_text(suite + "\n")
    (root / ".done").write_text(release + "\n")
    return root


def _find(root: pathlib.Path, candidates: Iterable[str], what: str) -> pathlib.Path:
    for c in candidates:
        if (root / c).exists():
            return root / c
    raise KernelError(f"{what} not found under {root} (looked for {', '.join(candidates)})")


def _build_siw(release: str, root: pathlib.Path, suite: str) -> pathlib.Path:
    out = CACHE / f"siw-{release}"
    ko = out / "siw.ko"
    if (out / ".done").exists() and ko.exists():
        return ko
    major = ".".join(release.split(".")[:2])
    (deb,) = _download([f"linux-source-{major}"], CACHE / "debs", _apt_options(suite))
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    member = f"./usr/src/linux-source-{major}.tar.xz"
    prefix = f"linux-source-{major}/drivers/infiniband/sw/siw/"
    # Stream: the .deb holds a 140 MB tar.xz of the whole tree; only siw/ is kept.
    # dpkg-deb gets SIGPIPE when the loop stops early: expected, so its stderr is dropped.
    end = time.monotonic() + STEP_TIMEOUT_S
    say(f"extracting siw's sources from {deb.name} (about a minute, once per kernel)")
    with waiting(f"extracting siw's sources from {deb.name}", STEP_TIMEOUT_S), \
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
    (out / "Kbuild").write_text(f"obj-m += siw.o\nsiw-y := {SIW_FILES}\n")
    _make_modules("siw.ko", release, root, suite, out)
    if not ko.exists():
        raise KernelError(f"kbuild left no {ko}")
    (out / ".done").write_text(release + "\n")
    return ko


def _make_modules(what: str, release: str, root: pathlib.Path, suite: str,
                  out: pathlib.Path) -> None:
    """make modules for the sources (and Kbuild) in out against release's headers."""
    if suite.split("-")[0] == "bookworm":
        # This machine's own suite: the kernel's compiler (gcc-12) and Debian's kbuild tools
        # (glibc 2.36) run here as they are.
        say(f"building {what} for {release}")
        headers = root / "usr" / "src" / f"linux-headers-{release}"
        _run(["make", "-C", str(headers), f"M={out}", "modules", "-j2"],
             what=f"building {what} for {release}")
    else:
        _build_in_buildroot(what, release, suite, out)


def _testmod_digest() -> str:
    h = hashlib.sha256()
    for f in sorted(TESTMOD_SRC.iterdir()):
        if f.is_file():
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def _build_testmod(release: str, root: pathlib.Path, suite: str) -> pathlib.Path:
    """rdmalab_warn.ko for release under CACHE/testmod-<release>, built again when its
    sources change (the marker holds their digest)."""
    out = CACHE / f"testmod-{release}"
    ko = out / f"{TESTMOD}.ko"
    digest = _testmod_digest()
    done = out / ".done"
    if ko.exists() and done.exists() and done.read_text().split()[-1:] == [digest]:
        return ko
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(TESTMOD_SRC, out)
    _make_modules(f"{TESTMOD}.ko", release, root, suite, out)
    if not ko.exists():
        raise KernelError(f"kbuild left no {ko}")
    done.write_text(f"{release} {digest}\n")
    return ko


# A newer suite's kernel (trixie's 6.12, sid's 7.x) was built with that suite's compiler
# (gcc-14, gcc-16), and Debian's kbuild host tools for it (modpost, objtool, resolve_btfids)
# are linked against that suite's glibc (2.38 on; bookworm has 2.36). siw.ko for it is built
# in a minimal chroot of the kernel's own suite, made once per suite by debootstrap from
# Debian's archive, with the kernel's headers and kbuild unpacked into it: the compiler the
# headers depend on, Debian's modpost and objtool, and pahole run there on their own glibc.
# Every command runs in new mount and pid namespaces (unshare) with a /proc of its own, which
# debootstrap and 7.x's objtool (it reads /proc/self/maps) need: no mount can outlive the
# command or show outside it, and a command past its deadline is killed with all it started.
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


def _buildroot_step(step: str, argv: list[str], timeout: float,
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
        with waiting(step, timeout):
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


def _buildroot(suite: str, packages: list[str]) -> pathlib.Path:
    """CACHE/buildroot-<suite>: debootstrap --variant=minbase of suite with packages, made
    again when a later kernel of the suite needs a package it lacks (another gcc)."""
    d = CACHE / f"buildroot-{suite}"
    done = d / ".done"
    if done.exists() and set(packages) <= set((done.read_text().splitlines() or [""])[0].split()):
        return d
    if shutil.which("debootstrap") is None:
        raise KernelError(f"module build for {suite}: debootstrap is not installed on this "
                          "machine (apt-get install debootstrap)")
    mounted = [p for p in (d / "proc", d / "sys", d / "dev", d / "dev" / "pts") if p.is_mount()]
    if mounted:  # never: every mount is made in a namespace of its own (rmtree would empty it)
        raise KernelError(f"module build for {suite}: {', '.join(map(str, mounted))} mounted; "
                          f"unmount and remove {d}")
    shutil.rmtree(d, ignore_errors=True)
    d.parent.mkdir(parents=True, exist_ok=True)
    # debootstrap 1.0.128 (bookworm) knows suites up to trixie by name; a newer one is sid's.
    script = [] if (DEBOOTSTRAP_SCRIPTS / suite).exists() else [str(DEBOOTSTRAP_SCRIPTS / "sid")]
    start = time.monotonic()
    say(f"making the {suite} build chroot with debootstrap ({d}; about a minute and 500 MB, "
        "once per suite)")
    _buildroot_step(f"debootstrap {suite}", _isolated(
        ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite, str(d),
         MIRROR, *script]), DEBOOTSTRAP_TIMEOUT_S, log=d / "debootstrap" / "debootstrap.log")
    seconds = time.monotonic() - start
    for deb in (d / "var" / "cache" / "apt" / "archives").glob("*.deb"):
        deb.unlink()  # about 100 MB the build never reads
    done.write_text(" ".join(packages) + f"\ndebootstrap {seconds:.0f} s\n")
    return d


def _build_in_buildroot(what: str, release: str, suite: str, out: pathlib.Path) -> None:
    """make modules for the sources in out (siw's, the test module's), in the build chroot of
    suite, against linux-headers-<release> unpacked there; the results are copied back."""
    opts = _apt_options(suite)
    deps = _depends(f"linux-headers-{release}", opts)
    cc = [p for p in deps if re.fullmatch(r"gcc-[0-9]+(-for-host)?", p)]
    kbuild = [p for p in deps if p.startswith("linux-kbuild-")]
    common = [p for p in deps if p.startswith("linux-headers-")]
    if not cc or not kbuild:
        raise KernelError(f"module build: linux-headers-{release} of {suite} names no gcc-N or "
                          f"linux-kbuild-* among its Depends ({', '.join(deps)})")
    packages = list(dict.fromkeys([cc[0], "make", "libc6-dev", *_depends(kbuild[0], opts)]))
    d = _buildroot(suite, packages)
    mark = d / f".headers-{release}"
    if not mark.exists():
        for deb in _download([f"linux-headers-{release}", *common, kbuild[0]], CACHE / "debs",
                             opts):
            _buildroot_step(f"unpack {deb.name}", ["dpkg", "-x", str(deb), str(d)],
                            STEP_TIMEOUT_S)
        mark.write_text(release + "\n")
    build = d / "build" / out.name
    shutil.rmtree(build, ignore_errors=True)
    shutil.copytree(out, build)
    say(f"building {what} for {release} in the {suite} chroot (about 30 s the first time)")
    _buildroot_step(f"building {what} for {release} in {d.name}", _isolated(
        ["make", "-C", f"/usr/src/linux-headers-{release}", f"M=/build/{out.name}", "modules",
         "-j2"], chroot=d), STEP_TIMEOUT_S)
    shutil.copytree(build, out, dirs_exist_ok=True)


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


def _config_has(kernel_root: pathlib.Path, release: str, option: str) -> bool:
    k = Kernel(release, kernel_root, None)
    return f"\n{option}=" in "\n" + k.config.read_text()


def ensure(spec: str | None = None, siw: bool = True, testmod: bool | None = None) -> Kernel:
    """Fetch, unpack and build what the guest needs for --kernel spec (a suite or a release;
    None: kernel_choice()); reuses the cache when it is complete. siw=False: siw.ko only if
    it is there already (a lab of rxe guests does not wait for its build). testmod: build
    rdmalab_warn.ko (True), only where it is there already (False), or None: also where it
    costs seconds, a kernel of this machine's suite (no build chroot to make)."""
    with cache_lock():
        release, suite = resolve(spec)
        root = _unpack_kernel(release, suite)
        ko: pathlib.Path | None
        if _config_has(root, release, "CONFIG_RDMA_SIW"):  # Debian built it: use theirs
            ko = module_index(Kernel(release, root, None).moddir)["siw"]
        elif siw or (CACHE / f"siw-{release}" / ".done").exists():
            ko = _build_siw(release, root, suite)
        else:
            ko = None
        if testmod is None:
            testmod = suite.split("-")[0] == "bookworm"
        tko: pathlib.Path | None = None
        if testmod or (CACHE / f"testmod-{release}" / ".done").exists():
            tko = _build_testmod(release, root, suite)
        return Kernel(release=release, root=root, siw_ko=ko, suite=suite, testmod_ko=tko)


# ---- module dependencies -------------------------------------------------------------

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
    """(name, path) for every module the guest loads, in load order (siw last, where built)."""
    index = module_index(kernel.moddir)
    extra: tuple[str, ...] = ()
    if kernel.siw_ko is not None:
        index["siw"] = kernel.siw_ko
        extra = ("siw",)

    builtin = builtin_modules(kernel.moddir)

    def depends(name: str) -> list[str]:
        if name not in index:
            raise KernelError(f"module {name} is not in {kernel.moddir}")
        return [d for d in module_depends(index[name]) if d not in builtin]

    wanted = [m for m in BASE_MODULES + RDMA_MODULES + NFT_MODULES + NETNS_MODULES + extra
              if m not in builtin and (m in index or m not in OPTIONAL_MODULES)]
    names = load_order(wanted, depends)
    return [(n, index[n]) for n in names]
