"""The agent shipped to each host: the controller's own rdmalab package and engine.

A host runs the agent (rdmalab.agent.serve) from `<agent_dir>/<version>/`, where version is a hash of
the package's Python files and of the engine's sources. The controller installs it there when
the host has none, or another version:

    installed = ensure_agent(machine, repo)          # one round trip when already there
    channel = open_agent_channel(gateway, installed.path, installed.version, machine.name)
    # ... rpyc.connect_stream(ExecnetStream(channel), ...) as rdmalab.agent.remote does

The controller's built engine (rdmalab/_core*.so, debug info stripped) is tried first; where it
does not load on the host (another Python, another libstdc++ or rdma-core soname) the engine is
built there from the shipped source, against the host's own libibverbs and librdmacm. A missing
build dependency is an error naming it and its Debian package, found before anything is built.
A version directory counts only once its READY file exists: a copy or a build that stopped
half-way is redone, never used.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sysconfig
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from .machine import Machine

AGENT_DIR = "/var/tmp/rdmalab-agent"
PYTHON = "/usr/bin/python3"   # Debian's: the one that sees python3-rpyc (see README)
PACKAGE = "bindings/rdmalab"
VERSION_FILE = "DEPLOYED_VERSION"  # in <path>/rdmalab/, read by remote_boot_snippet's code
BUILD_TIMEOUT_S = 3600.0           # a 2-core host builds the engine in minutes; a slow one more
# Options a host build passes. The controller's -O2 (RelWithDebInfo) without -g: -O3 trips
# GCC 12's false -Wrestrict under -Werror, and debug info would fill a guest's tmpfs.
# RDMALAB_TESTS=OFF / RDMALAB_WERROR=OFF take effect once CMakeLists.txt has those options (no
# GoogleTest needed; another compiler's new warnings must not fail a host build); until then
# CMake only warns that they are unused.
BUILD_OPTIONS = ("-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                 "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -DNDEBUG", "-DRDMALAB_PYTHON=ON",
                 "-DRDMALAB_TESTS=OFF", "-DRDMALAB_WERROR=OFF")

Log = Callable[[str], None]


class DeployError(RuntimeError):
    """The agent could not be installed or started on a host: the message names the host and
    what to do."""


# -- the bundle ---------------------------------------------------------------------------------

# Read once, at import: sysconfig's first read is not thread-safe (CPython gh-92452), and
# an agent pool starts its hosts' agents side by side.
_EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or ".so"


def _ext_suffix() -> str:
    return _EXT_SUFFIX


@dataclasses.dataclass(frozen=True)
class Bundle:
    """What the controller ships: paths relative to repo."""
    repo: Path
    package: tuple[str, ...]   # bindings/rdmalab/*.py, *.toml
    engine: str                # bindings/rdmalab/_core<EXT_SUFFIX>, the controller's build
    sources: tuple[str, ...]   # what `cmake --build --target _core` reads
    version: str               # sha256[:16] over package + sources (not the .so: see _hash)
    engine_sha256: str
    platform: str              # EXT_SUFFIX without dot and .so: cpython-311-x86_64-linux-gnu

    def manifest(self) -> dict[str, Any]:
        return {"version": self.version, "platform": self.platform,
                "engine": Path(self.engine).name, "engine_sha256": self.engine_sha256,
                "files": len(self.package), "sources": len(self.sources)}

    def write(self, dest: Path) -> Path:
        """Writes the bundle as dest/<version>.tar.gz (package, stripped engine, manifest,
        src.tar.gz) and returns its path."""
        out = dest / f"{self.version}.tar.gz"
        with tempfile.TemporaryDirectory(prefix="rdmalab-bundle-") as tmp:
            engine = _stripped(self.repo / self.engine, Path(tmp))
            with tarfile.open(out, "w:gz", compresslevel=6) as tar:
                for rel in self.package:
                    tar.add(self.repo / rel, str(Path(rel).relative_to(Path(PACKAGE).parent)))
                tar.add(engine, f"rdmalab/{Path(self.engine).name}")
                _add_bytes(tar, f"rdmalab/{VERSION_FILE}", self.version.encode() + b"\n")
                _add_bytes(tar, "manifest.json", json.dumps(self.manifest(), indent=1).encode())
                _add_bytes(tar, "src.tar.gz", self._source_tarball())
        return out

    def _source_tarball(self) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
            for rel in self.sources:
                tar.add(self.repo / rel, rel)
        return buf.getvalue()


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
    tar.addfile(info, io.BytesIO(data))


def _stripped(so: Path, tmp: Path) -> Path:
    """A copy of the engine without debug info (RelWithDebInfo's is mostly DWARF; guests have a
    256 MB tmpfs). Without binutils the engine goes as it is."""
    tool = shutil.which("objcopy")
    if tool is None:
        return so
    out = tmp / so.name
    r = subprocess.run([tool, "--strip-debug", str(so), str(out)], capture_output=True)
    return out if r.returncode == 0 else so  # not an ELF objcopy reads: the host check says


def _engine_dirs(repo: Path) -> list[str]:
    """The directories the top-level CMakeLists.txt adds (core, faults, bindings, ...)."""
    text = (repo / "CMakeLists.txt").read_text()
    return re.findall(r"^\s*add_subdirectory\(\s*([\w./-]+)", text, re.M)


_SKIP_DIRS = {"__pycache__", ".git", "build"}
_SKIP_SUFFIXES = (".so", ".o", ".a", ".pyc")


def _engine_includes(repo: Path) -> list[str]:
    """The project's own CMake files the top-level CMakeLists.txt includes (cmake/unity.cmake)."""
    text = (repo / "CMakeLists.txt").read_text()
    return [f for f in re.findall(r"^\s*include\(\s*([\w./-]+\.cmake)\s*\)", text, re.M)
            if (repo / f).is_file()]


