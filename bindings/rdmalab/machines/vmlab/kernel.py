"""The guest kernel: Debian's linux-image package unpacked into the cache, plus siw.ko.

Nothing is installed into the host: the packages are fetched with `apt-get download` and
unpacked with `dpkg -x` into the artifact cache (CACHE, shared by every clone on the machine;
bindings/rdmalab/machines/vmlab/cache.py). Debian 12's kernel has rdma_rxe but no siw (CONFIG_RDMA_SIW unset), so
siw.ko is built out of tree from linux-source against the unpacked headers. The same build
makes rdmalab_warn.ko (bindings/rdmalab/machines/vmlab/testmod), a test aid for the kernel-log oracle. Each result
is a folder named by a digest of what it was made from and checked against its manifest
before reuse, so a second run, or a second clone, only checks them. Long steps say what they
do and how long they have run (rdmalab.run.progress, stderr).
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import lzma
import os
import pathlib
import re
import shutil
import subprocess
import tarfile
import time
from typing import Callable, Iterable, Iterator

from ...paths import REPO
from ...run import progress
from . import cache

CACHE = cache.artifact_home()   # downloads and built artifacts, shared by every clone
STATE = cache.state_home(REPO)  # this clone's run/, up/, ssh/ and inventories
# Part of every artifact's key: bump a kind's number when the way it is made changes, so that
# no clone reuses what the older code made.
RECIPES = {"kernel": 1, "siw": 1, "testmod": 1, "buildroot": 1, "initrd": 1}

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
SIW_FILES = ("siw_cm.o siw_cq.o siw_main.o siw_mem.o siw_qp.o siw_qp_tx.o siw_qp_rx.o "
             "siw_verbs.o")
SIW_KBUILD = f"obj-m += siw.o\nsiw-y := {SIW_FILES}\n"

STEP_TIMEOUT_S = 600  # deadline for any one download, unpack or build step
TESTMOD_SRC = pathlib.Path(__file__).with_name("testmod")  # rdmalab_warn.c and its Kbuild
TESTMOD = "rdmalab_warn"


def say(msg: str) -> None:
    progress.say(f"vmlab: {msg}")


def waiting(what: str, deadline_s: float, started: float | None = None):
    """A progress.Waiting for one of the VM lab's long steps ("vmlab: <what>: 20 s, ...");
    started: when the step began (time.monotonic()), if before now."""
    return progress.Waiting(what, deadline_s, source="vmlab", started=started)


class KernelError(RuntimeError):
    pass


@dataclasses.dataclass(frozen=True)
class Kernel:
    release: str            # e.g. 6.1.0-56-amd64
    root: pathlib.Path      # dpkg -x of image + headers + kbuild
    siw_ko: pathlib.Path | None  # None: not built (only rxe asked for)

    suite: str = "bookworm"  # the Debian suite it came from
    testmod_ko: pathlib.Path | None = None  # rdmalab_warn.ko; None: not built for it
    key: str = ""  # the digest of its packages that names root: part of every later key

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


RELEASE = re.compile(r"[0-9]+\.[0-9]+[0-9A-Za-z.+~-]*-amd64")


def _suite_release(suite: str) -> str:
    """The release that suite's linux-image-amd64 depends on, read once and kept in
    CACHE/apt/<suite>.release (a memo that does not hold a release is read again)."""
    memo = CACHE / "apt" / f"{suite}.release"
    if memo.exists() and RELEASE.fullmatch(release := memo.read_text().strip()):
        return release
    for dep in _depends("linux-image-amd64", _apt_options(suite)):
        if dep.startswith("linux-image-") and dep != "linux-image-amd64":
            memo.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(memo, dep.removeprefix("linux-image-") + "\n")
            return dep.removeprefix("linux-image-")
    raise KernelError(f"--kernel {suite}: linux-image-amd64 of {suite} names no "
                      "linux-image-<release>")


def resolve(spec: str | None = None) -> tuple[str, str]:
    """(release, suite) for a --kernel value: a suite's current linux-image-amd64, or a
    release looked up in the suites in order. Remembered per suite under the cache, so that a
    suite's kernel does not change under a run (prepare --refresh forgets it)."""
    spec = kernel_choice(spec)
    if spec in SUITES:
        return _suite_release(spec), spec
    if not RELEASE.fullmatch(spec):
        raise KernelError(f"--kernel {spec!r}: a Debian suite ({', '.join(SUITES)}) or a "
                          "Debian kernel release such as 6.1.0-56-amd64 or "
                          "6.12.117+deb13-amd64")
    memo = cache.read_json(_memo_path(spec))  # prepared before: no need to ask apt
    if memo is not None and memo.get("suite") in SUITES:
        return spec, memo["suite"]
    for suite in SUITES:
        if _has_package(f"linux-image-{spec}", _apt_options(suite)):
            return spec, suite
    raise KernelError(f"--kernel {spec}: no linux-image-{spec} in Debian's "
                      f"{', '.join(SUITES)} ({MIRROR})")


