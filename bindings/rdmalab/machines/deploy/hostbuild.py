"""The engine built on a host, where the controller's does not load there (another Python,
another libstdc++ or rdma-core soname): from the shipped source, against the host's own
libibverbs and librdmacm. A missing build dependency is an error naming it and its Debian
package, found before anything is built."""
from __future__ import annotations

import json
import shlex
import time
from typing import Any, Callable

from ..machine import Machine
from .common import DeployError, Log, ok, py
from .hostcode import FIT_CHECK, fit_failure
from .shipment import Bundle

BUILD_TIMEOUT_S = 3600.0           # a 2-core host builds the engine in minutes; a slow one more
# Options a host build passes. The controller's -O2 (RelWithDebInfo) without -g: -O3 trips
# GCC 12's false -Wrestrict under -Werror, and debug info would fill a guest's tmpfs.
# RDMALAB_TESTS=OFF / RDMALAB_WERROR=OFF take effect once CMakeLists.txt has those options (no
# GoogleTest needed; another compiler's new warnings must not fail a host build); until then
# CMake only warns that they are unused.
BUILD_OPTIONS = ("-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                 "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -DNDEBUG", "-DRDMALAB_PYTHON=ON",
                 "-DRDMALAB_TESTS=OFF", "-DRDMALAB_WERROR=OFF")


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


def check_build_deps(machine: Machine, b: Bundle, why: str) -> None:
    cmake_text = "\n".join((b.repo / s).read_text(errors="replace") for s in b.sources
                           if s.endswith("CMakeLists.txt"))
    needed = [list(req[:4]) for req in REQUIREMENTS if req[4](cmake_text)]
    out = ok(machine, py(DEP_CHECK, json.dumps(needed)),
              "checking the engine's build dependencies")
    missing = json.loads(out.strip().splitlines()[-1])
    if missing:
        what = "; ".join(f"{m[0]} (Debian: {m[1]})" for m in missing)
        pkgs = " ".join(dict.fromkeys(m[1] for m in missing))
        raise DeployError(f"{machine.name}: the controller's engine does not load there ({why}) "
                          f"and building it needs what the host lacks: {what}. "
                          f"Install them: apt-get install {pkgs}")


def build_on_host(machine: Machine, b: Bundle, v: str, why: str, log: Log) -> None:
    """Builds the engine in the version directory v (why: why the controller's does not fit)
    and checks that it loads; READY once it does."""
    q = shlex.quote
    check_build_deps(machine, b, why)
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
    r = machine.run(py(FIT_CHECK, v) + f" && touch {q(v)}/READY", timeout=120)
    if r.rc != 0 or r.timed_out:
        fit_failure(machine, r, v, after_build=True)