def _engine_sources(repo: Path) -> list[str]:
    files = ["CMakeLists.txt"] + _engine_includes(repo)
    package = (repo / PACKAGE).resolve()
    for d in _engine_dirs(repo):
        for root, dirs, names in os.walk(repo / d):
            # The Python package ships on its own; its built .so is not a source.
            dirs[:] = sorted(x for x in dirs if x not in _SKIP_DIRS and not x.startswith(".")
                             and (Path(root) / x).resolve() != package)
            files += [str((Path(root) / n).relative_to(repo)) for n in names
                      if not n.startswith(".") and not n.endswith(_SKIP_SUFFIXES)]
    return sorted(files)


def _hash(repo: Path, files: list[str]) -> str:
    # Names and contents of the sources, not the built .so: a host that rebuilt the engine from
    # the same sources runs the same version.
    h = hashlib.sha256()
    for rel in sorted(files):
        data = (repo / rel).read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:16]


PACKAGE_FILES = ("*.py", "*.toml")  # in every room of the package (rglob)


def bundle(repo: Path) -> Bundle:
    """The controller's package and engine, ready to ship. DeployError if the engine is not
    built."""
    repo = Path(repo).resolve()
    pkg = repo / PACKAGE
    engine = pkg / f"_core{_ext_suffix()}"
    if not engine.is_file():
        found = sorted(p.name for p in pkg.glob("_core*.so"))
        raise DeployError(f"no engine {engine} for this Python"
                          + (f" (found {', '.join(found)})" if found else "")
                          + ": build it first: make build")
    # The modules and their data (findings/findings.toml: the registry the package reads).
    package = sorted(str(p.relative_to(repo)) for pattern in PACKAGE_FILES
                     for p in pkg.rglob(pattern) if "__pycache__" not in p.parts)
    sources = _engine_sources(repo)
    return Bundle(repo=repo, package=tuple(package), engine=str(engine.relative_to(repo)),
                  sources=tuple(sources), version=_hash(repo, package + sources),
                  engine_sha256=hashlib.sha256(engine.read_bytes()).hexdigest(),
                  platform=_ext_suffix().strip(".").removesuffix(".so"))