def _memo_path(release: str) -> pathlib.Path:
    return CACHE / "apt" / f"kernel-{release}.json"


def _valid_record(rec: object) -> bool:
    return isinstance(rec, dict) and all(isinstance(rec.get(f), str) and rec[f] for f in
                                         ("package", "version", "architecture", "sha256"))


def _index_records(pkgs: list[str], opts: list[str]) -> list[dict]:
    """Each package's candidate in apt's index (apt-cache show, one call for all): package,
    version, architecture and the SHA256 a download of it must have."""
    out = _run(["apt-cache", *opts, "show", "--no-all-versions", *pkgs],
               what=f"apt-cache show {len(pkgs)} packages")
    found: dict[str, dict] = {}
    for stanza in out.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines()
                      if ": " in line and not line[:1].isspace())
        rec = {"package": fields.get("Package"), "version": fields.get("Version"),
               "architecture": fields.get("Architecture"), "sha256": fields.get("SHA256")}
        if _valid_record(rec):
            found.setdefault(rec["package"], rec)
    missing = [p for p in pkgs if p not in found]
    if missing:
        raise KernelError(f"apt-cache show names no version and SHA256 for {', '.join(missing)}")
    return [found[p] for p in pkgs]


def _kernel_memo(release: str, suite: str) -> dict:
    """The kernel's packages as apt's index gives them (_index_records), found once per
    release and kept in CACHE/apt/kernel-<release>.json: the input of every key built from
    them, and what a cached .deb is checked against (finding them costs apt ten seconds)."""
    path = _memo_path(release)
    memo = cache.read_json(path)
    if memo is not None and memo.get("suite") == suite and isinstance(memo.get("packages"), list) \
            and memo["packages"] and all(map(_valid_record, memo["packages"])):
        return memo
    opts = _apt_options(suite)
    say(f"reading the {release} kernel's packages from {suite}'s index, once")
    pkgs = _closure(f"linux-image-{release}", release, opts)
    pkgs += [p for p in _closure(f"linux-headers-{release}", release, opts) if p not in pkgs]
    memo = {"suite": suite, "packages": _index_records(pkgs, opts)}
    path.parent.mkdir(parents=True, exist_ok=True)
    cache.write_json(path, memo)
    return memo


def _records_named(names: list[str], release: str, suite: str) -> list[dict]:
    """Index records of names: the kernel's memo where it has them, else apt's index."""
    known = {r["package"]: r for r in _kernel_memo(release, suite)["packages"]}
    missing = [n for n in names if n not in known]
    if missing:
        known.update((r["package"], r) for r in _index_records(missing, _apt_options(suite)))
    return [known[n] for n in names]


def _deb_path(rec: dict) -> pathlib.Path:
    """Where apt-get download puts it: name_version_arch.deb, an epoch's colon quoted."""
    version = rec["version"].replace(":", "%3a")
    return CACHE / "debs" / f"{rec['package']}_{version}_{rec['architecture']}.deb"


