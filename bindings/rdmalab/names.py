"""Strings for enums and flags: every API that takes an enum takes its spec name ("RC", "RTS",
"QP_FATAL", "WR_FLUSH_ERR") or the _core enum; a wrong name raises ValueError listing the
allowed names, a wrong type raises TypeError."""

from __future__ import annotations

import ipaddress
from typing import Iterable

from . import _core

NS_PER_US = _core.NS_PER_US
NS_PER_MS = _core.NS_PER_MS
NS_PER_SEC = _core.NS_PER_SEC


def us(n: float) -> int:
    return int(n * NS_PER_US)


def ms(n: float) -> int:
    return int(n * NS_PER_MS)


def sec(n: float) -> int:
    return int(n * NS_PER_SEC)


def allowed(enum_type) -> list[str]:
    return list(enum_type.__members__)


# A pybind11 enum builds __members__ anew on each access and finds .name by a scan (several
# microseconds each); scenarios parse and name events in their hot loops, so both are cached
# per enum type (the types are fixed once _core is loaded).
_MEMBERS: dict = {}  # enum type -> {name: member}
_FOLDED: dict = {}   # enum type -> {lower-case name: member}
_NAMES: dict = {}    # enum type -> {member: its first name, as .name gives it}


def _members(enum_type) -> dict:
    members = _MEMBERS.get(enum_type)
    if members is None:
        members = _MEMBERS[enum_type] = dict(enum_type.__members__)
        _FOLDED[enum_type] = {n.lower(): m for n, m in members.items()}
    return members


def parse(enum_type, value, what: str):
    """The enum_type member named by value (exact name, then case-insensitively)."""
    if isinstance(value, enum_type):
        return value
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str or {enum_type.__name__}, "
                        f"got {type(value).__name__} {value!r}")
    members = _members(enum_type)
    if value in members:
        return members[value]
    folded = _FOLDED[enum_type]
    if value.lower() in folded:
        return folded[value.lower()]
    raise ValueError(f"unknown {what} {value!r}; allowed: {', '.join(members)}")


def name(value) -> str:
    """The spec name of a _core enum value."""
    names = _NAMES.get(type(value))
    if names is None:
        if not hasattr(type(value), "__members__"):
            return value.name
        names = {}
        for n, m in type(value).__members__.items():
            names.setdefault(m, n)
        _NAMES[type(value)] = names
    got = names.get(value)
    return got if got is not None else value.name


def parse_flags(table: dict[str, int], value, what: str, prefixes: Iterable[str] = ()) -> int:
    """Flag bits from an int, a name, "A|B", or an iterable of names. Names may carry one of
    the prefixes ("ACCESS_LOCAL_WRITE" and "LOCAL_WRITE" both work)."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, a name or names, got bool")
    if isinstance(value, int):
        unknown = value & ~_all_bits(table)
        if value < 0 or unknown:
            raise ValueError(f"{what} {value:#x} has unknown bits {unknown:#x}; "
                             f"allowed: {', '.join(table)}")
        return value
    if isinstance(value, str):
        parts = [p.strip() for p in value.replace(",", "|").split("|") if p.strip()]
    else:
        try:
            parts = list(value)
        except TypeError:
            raise TypeError(f"{what} must be an int, a name or names, "
                            f"got {type(value).__name__}") from None
    bits = 0
    for part in parts:
        if not isinstance(part, str):
            raise TypeError(f"{what}: names must be str, got {type(part).__name__} {part!r}")
        key = part.upper()
        for prefix in ("IBV_", *prefixes):
            if key not in table and key.startswith(prefix):
                key = key[len(prefix):]
        if key not in table:
            raise ValueError(f"unknown {what} {part!r}; allowed: {', '.join(table)}")
        bits |= table[key]
    return bits


def _all_bits(table: dict[str, int]) -> int:
    bits = 0
    for v in table.values():
        bits |= v
    return bits


def access_flags(value) -> int:
    return parse_flags(_core.ACCESS_FLAGS, value, "access flag", prefixes=("ACCESS_",))


def flag_names(table: dict[str, int], bits: int) -> list[str]:
    return [n for n, v in table.items() if bits & v]


def parse_gid(value) -> _core.Gid:
    """A Gid from a Gid, 16 bytes, or an IPv6-style string ("fe80::1")."""
    if isinstance(value, _core.Gid):
        return value
    gid = _core.Gid()
    if isinstance(value, (bytes, bytearray)):
        gid.raw = bytes(value)
    elif isinstance(value, str):
        try:
            gid.raw = ipaddress.IPv6Address(value).packed
        except ValueError as e:
            raise ValueError(f"bad GID {value!r}: {e}") from None
    else:
        raise TypeError(f"GID must be a Gid, bytes or str, got {type(value).__name__}")
    return gid