# One tarball per version and engine per controller process: hosts of one lab share it.
_TARBALLS: dict[tuple[str, str], Path] = {}
_TARBALL_LOCK = threading.Lock()
_TARBALL_DIR: Optional[tempfile.TemporaryDirectory] = None


def _tarball(b: Bundle) -> Path:
    global _TARBALL_DIR
    with _TARBALL_LOCK:
        key = (b.version, b.engine_sha256)
        path = _TARBALLS.get(key)
        if path is None or not path.exists():
            if _TARBALL_DIR is None:  # removed when the process exits
                _TARBALL_DIR = tempfile.TemporaryDirectory(prefix="rdmalab-deploy-")
            sub = Path(_TARBALL_DIR.name) / b.engine_sha256[:16]
            sub.mkdir(exist_ok=True)
            path = _TARBALLS[key] = b.write(sub)
        return path


# -- what runs on the host ----------------------------------------------------------------------

UNPACK_FAILED = 20
PREPARE_FAILED = 21
INSTALLED = "RDMALAB-AGENT-INSTALLED"  # the probe's word for "there, and it loads"
# Does the deployed package load with this interpreter? Exit 0: yes; 3: the engine does not fit
# (absent for this Python, or its ImportError: bad ELF, undefined symbol, missing soname);
# 5: a runtime dependency of the agent is missing; anything else: the package itself is broken.
FIT_CHECK = r"""
import os, sys, sysconfig
d = sys.argv[1]
so = os.path.join(d, "rdmalab", "_core" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
if not os.path.exists(so):
    print("no engine for this Python (%s, %s)" % (sys.version.split()[0], os.path.basename(so)))
    sys.exit(3)
sys.path.insert(0, d)
try:
    import rdmalab
    import rdmalab._core  # the package's face loads the engine lazily: load it here
except ImportError as e:
    if e.path == so or e.name == "rdmalab._core":
        print("engine does not load: %s" % e)
        sys.exit(3)
    raise
if not rdmalab.__file__.startswith(d + os.sep):
    sys.exit("rdmalab was imported from %s, not %s" % (rdmalab.__file__, d))
try:
    import rpyc  # the agent's protocol over the execnet channel
except ImportError:
    print("python3-rpyc: the agent serves the controller over RPyC")
    sys.exit(5)
"""

# What a host build needs: (what, Debian package, kind, argument, needed-if over the text of
# the shipped CMakeLists.txt files). Kinds: cmd (any of the names on PATH, >= version),
# file (any glob), pc (pkg-config module, else a header), cmake (a CMake package config),
# py (the interpreter: >= version, Python.h).
def _always(cmake: str) -> bool:
    return True


def _uses(word: str) -> Callable[[str], bool]:
    return lambda cmake: word in cmake


REQUIREMENTS: tuple[tuple[str, str, str, Any, Callable[[str], bool]], ...] = (
    ("cmake >= 3.25", "cmake", "cmd", (["cmake"], "3.25"), _always),
    ("g++ >= 10 (C++20)", "g++", "cmd", (["g++"], "10"), _always),
    ("ninja or make", "ninja-build", "cmd", (["ninja", "make"], ""), _always),
    ("pkg-config", "pkg-config", "cmd", (["pkg-config"], ""), _uses("PkgConfig")),
    ("libibverbs (infiniband/verbs.h)", "libibverbs-dev", "pc",
     ("libibverbs", "infiniband/verbs.h"), _uses("libibverbs")),
    ("librdmacm (rdma/rdma_cma.h)", "librdmacm-dev", "pc",
     ("librdmacm", "rdma/rdma_cma.h"), _uses("librdmacm")),
    ("nlohmann_json", "nlohmann-json3-dev", "cmake", "nlohmann_json", _uses("nlohmann_json")),
    ("prometheus-cpp", "prometheus-cpp-dev", "cmake", "prometheus-cpp", _uses("prometheus-cpp")),
    ("libcurl (curl/curl.h)", "libcurl4-openssl-dev", "file",
     ["/usr/include/curl/curl.h", "/usr/include/*/curl/curl.h", "/usr/local/include/curl/curl.h"],
     _uses("find_package(CURL")),
    ("pybind11 >= 2.10", "pybind11-dev", "cmake", "pybind11", _uses("pybind11")),
    ("python3 >= 3.11 with Python.h", "python3-dev", "py", "3.11", _uses("Development")),
    # Only while CMakeLists.txt requires GoogleTest for every build (no RDMALAB_TESTS option).
    ("GoogleTest (gtest/gtest.h)", "libgtest-dev", "file",
     ["/usr/include/gtest/gtest.h", "/usr/local/include/gtest/gtest.h"],
     lambda cmake: "find_package(GTest REQUIRED" in cmake and "RDMALAB_TESTS" not in cmake),
)