def _fetch(records: list[dict], suite: str) -> list[pathlib.Path]:
    """The .debs of records in CACHE/debs, each checked against its index SHA256 before it
    is used: one that differs (cut short, changed) is removed and fetched again."""
    debs = []
    for rec in records:
        deb = _deb_path(rec)
        if deb.exists() and cache.sha256(deb) != rec["sha256"]:
            say(f"{deb} is not the {rec['version']} that {suite}'s index describes (its sha256 "
                "differs): fetching it again")
            deb.unlink()
        if not deb.exists():
            _download(rec, deb, suite)
        debs.append(deb)
    return debs


def _download(rec: dict, deb: pathlib.Path, suite: str) -> None:
    """apt-get download of that exact version (apt checks the file against its index), then
    the same check here, so that a record and a file that disagree are never used."""
    spec = f"{rec['package']}={rec['version']}"
    _note_old_layout()
    say(f"fetching {spec} from {suite}")
    deb.parent.mkdir(parents=True, exist_ok=True)
    _run(["apt-get", *_apt_options(suite), "download", "-q", spec], cwd=deb.parent,
         what=f"fetching {spec} from {suite}")
    if not deb.exists():
        raise KernelError(f"apt-get download {spec} left no {deb}")
    if cache.sha256(deb) != rec["sha256"]:
        deb.unlink()
        raise KernelError(f"apt-get download {spec}: not the sha256 {rec['sha256']} recorded "
                          f"from {suite}'s index in {CACHE / 'apt'}/kernel-<release>.json "
                          "(remove it to read the index again)")


def _closure(start: str, release: str, opts: list[str]) -> list[str]:
    """start and the kernel packages it depends on: linux-(image|binary|modules|base|headers|
    kbuild)-* that name this release or its ABI (Debian 13 splits the image into binary,
    modules and base; 6.1's headers name their kbuild by major only)."""
    flavour = release.split("-")[-1]
    abi = release.removesuffix(f"-{flavour}")
    major = _major(abi)
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


# ---- artifacts ---------------------------------------------------------------------------

def artifact_name(kind: str, label: str, inputs: object) -> str:
    """<kind>-<label>-<digest of the kind's recipe and inputs>, e.g. siw-6.1.0-56-amd64-<12>."""
    return f"{kind}-{label}-{cache.key(f'{kind}/{RECIPES[kind]}', inputs)}"


def artifact(kind: str, label: str, inputs: object,
             make: Callable[[pathlib.Path], list[str]]) -> pathlib.Path:
    """CACHE/artifact_name(...): reused when it matches its manifest, else made again from
    scratch by make (cache.build: it fills a fresh folder and returns the files to verify).
    The caller holds cache_lock()."""
    name = artifact_name(kind, label, inputs)
    root = CACHE / name
    if root.exists():
        why = cache.problem(root)
        if why is None:
            return root
        say(f"{root}: {why}: making it again from scratch")
    _note_old_layout()
    return cache.build(CACHE, name, make, {"kind": f"{kind}/{RECIPES[kind]}", "inputs": inputs})


def _complete(kind: str, label: str, inputs: object) -> bool:
    """Whether the artifact was made here before (checked when it is used)."""
    return (CACHE / artifact_name(kind, label, inputs) / cache.DONE).exists()


def _unpack_kernel(release: str, suite: str, memo: dict) -> Kernel:
    """CACHE/kernel-<release>-<key>: dpkg -x of the kernel's packages, keyed by their index
    records (name, version, sha256)."""
    inputs = {"release": release, "packages": memo["packages"]}
    final = CACHE / artifact_name("kernel", release, inputs)

    def make(tree: pathlib.Path) -> list[str]:
        debs = _fetch(memo["packages"], suite)
        say(f"unpacking the {release} kernel from {suite} ({len(debs)} packages) into {final}")
        for deb in debs:
            _run(["dpkg", "-x", str(deb), str(tree)], what=f"unpacking {deb.name}")
        _repoint_headers(tree, final)
        return _kernel_reads(Kernel(release, tree, None, suite))

    root = artifact("kernel", release, inputs, make)
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
    siw = module_index(k.moddir).get("siw") if _config_has(k.root, k.release,
                                                            "CONFIG_RDMA_SIW") else None
    try:
        paths += [p for _, p in guest_modules(dataclasses.replace(k, siw_ko=siw))]
    except KernelError:
        pass
    return [p.relative_to(k.root).as_posix() for p in paths if p.is_file()]


