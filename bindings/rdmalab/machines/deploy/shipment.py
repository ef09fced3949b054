"""What the controller ships to a host: the package's Python files and data, its built engine
(debug info stripped) and the engine's sources, as one tarball per version. The version is a
hash of the package and of the sources, not of the built .so: a host that rebuilt the engine
from the same sources runs the same version."""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sysconfig
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

from .common import DeployError

PACKAGE = "bindings/rdmalab"
VERSION_FILE = "DEPLOYED_VERSION"  # in <path>/rdmalab/, read by the agent's boot (hostcode.BOOT)

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


def tarball(b: Bundle) -> Path:
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