# Prints one JSON list: the requirements (as given in argv[1]) that the host lacks.
DEP_CHECK = r"""
import glob, json, os, re, shutil, subprocess, sys, sysconfig
def ver(s):
    return tuple(int(x) for x in re.findall(r"\d+", s)[:3])
def run(argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
def cmd(arg):
    names, least = arg
    for n in names:
        p = shutil.which(n)
        if p and not least:
            return True
        if p:
            r = run([p, "-dumpfullversion"] if n.endswith("++") else [p, "--version"])
            if r and r.returncode == 0 and ver(r.stdout) >= ver(least):
                return True
    return False
def pc(arg):
    module, header = arg
    if shutil.which("pkg-config"):
        r = run(["pkg-config", "--exists", module])
        return bool(r) and r.returncode == 0
    return any(os.path.exists(p + "/" + header) for p in ("/usr/include", "/usr/local/include"))
CMAKE_DIRS = ["/usr/lib/cmake", "/usr/lib/*/cmake", "/usr/share/cmake", "/usr/local/lib/cmake",
              "/usr/local/lib/*/cmake", "/usr/local/share/cmake", "/usr/lib64/cmake"]
def cmake(name):
    for d in CMAKE_DIRS:
        for pat in ("%s/%s*/%sConfig.cmake", "%s/%s*/%s-config.cmake"):
            if glob.glob(pat % (d, name, name)):
                return True
    if name == "pybind11":  # python3-pybind11 alone: the build passes its cmake dir
        r = run([sys.executable, "-m", "pybind11", "--cmakedir"])
        return bool(r) and r.returncode == 0
    return False
def py(least):
    inc = sysconfig.get_paths().get("include", "")
    return sys.version_info[:2] >= ver(least)[:2] and os.path.exists(inc + "/Python.h")
def file(pats):
    return any(glob.glob(p) for p in pats)
KINDS = {"cmd": cmd, "pc": pc, "cmake": cmake, "py": py, "file": file}
print(json.dumps([r for r in json.loads(sys.argv[1]) if not KINDS[r[2]](r[3])]))
"""

# Builds the engine in <version>/build from src.tar.gz, log in <version>/build.log; on success
# puts the module beside the package and drops the build tree (guests' tmpfs is small).
# Arguments: the version directory, then CMake options.
BUILD = r"""
cd "$1" || exit 9
shift
rm -rf build src && mkdir build src || exit 9
(
  set -e
  tar -xzf src.tar.gz -C src
  gen="Unix Makefiles"; command -v ninja >/dev/null && gen=Ninja
  pyb=""
  if d=$(/usr/bin/python3 -m pybind11 --cmakedir 2>/dev/null); then pyb="-Dpybind11_DIR=$d"; fi
  # Jobs: the cores, but ~1.5 GB of memory each (pybind11 translation units are big).
  jobs=$(nproc); mem=$(awk '/MemAvailable/ {print int($2 / 1500000)}' /proc/meminfo)
  mem=${mem:-$jobs}; [ "$mem" -lt "$jobs" ] && jobs=$mem; [ "$jobs" -lt 1 ] && jobs=1
  echo "rdmalab: building the engine on $(hostname) with $jobs jobs ($gen)"
  cmake -S src -B build -G "$gen" "$@" $pyb -DPython_EXECUTABLE=/usr/bin/python3
  cmake --build build --target _core -j "$jobs"
) > build.log 2>&1 || exit 10
so=$(find src/bindings -name '_core*.so' | head -n 1)
[ -n "$so" ] || { echo "the build made no _core*.so" >> build.log; exit 10; }
rm -f rdmalab/_core*.so
objcopy --strip-debug "$so" "rdmalab/$(basename "$so")" 2>/dev/null || cp "$so" rdmalab/
rm -rf build src
"""