def _find(root: pathlib.Path, candidates: Iterable[str], what: str) -> pathlib.Path:
    for c in candidates:
        if (root / c).exists():
            return root / c
    raise KernelError(f"{what} not found under {root} (looked for {', '.join(candidates)})")


def _major(release: str) -> str:
    """6.1 of 6.1.0-56-amd64: what linux-source and 6.1's linux-kbuild are named by."""
    return ".".join(release.split(".")[:2])


def _siw_inputs(k: Kernel, memo: dict, lookup: bool) -> dict | None:
    """siw.ko's inputs: the kernel, linux-source's index record (kept in the kernel's memo
    once read: None when it is not and lookup is False, as siw.ko was never built here) and
    the Kbuild text."""
    source = memo.get("source")
    if not _valid_record(source):
        if not lookup:
            return None
        (source,) = _index_records([f"linux-source-{_major(k.release)}"],
                                   _apt_options(k.suite))
        memo["source"] = source
        cache.write_json(_memo_path(k.release), memo)
    return {"kernel": k.key, "source": source, "kbuild": SIW_KBUILD}


def _build_siw(k: Kernel, inputs: dict) -> pathlib.Path:
    def make(out: pathlib.Path) -> list[str]:
        (deb,) = _fetch([inputs["source"]], k.suite)
        _siw_sources(deb, out, _major(k.release))
        (out / "Kbuild").write_text(SIW_KBUILD)
        _make_modules("siw.ko", k, out)
        if not (out / "siw.ko").exists():
            raise KernelError(f"kbuild left no siw.ko in {out}")
        return ["siw.ko"]
    return artifact("siw", k.release, inputs, make) / "siw.ko"


def _siw_sources(deb: pathlib.Path, out: pathlib.Path, major: str) -> None:
    """drivers/infiniband/sw/siw/* of linux-source-<major>'s tree into out."""
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


def _make_modules(what: str, k: Kernel, out: pathlib.Path) -> None:
    """make modules for the sources (and Kbuild) in out against k's headers."""
    if k.suite.split("-")[0] == "bookworm":
        # This machine's own suite: the kernel's compiler (gcc-12) and Debian's kbuild tools
        # (glibc 2.36) run here as they are.
        say(f"building {what} for {k.release}")
        headers = k.root / "usr" / "src" / f"linux-headers-{k.release}"
        _run(["make", "-C", str(headers), f"M={out}", "modules", "-j2"],
             what=f"building {what} for {k.release}")
    else:
        _build_in_buildroot(what, k, out)


def _testmod_inputs(k: Kernel) -> dict:
    sources = {f.name: cache.sha256(f) for f in sorted(TESTMOD_SRC.iterdir()) if f.is_file()}
    return {"kernel": k.key, "sources": sources}


def _build_testmod(k: Kernel, inputs: dict) -> pathlib.Path:
    """rdmalab_warn.ko for k: CACHE/testmod-<release>-<key of its sources and the kernel>."""
    def make(out: pathlib.Path) -> list[str]:
        shutil.copytree(TESTMOD_SRC, out, dirs_exist_ok=True)
        _make_modules(f"{TESTMOD}.ko", k, out)
        if not (out / f"{TESTMOD}.ko").exists():
            raise KernelError(f"kbuild left no {TESTMOD}.ko in {out}")
        return [f"{TESTMOD}.ko"]
    return artifact("testmod", k.release, inputs, make) / f"{TESTMOD}.ko"


