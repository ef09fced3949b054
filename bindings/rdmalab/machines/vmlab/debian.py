"""Debian's archive, as the VM lab reads it: which kernel --kernel names (a suite's current
linux-image-amd64, or a release found in one of the suites), the packages that kernel is made
of with the version and SHA256 apt's index gives each (read once per release and kept in the
cache), and their .debs fetched into the cache and checked against those records before use.
Nothing is installed into the host: `apt-get download` only, with a private configuration for
every suite but this machine's own."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import time

from . import cache, kernel
from .kernel import STEP_TIMEOUT_S, KernelError

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


def apt_options(suite: str) -> list[str]:
    """apt-get/apt-cache options for suite: none for the machine's own (bookworm), else a
    private sources list, lists and cache folder (updated on first use)."""
    if suite == "bookworm":
        return []
    d = kernel.CACHE / "apt" / suite
    opts = ["-o", f"Dir::Etc::sourcelist={d / 'sources.list'}", "-o", "Dir::Etc::sourceparts=-",
            "-o", f"Dir::State::Lists={d / 'lists'}", "-o", f"Dir::Cache={d / 'cache'}",
            "-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root"]
    if not (d / ".updated").exists():
        (d / "lists" / "partial").mkdir(parents=True, exist_ok=True)
        (d / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
        (d / "sources.list").write_text(f"deb {MIRROR} {suite} main\n")
        kernel.say(f"reading Debian {suite}'s package lists ({MIRROR}), once")
        kernel.run(["apt-get", *opts, "-q", "update"], what=f"apt-get update of {suite}")
        (d / ".updated").write_text(time.strftime("%Y-%m-%d %H:%M:%S\n"))
    return opts


def depends(pkg: str, opts: list[str]) -> list[str]:
    """pkg's direct Depends (first of each alternative group only)."""
    out = kernel.run(["apt-cache", *opts, "depends", pkg])
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
    memo = kernel.CACHE / "apt" / f"{suite}.release"
    if memo.exists() and RELEASE.fullmatch(release := memo.read_text().strip()):
        return release
    for dep in depends("linux-image-amd64", apt_options(suite)):
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
    memo = cache.read_json(memo_path(spec))  # prepared before: no need to ask apt
    if memo is not None and memo.get("suite") in SUITES:
        return spec, memo["suite"]
    for suite in SUITES:
        if _has_package(f"linux-image-{spec}", apt_options(suite)):
            return spec, suite
    raise KernelError(f"--kernel {spec}: no linux-image-{spec} in Debian's "
                      f"{', '.join(SUITES)} ({MIRROR})")


def memo_path(release: str) -> pathlib.Path:
    return kernel.CACHE / "apt" / f"kernel-{release}.json"


def valid_record(rec: object) -> bool:
    return isinstance(rec, dict) and all(isinstance(rec.get(f), str) and rec[f] for f in
                                         ("package", "version", "architecture", "sha256"))


def index_records(pkgs: list[str], opts: list[str]) -> list[dict]:
    """Each package's candidate in apt's index (apt-cache show, one call for all): package,
    version, architecture and the SHA256 a download of it must have."""
    out = kernel.run(["apt-cache", *opts, "show", "--no-all-versions", *pkgs],
                     what=f"apt-cache show {len(pkgs)} packages")
    found: dict[str, dict] = {}
    for stanza in out.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines()
                      if ": " in line and not line[:1].isspace())
        rec = {"package": fields.get("Package"), "version": fields.get("Version"),
               "architecture": fields.get("Architecture"), "sha256": fields.get("SHA256")}
        if valid_record(rec):
            found.setdefault(rec["package"], rec)
    missing = [p for p in pkgs if p not in found]
    if missing:
        raise KernelError(f"apt-cache show names no version and SHA256 for {', '.join(missing)}")
    return [found[p] for p in pkgs]