def _py(script: str, *args: str) -> str:
    # The interpreter CMake builds for (CMakeLists.txt names /usr/bin/python3). -I: the host's
    # PYTHONPATH and user site must not decide what loads; cd /: nor the cwd.
    return " ".join(["cd / &&", PYTHON, "-I", "-c", shlex.quote(script),
                     *map(shlex.quote, args)])


@dataclasses.dataclass(frozen=True)
class Installed:
    path: str             # put this on sys.path: it holds rdmalab/
    version: str
    built_on_host: bool   # the engine was built there (the controller's did not fit)
    copied: bool = False  # this call installed it (False: it was there already)


def ensure_agent(machine: Machine, repo: Path, agent_dir: str = AGENT_DIR,
                 log: Log = print, loaded_before: str = "",
                 trust_installed: bool = False) -> Installed:
    """The controller's agent on the host, installed if missing: one round trip when the host
    has it already. loaded_before: a version whose copy (the controller's engine, not one built
    there) an agent already ran from on this host, e.g. before a reboot emptied its tmpfs: when
    it is this bundle's, a new copy is checked for its files only, not imported (seconds on a
    TCG guest); the agent's own start imports it (open_agent_channel says if that fails).
    trust_installed: an install already there (its READY says it loaded, or was built, when it
    was made) is found by its files, not imported: the caller starts the agent from it and,
    where that fails (the host's libraries changed since), calls again without trust."""
    b = bundle(repo)
    v = f"{agent_dir}/{b.version}"
    q = shlex.quote
    tmp = f"{v}.tmp"
    prepare = f"mkdir -p {q(agent_dir)} && rm -rf {q(tmp)} {q(v)} && mkdir {q(tmp)}"
    # One round trip either way (each is seconds to a TCG guest): the install is there and
    # loads, or the directory is made ready for a copy (after a guest's reboot its tmpfs has
    # nothing). A host build leaves build.log beside READY; a copy does not.
    t0 = time.monotonic()
    # An install of a version an agent ran from here already (a reboot that kept agent_dir) is
    # checked for its files, not imported: the agent's own start imports it.
    fits = (f"test -f {q(v)}/rdmalab/{q(Path(b.engine).name)}"
            if trust_installed or loaded_before == b.version else _py(FIT_CHECK, v))
    probe = machine.run(f"if test -f {q(v)}/READY && {fits}; then "
                        f"{{ test -f {q(v)}/build.log && echo BUILT-ON-HOST; echo {INSTALLED}; }}"
                        f"; else {prepare} || exit {PREPARE_FAILED}; fi", timeout=60)
    if probe.rc == 0 and not probe.timed_out and INSTALLED in probe.out.split():
        return Installed(v, b.version, built_on_host="BUILT-ON-HOST" in probe.out, copied=False)
    if probe.timed_out or probe.rc != 0:  # a probe that hung, or the directory not made
        _ok(machine, prepare, "prepare the agent directory")

    tarball = _tarball(b)
    try:
        machine.copy_to(str(tarball), f"{tmp}/bundle.tar.gz", timeout=600)
    except Exception as e:
        raise DeployError(f"{machine.name}: copying the rdmalab agent to {tmp} failed: {e}") from e
    # Unpacked under .tmp and renamed whole; READY only once the engine loads (or, for a
    # version that loaded here before, once it is there).
    check = (f"test -f {q(v)}/rdmalab/{q(Path(b.engine).name)} || "
             f"{{ echo 'no engine {Path(b.engine).name} in the copy'; exit 3; }}"
             if loaded_before == b.version else _py(FIT_CHECK, v))
    r = machine.run(f"{{ cd {q(tmp)} && tar -xzf bundle.tar.gz && rm bundle.tar.gz && "
                    f"mv {q(tmp)} {q(v)}; }} || exit {UNPACK_FAILED}; " + check
                    + f" && touch {q(v)}/READY", timeout=300)
    log(f"{machine.name}: rdmalab agent {b.version} copied to {v} "
        f"({tarball.stat().st_size / 1e6:.1f} MB, {time.monotonic() - t0:.1f} s)")
    if r.rc == 0 and not r.timed_out:
        return Installed(v, b.version, built_on_host=False, copied=True)
    _fit_failure(machine, r, v, after_build=False)
    why = (r.out or r.err).strip()
    log(f"{machine.name}: the controller's engine ({b.platform}) does not load there "
        f"({why}); building it on the host")
    _check_build_deps(machine, b, why)
    t0 = time.monotonic()
    r = machine.run(f"/bin/sh -c {q(BUILD)} build {q(v)} " + " ".join(map(q, BUILD_OPTIONS)),
                    timeout=BUILD_TIMEOUT_S)
    if r.rc != 0 or r.timed_out:
        # The first errors (a compiler's, CMake's) and the end, not 40 lines of progress.
        log_ = f"{q(v)}/build.log"
        tail = machine.run(f"grep -E -m 12 'error:|CMake Error|Could NOT|not found' {log_}; "
                           f"echo ...; tail -n 8 {log_}", timeout=30).out
        why = f"timed out after {BUILD_TIMEOUT_S:.0f} s" if r.timed_out else f"rc {r.rc}"
        raise DeployError(f"{machine.name}: building the rdmalab engine failed ({why}); "
                          f"log {v}/build.log, its end:\n{tail}{r.err[-500:]}")
    log(f"{machine.name}: engine built on the host in {time.monotonic() - t0:.0f} s")
    r = machine.run(_py(FIT_CHECK, v) + f" && touch {q(v)}/READY", timeout=120)
    if r.rc != 0 or r.timed_out:
        _fit_failure(machine, r, v, after_build=True)
    return Installed(v, b.version, built_on_host=True, copied=True)