# A newer suite's kernel (trixie's 6.12, sid's 7.x) was built with that suite's compiler
# (gcc-14, gcc-16), and Debian's kbuild host tools for it (modpost, objtool, resolve_btfids)
# are linked against that suite's glibc (2.38 on; bookworm has 2.36). siw.ko for it is built
# in a minimal chroot of the kernel's own suite, made once per suite and package list by
# debootstrap from Debian's archive (an artifact like the others, keyed by that list), with
# each kernel's headers and kbuild unpacked into it (their own manifest): the compiler the
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
    """CACHE/buildroot-<suite>-<key of packages>: debootstrap --variant=minbase of suite with
    packages (a kernel whose headers want another gcc gets a chroot of its own)."""
    inputs = {"suite": suite, "packages": sorted(packages)}
    final = CACHE / artifact_name("buildroot", suite, inputs)
    mounted = [p for p in (final / "proc", final / "sys", final / "dev", final / "dev" / "pts")
               if p.is_mount()]
    if mounted:  # never: every mount is made in a namespace of its own (rmtree would empty it)
        raise KernelError(f"module build for {suite}: {', '.join(map(str, mounted))} mounted; "
                          f"unmount and remove {final}")

    def make(d: pathlib.Path) -> list[str]:
        if shutil.which("debootstrap") is None:
            raise KernelError(f"module build for {suite}: debootstrap is not installed on this "
                              "machine (apt-get install debootstrap)")
        # debootstrap 1.0.128 (bookworm) knows suites up to trixie by name; newer: sid's.
        script = [] if (DEBOOTSTRAP_SCRIPTS / suite).exists() else \
            [str(DEBOOTSTRAP_SCRIPTS / "sid")]
        say(f"making the {suite} build chroot with debootstrap ({final}; about a minute and "
            "500 MB, once per suite)")
        _buildroot_step(f"debootstrap {suite}", _isolated(
            ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite,
             str(d), MIRROR, *script]), DEBOOTSTRAP_TIMEOUT_S,
            log=d / "debootstrap" / "debootstrap.log")
        for deb in (d / "var" / "cache" / "apt" / "archives").glob("*.deb"):
            deb.unlink()  # about 100 MB the build never reads
        return []  # nothing the lab reads itself: every size is checked

    return artifact("buildroot", suite, inputs, make)


def _buildroot_headers(d: pathlib.Path, k: Kernel, records: list[dict]) -> None:
    """k's headers and kbuild unpacked into the chroot d, once per kernel key: staged first,
    so that their manifest (kept in d/.headers-<release>-<key>.json) lists just their files,
    which are then moved into place and checked like an artifact on every later use."""
    mark = d / f".headers-{k.release}-{k.key}.json"
    m = cache.read_json(mark)
    if m is not None:
        why = cache.problem(d, m)
        if why is None:
            return
        say(f"{d}: the {k.release} headers: {why}: unpacking them again")
    stage = d / ".headers-stage"
    cache.remove(stage)
    for deb in _fetch(records, k.suite):
        _buildroot_step(f"unpack {deb.name}", ["dpkg", "-x", str(deb), str(stage)],
                        STEP_TIMEOUT_S)
    m = cache.manifest(stage, [], {"kernel": k.key, "packages": records})
    for rel in [*m["files"], *m["links"]]:
        dst = d / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.is_symlink() or dst.is_file():
            dst.unlink()
        os.rename(stage / rel, dst)
    cache.remove(stage)
    cache.write_json(mark, m)


