"""Writing an inventory: tomllib has no writer; this schema needs strings, integers, booleans
and one level of inline tables, so a small writer keeps the controller free of another
package."""
from __future__ import annotations

import os
import re
from typing import Any, Iterable, Mapping, Optional


def _toml_str(s: str) -> str:
    out = []
    for c in s:
        if c in '"\\':
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _toml_str(k)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (str, os.PathLike)):
        return _toml_str(os.fspath(v))
    if isinstance(v, Mapping):
        items = [f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items() if x is not None]
        return "{ " + ", ".join(items) + " }" if items else "{}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML: {v!r}")


def _table(header: str, d: Mapping[str, Any]) -> str:
    lines = [header] + [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in d.items()
                        if v is not None]
    return "\n".join(lines) + "\n"


def dumps(hosts: Iterable[Mapping[str, Any]],
          switches: Iterable[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]] = (),
          lab: Optional[Mapping[str, Any]] = None) -> str:
    """An inventory's TOML text from plain dicts shaped like the file (`ssh`, `power`, `wire`
    as dicts); switches as a list of {name, control} or a {name: {control}} mapping."""
    if isinstance(switches, Mapping):
        switches = [{"name": n, **dict(s)} for n, s in switches.items()]
    parts = []
    if lab:
        parts.append(_table("[lab]", lab))
    parts += [_table("[[switch]]", s) for s in switches]
    parts += [_table("[[host]]", h) for h in hosts]
    return "\n".join(parts)
