"""The secrets rule: a field whose name says it holds a secret is refused, and its value never
shown. The file is read here (tomllib) so that every such value is replaced by WITHHELD the
moment it is parsed: no later frame, message or traceback's locals ever hold it."""
from __future__ import annotations

import json
import pathlib
import re
import tomllib
from typing import Any, Optional

from .lines import Lines

# The rule README states; its one home (rdmalab.run.inputs.is_secret_name asks this module, and
# tests/python/test_py_secrets.py checks both agree).
_SECRET_WORDS = ("password", "passwd", "passphrase", "secret", "token")


def is_secret_name(name: str) -> bool:
    """A field whose name says it holds a secret (password, passwd, passphrase, pass, secret,
    token, and names holding one of them): refused, its value never shown."""
    low = str(name).lower()
    return low == "pass" or any(w in low for w in _SECRET_WORDS)


class _Withheld:
    """What a secret-named value becomes the moment the file is parsed."""

    def __repr__(self) -> str:
        return "<withheld>"


WITHHELD = _Withheld()


def read(p: pathlib.Path) -> tuple[Optional[dict], Optional[Lines], Optional[str]]:
    """(data, lines, None), or (None, None, why the file is refused). The file's text lives in
    this frame only, and every secret-named value is replaced by WITHHELD as soon as it is
    parsed: a file with a secret is refused from here, so no later frame, no message and no
    traceback's locals ever hold the value."""
    try:
        text = p.read_text()
    except OSError as e:
        return None, None, f"{p}: cannot read the inventory: {e.strerror}"
    problem = None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        # tomllib's message ends "(at line L, column C)": name the file in front.
        m = re.search(r"\(at line (\d+), column (\d+)\)", str(e))
        where = f"{p}:{m.group(1)}:{m.group(2)}" if m else str(p)
        msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(e)) if m else str(e)
        problem = f"{where}: TOML syntax: {msg}"
    if problem is not None:
        return None, None, problem
    found = _withhold(data, ())
    lines = Lines(text)
    del text
    if found:
        return None, None, _refuse_secret(p, lines, data, found[0])
    return data, lines, None


def _withhold(value: Any, trail: tuple) -> list[tuple]:
    """Replaces, in place, every value whose key is secret-named by WITHHELD; the key paths
    (keys and array indexes) in file order."""
    found: list[tuple] = []
    if isinstance(value, dict):
        for k in list(value):
            if is_secret_name(k):
                value[k] = WITHHELD
                found.append(trail + (k,))
            else:
                found += _withhold(value[k], trail + (k,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += _withhold(item, trail + (i,))
    return found


def _refuse_secret(p: pathlib.Path, lines: Lines, data: dict, path: tuple) -> str:
    """`file:line: host "x": field ssh.password: ...` for the secret at path (no value)."""
    head = path[0]
    if head in ("host", "switch") and len(path) > 2 and isinstance(path[1], int):
        item = data[head][path[1]]
        name = item.get("name") if isinstance(item, dict) else None
        label = f"{head} {json.dumps(name)}" if isinstance(name, str) \
            else f"{head} #{path[1] + 1}"
        table, index, field = head, path[1], path[2:]
    elif head == "lab" and len(path) > 1:
        label, table, index, field = "[lab]", "lab", None, path[1:]
    else:
        label, table, index, field = "", "", None, path
    keys = tuple(str(k) for k in field if not isinstance(k, int))
    line = lines.find(table, index, keys) if table else lines.word(keys[-1])
    return (f"{p}:{line}: {label + ': ' if label else ''}field {'.'.join(keys)}: secrets are "
            "refused in an inventory, and never shown (a field named like a password, "
            "passphrase, secret or token); log in with an identity file (ssh.identity) or "
            "an SSH agent, and give a power command its password through the environment "
            "(ipmitool -E)")
