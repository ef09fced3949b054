"""Where the VM lab keeps things, and how a cached artifact is trusted again.

Two homes. Artifacts (Debian's packages, the unpacked kernel, siw.ko, the test module, the
build chroots, the initrds) are the same for every clone on the machine, so they live in one
shared cache: $VMLAB_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/rdmalab/vmlab. Run state (run
dirs, up's state dirs with their unix sockets, ssh keys, inventories) belongs to one clone:
<repo>/.cache/vmlab, or $VMLAB_CACHE too when it is set.

An artifact is a folder named by a digest of what it was made from (key()). It is built
from scratch in a temporary sibling, which gets a manifest (every file's size and sha256,
every symlink's target) and then the done marker, and only then is renamed into place: a
folder under its final name is complete or was damaged later. Before reuse, problem()
checks it against its manifest: every size, and the sha256 of the files the lab reads (the
manifest's "verify" list); anything else is built again. Callers hold the cache lock.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import stat
from typing import Callable, Mapping

MANIFEST = ".manifest.json"
DONE = ".done"
TMP = ".tmp-"  # prefix of a folder being built (or left by a builder that died)


def artifact_home(env: Mapping[str, str] = os.environ) -> pathlib.Path:
    """The shared artifact cache: $VMLAB_CACHE, else XDG's cache home (an absolute
    $XDG_CACHE_HOME, else ~/.cache) /rdmalab/vmlab."""
    if env.get("VMLAB_CACHE"):
        return pathlib.Path(env["VMLAB_CACHE"])
    xdg = env.get("XDG_CACHE_HOME", "")
    home = env.get("HOME") or os.path.expanduser("~")
    base = pathlib.Path(xdg) if os.path.isabs(xdg) else pathlib.Path(home) / ".cache"
    return base / "rdmalab" / "vmlab"


def state_home(repo: pathlib.Path, env: Mapping[str, str] = os.environ) -> pathlib.Path:
    """One clone's run state: $VMLAB_CACHE, else <repo>/.cache/vmlab (short: unix sockets
    live under it)."""
    if env.get("VMLAB_CACHE"):
        return pathlib.Path(env["VMLAB_CACHE"])
    return repo / ".cache" / "vmlab"


def key(kind: str, inputs: object) -> str:
    """12 hex digits of sha256 over the artifact's kind and its inputs (JSON, sorted keys):
    the manifest records the same inputs, so a name can be traced to what made it."""
    text = json.dumps([kind, inputs], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def sha256(path: pathlib.Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def manifest(root: pathlib.Path, verify: list[str], inputs: object) -> dict:
    """Every regular file under root (size, sha256) and every symlink (target); verify: the
    relative paths hashed again on every reuse (each must be a regular file here)."""
    files: dict[str, list] = {}
    links: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + dirnames:  # a symlink to a folder is listed in dirnames
            path = pathlib.Path(dirpath, name)
            rel = path.relative_to(root).as_posix()
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                links[rel] = os.readlink(path)
            elif stat.S_ISREG(st.st_mode) and rel not in (MANIFEST, DONE):
                files[rel] = [st.st_size, sha256(path)]
    missing = [v for v in verify if v not in files]
    if missing:
        raise FileNotFoundError(f"{root}: no {', '.join(missing)} to verify")
    return {"inputs": inputs, "files": files, "links": links, "verify": sorted(verify)}


def problem(root: pathlib.Path, m: dict | None = None) -> str | None:
    """Why root cannot be trusted (incomplete, or not what its manifest says), else None.
    m: a manifest kept elsewhere (files merged into a shared tree); else root's own."""
    if m is None:
        if not (root / DONE).exists():
            return "incomplete (no done marker)"
        try:
            m = json.loads((root / MANIFEST).read_text())
        except (OSError, ValueError):
            return f"{MANIFEST} is missing or unreadable"
    try:
        return _differs(root, m)
    except (KeyError, TypeError, ValueError, AttributeError):
        return f"{MANIFEST} is malformed"


def _differs(root: pathlib.Path, m: dict) -> str | None:
    for rel, (size, _) in m["files"].items():
        try:
            st = (root / rel).lstat()
        except FileNotFoundError:
            return f"{rel} is missing"
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            return f"{rel} has {st.st_size} bytes, the manifest says {size}"
    for rel, target in m["links"].items():
        try:
            if os.readlink(root / rel) != target:
                return f"{rel} no longer links to {target}"
        except OSError:
            return f"{rel} (a symlink to {target}) is missing"
    for rel in m["verify"]:
        if sha256(root / rel) != m["files"][rel][1]:
            return f"{rel} does not match its sha256"
    return None


def write_text(path: pathlib.Path, text: str) -> None:
    """Whole or not at all: readers never see half a file."""
    tmp = path.with_name(f"{TMP}{path.name}-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: pathlib.Path, doc: object) -> None:
    write_text(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")


def read_json(path: pathlib.Path) -> dict | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def remove(path: pathlib.Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def build(cache: pathlib.Path, name: str, make: Callable[[pathlib.Path], list[str]],
          inputs: object) -> pathlib.Path:
    """cache/name made from scratch: make(folder) fills a temporary sibling and returns the
    paths to verify on reuse; then the manifest, the done marker, and the rename into place
    (an older copy is moved aside first, then removed). A failure leaves nothing behind."""
    final, tmp = cache / name, cache / f"{TMP}{name}-{os.getpid()}"
    old = cache / f"{TMP}old-{name}-{os.getpid()}"
    remove(tmp)
    tmp.mkdir(parents=True)
    try:
        verify = make(tmp)
        write_json(tmp / MANIFEST, manifest(tmp, verify, inputs))
        (tmp / DONE).write_text(name + "\n")
        if final.exists() or final.is_symlink():
            os.rename(final, old)
        os.rename(tmp, final)
    finally:
        remove(tmp)
        remove(old)
    return final


def remove_leftovers(cache: pathlib.Path) -> list[pathlib.Path]:
    """Temporary folders and files of builders that died. Only called under the cache lock,
    which every builder holds while it builds: any there now is nobody's."""
    gone = sorted(cache.glob(f"{TMP}*")) if cache.is_dir() else []
    for path in gone:
        remove(path)
    return gone