def _ok(machine: Machine, cmd: str, what: str, timeout: float = 120) -> str:
    r = machine.run(cmd, timeout=timeout)
    if r.rc != 0 or r.timed_out:
        raise DeployError(f"{machine.name}: {what} failed (rc {r.rc}): {(r.err or r.out)[-1000:]}")
    return r.out


def _fit_failure(machine: Machine, r, v: str, after_build: bool) -> None:
    """Raises unless the check said only "the engine does not fit" (rc 3) before a build."""
    text = (r.out + r.err).strip()[-1500:]
    if r.rc == 3 and not after_build:
        return
    if r.timed_out:
        raise DeployError(f"{machine.name}: unpacking or loading the agent at {v} timed out")
    if r.rc == UNPACK_FAILED:
        raise DeployError(f"{machine.name}: unpacking the agent into {v} failed "
                          f"(disk full? tar missing?): {text}")
    if r.rc == 3:
        raise DeployError(f"{machine.name}: the engine built on the host does not load: {text}")
    if r.rc == 5:
        raise DeployError(f"{machine.name}: the agent needs {text.splitlines()[-1]}; "
                          f"install it there: apt-get install python3-rpyc")
    raise DeployError(f"{machine.name}: the rdmalab package at {v} does not import with "
                      f"the host's {PYTHON} (rc {r.rc}):\n{text}")