def _build_in_buildroot(what: str, k: Kernel, out: pathlib.Path) -> None:
    """make modules for the sources in out (siw's, the test module's), in the build chroot of
    k's suite, against linux-headers-<release> unpacked there; the results are copied back."""
    opts = _apt_options(k.suite)
    deps = _depends(f"linux-headers-{k.release}", opts)
    cc = [p for p in deps if re.fullmatch(r"gcc-[0-9]+(-for-host)?", p)]
    kbuild = [p for p in deps if p.startswith("linux-kbuild-")]
    common = [p for p in deps if p.startswith("linux-headers-")]
    if not cc or not kbuild:
        raise KernelError(f"module build: linux-headers-{k.release} of {k.suite} names no gcc-N "
                          f"or linux-kbuild-* among its Depends ({', '.join(deps)})")
    packages = list(dict.fromkeys([cc[0], "make", "libc6-dev", *_depends(kbuild[0], opts)]))
    d = _buildroot(k.suite, packages)
    _buildroot_headers(d, k, _records_named([f"linux-headers-{k.release}", *common, kbuild[0]],
                                            k.release, k.suite))
    build = d / "build" / out.name
    cache.remove(build)
    shutil.copytree(out, build)
    say(f"building {what} for {k.release} in the {k.suite} chroot (about 30 s the first time)")
    try:
        _buildroot_step(f"building {what} for {k.release} in {d.name}", _isolated(
            ["make", "-C", f"/usr/src/linux-headers-{k.release}", f"M=/build/{out.name}",
             "modules", "-j2"], chroot=d), STEP_TIMEOUT_S)
        shutil.copytree(build, out, dirs_exist_ok=True)
    finally:
        cache.remove(build)  # scratch: the chroot keeps only what its manifests list


@contextlib.contextmanager
def cache_lock(deadline_s: float = 2 * STEP_TIMEOUT_S) -> Iterator[None]:
    """Serialises builders of the artifact cache (two sessions, or two clones, may prepare at
    once); whoever takes it first removes what a builder that died left half made."""
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
            cache.remove_leftovers(CACHE)
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _config_has(kernel_root: pathlib.Path, release: str, option: str) -> bool:
    k = Kernel(release, kernel_root, None)
    return f"\n{option}=" in "\n" + k.config.read_text()


def ensure(spec: str | None = None, siw: bool = True, testmod: bool | None = None) -> Kernel:
    """Fetch, unpack and build what the guest needs for --kernel spec (a suite or a release;
    None: kernel_choice()); reuses the cache where it checks out. siw=False: siw.ko only if
    it was made before (a lab of rxe guests does not wait for its build). testmod: build
    rdmalab_warn.ko (True), only where it was made before (False), or None: also where it
    costs seconds, a kernel of this machine's suite (no build chroot to make)."""
    with cache_lock():
        release, suite = resolve(spec)
        memo = _kernel_memo(release, suite)
        k = _unpack_kernel(release, suite, memo)
        ko: pathlib.Path | None = None
        if _config_has(k.root, release, "CONFIG_RDMA_SIW"):  # Debian built it: use theirs
            ko = module_index(k.moddir)["siw"]
        elif (inputs := _siw_inputs(k, memo, lookup=siw)) is not None and \
                (siw or _complete("siw", release, inputs)):
            ko = _build_siw(k, inputs)
        if testmod is None:
            testmod = suite.split("-")[0] == "bookworm"
        tko: pathlib.Path | None = None
        tinputs = _testmod_inputs(k)
        if testmod or _complete("testmod", release, tinputs):
            tko = _build_testmod(k, tinputs)
        return dataclasses.replace(k, siw_ko=ko, testmod_ko=tko)


_OLD_LAYOUT = ("debs", "kernel-*", "siw-*", "testmod-*", "buildroot-*", "initrd-*")
_noted_old_layout = False


def _note_old_layout() -> None:
    """Once per process, when something is fetched or built: a clone's own .cache/vmlab from
    before the shared cache may still hold the same, which nothing reads any more (ignored,
    never removed here)."""
    global _noted_old_layout
    if _noted_old_layout or STATE.resolve() == CACHE.resolve():
        return
    _noted_old_layout = True
    old = [p.name for pattern in _OLD_LAYOUT for p in sorted(STATE.glob(pattern))]
    if old:
        say(f"note: downloads and builds are cached in {CACHE} now, for every clone; "
            f"{', '.join(old)} in {STATE} are no longer used and may be removed")


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