def kernel_memo(release: str, suite: str) -> dict:
    """The kernel's packages as apt's index gives them (index_records), found once per
    release and kept in CACHE/apt/kernel-<release>.json: the input of every key built from
    them, and what a cached .deb is checked against (finding them costs apt ten seconds)."""
    path = memo_path(release)
    memo = cache.read_json(path)
    if memo is not None and memo.get("suite") == suite and isinstance(memo.get("packages"), list) \
            and memo["packages"] and all(map(valid_record, memo["packages"])):
        return memo
    opts = apt_options(suite)
    kernel.say(f"reading the {release} kernel's packages from {suite}'s index, once")
    pkgs = closure(f"linux-image-{release}", release, opts)
    pkgs += [p for p in closure(f"linux-headers-{release}", release, opts) if p not in pkgs]
    memo = {"suite": suite, "packages": index_records(pkgs, opts)}
    path.parent.mkdir(parents=True, exist_ok=True)
    cache.write_json(path, memo)
    return memo


def records_named(names: list[str], release: str, suite: str) -> list[dict]:
    """Index records of names: the kernel's memo where it has them, else apt's index."""
    known = {r["package"]: r for r in kernel_memo(release, suite)["packages"]}
    missing = [n for n in names if n not in known]
    if missing:
        known.update((r["package"], r) for r in index_records(missing, apt_options(suite)))
    return [known[n] for n in names]


def _deb_path(rec: dict) -> pathlib.Path:
    """Where apt-get download puts it: name_version_arch.deb, an epoch's colon quoted."""
    version = rec["version"].replace(":", "%3a")
    return kernel.CACHE / "debs" / f"{rec['package']}_{version}_{rec['architecture']}.deb"


def fetch(records: list[dict], suite: str) -> list[pathlib.Path]:
    """The .debs of records in CACHE/debs, each checked against its index SHA256 before it
    is used: one that differs (cut short, changed) is removed and fetched again."""
    debs = []
    for rec in records:
        deb = _deb_path(rec)
        if deb.exists() and cache.sha256(deb) != rec["sha256"]:
            kernel.say(f"{deb} is not the {rec['version']} that {suite}'s index describes "
                       "(its sha256 differs): fetching it again")
            deb.unlink()
        if not deb.exists():
            _download(rec, deb, suite)
        debs.append(deb)
    return debs


def _download(rec: dict, deb: pathlib.Path, suite: str) -> None:
    """apt-get download of that exact version (apt checks the file against its index), then
    the same check here, so that a record and a file that disagree are never used."""
    spec = f"{rec['package']}={rec['version']}"
    kernel.note_old_layout()
    kernel.say(f"fetching {spec} from {suite}")
    deb.parent.mkdir(parents=True, exist_ok=True)
    kernel.run(["apt-get", *apt_options(suite), "download", "-q", spec], cwd=deb.parent,
               what=f"fetching {spec} from {suite}")
    if not deb.exists():
        raise KernelError(f"apt-get download {spec} left no {deb}")
    if cache.sha256(deb) != rec["sha256"]:
        deb.unlink()
        raise KernelError(f"apt-get download {spec}: not the sha256 {rec['sha256']} recorded "
                          f"from {suite}'s index in {kernel.CACHE / 'apt'}/kernel-<release>.json "
                          "(remove it to read the index again)")


def closure(start: str, release: str, opts: list[str]) -> list[str]:
    """start and the kernel packages it depends on: linux-(image|binary|modules|base|headers|
    kbuild)-* that name this release or its ABI (Debian 13 splits the image into binary,
    modules and base; 6.1's headers name their kbuild by major only)."""
    flavour = release.split("-")[-1]
    abi = release.removesuffix(f"-{flavour}")
    series = major(abi)
    keep = re.compile(r"linux-(image|binary|modules|base|headers|kbuild)-")
    seen, queue = [start], [start]
    while queue:
        for dep in depends(queue.pop(0), opts):
            if dep in seen or not keep.match(dep) or "unsigned" in dep:
                continue
            if dep.startswith("linux-image-") and not start.startswith("linux-image-"):
                continue  # the headers' dependency on an image: fetched by itself
            if abi in dep or dep == f"linux-kbuild-{series}":
                seen.append(dep)
                queue.append(dep)
    return seen


def major(release: str) -> str:
    """6.1 of 6.1.0-56-amd64: what linux-source and 6.1's linux-kbuild are named by."""
    return ".".join(release.split(".")[:2])