def _check_build_deps(machine: Machine, b: Bundle, why: str) -> None:
    cmake_text = "\n".join((b.repo / s).read_text(errors="replace") for s in b.sources
                           if s.endswith("CMakeLists.txt"))
    needed = [list(req[:4]) for req in REQUIREMENTS if req[4](cmake_text)]
    out = _ok(machine, _py(DEP_CHECK, json.dumps(needed)),
              "checking the engine's build dependencies")
    missing = json.loads(out.strip().splitlines()[-1])
    if missing:
        what = "; ".join(f"{m[0]} (Debian: {m[1]})" for m in missing)
        pkgs = " ".join(dict.fromkeys(m[1] for m in missing))
        raise DeployError(f"{machine.name}: the controller's engine does not load there ({why}) "
                          f"and building it needs what the host lacks: {what}. "
                          f"Install them: apt-get install {pkgs}")


# -- starting the agent from the deployed path --------------------------------------------------

def check_version(remote_version: str, expected: str, host: str) -> None:
    if remote_version != expected:
        raise DeployError(
            f"host {host} runs rdmalab agent {remote_version or '(none)'}, the controller is "
            f"{expected}: redeploy with rdmalab.machines.deploy.ensure_agent(machine, repo) (it installs "
            f"{expected} beside the other) and start the agent from its path")


# execnet's remote_exec body (`channel` in scope). Its first message is a hello the controller
# checks ({"version", "error"}); RPyC's bytes follow only when it is right.
_BOOT = r"""
def _rdmalab_boot(channel, path, expected):
    import os, socket, sys
    here = socket.gethostname()
    try:
        with open(os.path.join(path, "rdmalab", "DEPLOYED_VERSION")) as f:
            found = f.read().strip()
    except OSError as e:
        channel.send({"version": "", "error": "%s: no rdmalab agent deployed at %s (%s)"
                      % (here, path, e)})
        return
    if found != expected:
        channel.send({"version": found, "error": "%s runs rdmalab agent %s, the controller is "
                      "%s: redeploy" % (here, found, expected)})
        return
    sys.path.insert(0, path)
    import rdmalab
    if not rdmalab.__file__.startswith(path + os.sep):
        channel.send({"version": found, "error": "%s: rdmalab was imported from %s before the "
                      "agent at %s" % (here, rdmalab.__file__, path)})
        return
    from rdmalab.agent.serve import serve
    channel.send({"version": found, "error": ""})
    serve(channel)
_rdmalab_boot(channel, __PATH__, __VERSION__)
"""


def remote_boot_snippet(path: str, version: str) -> str:
    """The source to remote_exec on a host's gateway: starts the agent deployed at path if it
    is `version`, else sends why not."""
    return _BOOT.replace("__PATH__", repr(path)).replace("__VERSION__", repr(version))


def open_agent_channel(gateway, path: str, version: str, host: str, timeout: float = 120.0):
    """Starts the agent at path on the gateway's host and checks its version: the channel,
    ready for RPyC (rdmalab.agent.remote.ExecnetStream). DeployError on a mismatch or a failed start."""
    import execnet
    channel = gateway.remote_exec(remote_boot_snippet(path, version))
    try:
        hello = channel.receive(timeout)
    except channel.TimeoutError:
        raise DeployError(f"{host}: the rdmalab agent at {path} did not start within "
                          f"{timeout:.0f} s") from None
    except (EOFError, execnet.RemoteError, OSError) as e:
        raise DeployError(f"{host}: the rdmalab agent at {path} failed to start: {e}") from e
    if not isinstance(hello, dict):
        raise DeployError(f"{host}: the agent at {path} did not say its version ({hello!r:.80})")
    found, error = hello.get("version", ""), hello.get("error", "")
    if not found and error:  # nothing deployed there (or unreadable): say what was tried
        raise DeployError(f"host {host}: {error}: deploy it with "
                          f"rdmalab.machines.deploy.ensure_agent(machine, repo)")
    check_version(found, version, host)
    if error:
        raise DeployError(f"host {host}: {error}")
    return channel
