"""The inventory: real machines listed in a TOML file (docs/inventory.md), read with tomllib.

Every refusal is an InventoryError naming the file, the line and the field, so a user fixes
the file without guessing. tomllib gives no positions for values, so the line of a field is
found by scanning the text: the `[[host]]` block it belongs to, then `key =` inside it.
"""
from __future__ import annotations

import dataclasses
import getpass
import ipaddress
import json
import os
import pathlib
import re
import tomllib
from typing import Any, Iterable, Mapping, Optional

from .machine import WIRE_KINDS, WIRE_NFT_BRIDGE, WIRE_SWITCH, HostFacts

DEFAULT_AGENT_DIR = "/var/tmp/rdmalab-agent"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"

# Allowed keys per table; anything else is an error naming these.
_TOP_KEYS = ("lab", "switch", "host")
_LAB_KEYS = ("known_hosts", "agent_dir")
_SWITCH_KEYS = ("name", "control")
_HOST_KEYS = ("name", "ssh", "device", "port", "gid_index", "netdev", "data_address", "mac",
              "power", "wire")
_SSH_KEYS = ("user", "address", "port", "identity", "host_key_alias")
_POWER_KEYS = ("on", "off", "cycle")
_WIRE_KEYS = ("via", "switch", "bridge")
# The rule of rdmalab.run.inputs.is_secret_name, the one README states (bindings/rdmalab/machines/ imports nothing of the
# engine's package, so it is repeated here; tests/python/test_py_secrets.py checks both agree).
_SECRET_WORDS = ("password", "passwd", "passphrase", "secret", "token")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")   # safe in ssh_config, lock files
_MAC_RE = re.compile(r"([0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}\Z")


class InventoryError(ValueError):
    """A malformed inventory: `file:line: where: field f: what is wrong`."""


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


@dataclasses.dataclass
class SshTarget:
    user: str
    address: str
    port: int = 22
    identity: Optional[str] = None        # absolute path of the private key, or None (agent)
    host_key_alias: Optional[str] = None  # the name the host key is recorded under


@dataclasses.dataclass
class PowerCommands:
    """Shell command lines run on the controller (ipmitool, a PDU); None where absent."""
    on: Optional[str] = None
    off: Optional[str] = None
    cycle: Optional[str] = None


@dataclasses.dataclass
class HostEntry:
    name: str
    ssh: SshTarget
    facts: HostFacts
    power: PowerCommands
    line: int = 0                         # the `[[host]]` line, for messages


@dataclasses.dataclass
class SwitchEntry:
    name: str
    control: str                          # absolute path of the switch's control socket
    line: int = 0


@dataclasses.dataclass
class Inventory:
    path: pathlib.Path
    hosts: list[HostEntry]
    switches: dict[str, SwitchEntry]
    known_hosts: pathlib.Path
    agent_dir: str = DEFAULT_AGENT_DIR

    def host(self, name: str) -> HostEntry:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"{self.path}: no host {name!r} (hosts: "
                       f"{', '.join(h.name for h in self.hosts)})")


# ---------------------------------------------------------------------------------------------
# Finding lines: tomllib keeps no positions.

_HEADER_RE = re.compile(r"\s*(\[\[?)\s*([^\]\[]+?)\s*\]\]?\s*(#.*)?$")


def _key_re(key: str) -> re.Pattern:
    k = re.escape(key)
    return re.compile(rf"\s*(?:{k}|\"{k}\"|'{k}')\s*[=.]")


class _Lines:
    """Line numbers of tables and keys in the inventory's text (1-based)."""

    def __init__(self, text: str):
        self.lines = text.splitlines()
        self.headers: list[tuple[int, str, bool]] = []  # (index, name, is array-of-tables)
        for i, line in enumerate(self.lines):
            m = _HEADER_RE.match(line)
            if m:
                name = re.sub(r"\s*\.\s*", ".", m.group(2)).replace('"', "").replace("'", "")
                self.headers.append((i, name, m.group(1) == "[["))

    def block(self, table: str, index: Optional[int]) -> tuple[int, int]:
        """[start, end) line indexes of `[table]` or of the index-th `[[table]]`, its
        sub-tables included; (0, 0) when absent."""
        seen = -1
        for n, (i, name, _) in enumerate(self.headers):
            if name != table:
                continue
            seen += 1
            if index is not None and seen != index:
                continue
            end = len(self.lines)
            for j, other, _ in self.headers[n + 1:]:
                if not other.startswith(table + "."):
                    end = j
                    break
            return i, end
        return 0, 0

    def find(self, table: str, index: Optional[int], path: tuple[str, ...]) -> int:
        """The line of `path` inside a table (or the closest line that holds it)."""
        start, end = self.block(table, index)
        if end == 0:
            return self._top(path)
        best = start + 1
        lo, hi = start + 1, end
        prefix = table
        for depth, key in enumerate(path):
            prefix += "." + key
            sub = self._sub(prefix, lo, hi)
            if sub is not None:                     # [host.ssh] style
                best, lo, hi = sub[0] + 1, sub[0] + 1, sub[1]
                continue
            hit = self._key(key, lo, hi)
            if hit is None:
                return best
            best = hit + 1
            rest = path[depth + 1:]
            if rest and re.match(rf"\s*[\"']?{re.escape(key)}[\"']?\s*\.", self.lines[hit]):
                dotted = self._dotted((key,) + rest, lo, hi)   # ssh.port = ... style
                return dotted + 1 if dotted is not None else best
            return best                              # an inline table is one line
        return best

    def _top(self, path: tuple[str, ...]) -> int:
        for i, name, _ in self.headers:
            if path and (name == path[0] or name.startswith(path[0] + ".")):
                return i + 1
        end = self.headers[0][0] if self.headers else len(self.lines)
        hit = self._key(path[0], 0, end) if path else None
        return hit + 1 if hit is not None else 1

    def _sub(self, name: str, lo: int, hi: int) -> Optional[tuple[int, int]]:
        for n, (i, h, _) in enumerate(self.headers):
            if lo - 1 <= i < hi and h == name:
                nxt = [j for j, _, _ in self.headers[n + 1:]]
                return i, min(nxt[0] if nxt else len(self.lines), hi)
        return None

    def _key(self, key: str, lo: int, hi: int) -> Optional[int]:
        r = _key_re(key)
        for i in range(lo, hi):
            if r.match(self.lines[i]):
                return i
        return None

    def _dotted(self, path: tuple[str, ...], lo: int, hi: int) -> Optional[int]:
        r = re.compile(r"\s*" + r"\s*\.\s*".join(rf"[\"']?{re.escape(k)}[\"']?" for k in path)
                       + r"\s*=")
        for i in range(lo, hi):
            if r.match(self.lines[i]):
                return i
        return None

    def word(self, word: str) -> int:
        """The first line where `word =` appears as a key anywhere (inline tables too)."""
        r = re.compile(r"(^|[\s{,.]|[\"'])" + re.escape(word) + r"[\"']?\s*=", re.I)
        for i, line in enumerate(self.lines):
            if r.search(line.split("#", 1)[0]):
                return i + 1
        return 1


# ---------------------------------------------------------------------------------------------
# Loading.

def _show(v: Any) -> str:
    if isinstance(v, dict):
        return "a table"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, (str, int, float, bool)):
        return json.dumps(v)
    return repr(v)


class _Loader:
    def __init__(self, path: pathlib.Path, lines: _Lines):
        self.path, self.lines = path, lines
        self.base = path.resolve().parent

    def fail(self, line: int, where: str, msg: str) -> InventoryError:
        return InventoryError(f"{self.path}:{line}: {where}{msg}")

    # where: (table, index, label) of the table a field is in
    def err(self, where: tuple[str, Optional[int], str], field: tuple[str, ...],
            msg: str) -> InventoryError:
        table, index, label = where
        line = self.lines.find(table, index, field)
        return self.fail(line, f"{label}: " if label else "",
                         f"field {'.'.join(field)}: {msg}")

    def keys(self, where, prefix: tuple[str, ...], d: Mapping, allowed: Iterable[str]) -> None:
        bad = [k for k in d if k not in allowed]
        if bad:
            raise self.err(where, prefix + (bad[0],),
                           f"unknown key{'s' if len(bad) > 1 else ''} "
                           f"{', '.join(bad)}; allowed: {', '.join(allowed)}")

    def get(self, where, d: Mapping, field: tuple[str, ...], kind: str,
            default: Any = None, required: bool = False) -> Any:
        v = d.get(field[-1])
        if v is None:
            if required:
                table, index, label = where
                line = self.lines.find(table, index, field[:-1]) if len(field) > 1 else \
                    self.lines.block(table, index)[0] + 1
                raise self.fail(line, f"{label}: " if label else "",
                                f"field {'.'.join(field)}: missing (required)")
            return default
        if kind == "str":
            if not isinstance(v, str) or not v.strip():
                raise self.err(where, field, f"expected a non-empty string, got {_show(v)}")
        elif kind in ("int>=0", "int>=1", "tcp-port"):
            lo, hi = {"int>=0": (0, None), "int>=1": (1, None), "tcp-port": (1, 65535)}[kind]
            ok = isinstance(v, int) and not isinstance(v, bool) and v >= lo \
                and (hi is None or v <= hi)
            if not ok:
                want = f"an integer {lo}..{hi}" if hi else f"an integer >= {lo}"
                raise self.err(where, field, f"expected {want}, got {_show(v)}")
        elif kind == "table":
            if not isinstance(v, dict):
                raise self.err(where, field, f"expected a table ({field[-1]} = {{ ... }}), "
                                             f"got {_show(v)}")
        return v

    def local_path(self, where, field: tuple[str, ...], value: str, must_exist: bool) -> str:
        if "\0" in value:
            raise self.err(where, field, f"expected a path, got {_show(value)}")
        p = pathlib.Path(os.path.expanduser(value))
        p = p if p.is_absolute() else self.base / p
        try:
            there = p.is_file()
        except OSError as e:  # a name too long, a loop of links: no such file either
            raise self.err(where, field, f"file {_show(str(p))}: {e.strerror}") from None
        if must_exist and not there:
            raise self.err(where, field, f"file {p} does not exist")
        return str(p)

    def load(self, data: dict) -> Inventory:
        top = ("", None, "")
        self.keys(top, (), data, _TOP_KEYS)
        for t in ("switch", "host"):
            if t in data and not (isinstance(data[t], list)
                                  and all(isinstance(x, dict) for x in data[t])):
                has_header = any(h == t for _, h, _ in self.lines.headers)
                line = self.lines.block(t, None)[0] + 1 if has_header else self.lines.word(t)
                raise self.fail(line, "", f"field {t}: write [[{t}]] (an array of tables)")
        lab = data.get("lab", {})
        if not isinstance(lab, dict):
            raise self.err(top, ("lab",), "expected a table [lab]")
        lw = ("lab", None, "[lab]")
        self.keys(lw, (), lab, _LAB_KEYS)
        kh = self.get(lw, lab, ("known_hosts",), "str")
        known_hosts = self.local_path(lw, ("known_hosts",), kh, True) if kh else \
            os.path.expanduser(DEFAULT_KNOWN_HOSTS)
        agent_dir = self.get(lw, lab, ("agent_dir",), "str", DEFAULT_AGENT_DIR)
        if not agent_dir.startswith("/"):
            raise self.err(lw, ("agent_dir",), f"expected an absolute path on the hosts, "
                                               f"got {_show(agent_dir)}")

        switches: dict[str, SwitchEntry] = {}
        for i, s in enumerate(data.get("switch", [])):
            line = self.lines.block("switch", i)[0] + 1
            name = s.get("name")
            label = f"switch {json.dumps(name)}" if isinstance(name, str) else f"switch #{i + 1}"
            w = ("switch", i, label)
            self.keys(w, (), s, _SWITCH_KEYS)
            name = self.get(w, s, ("name",), "str", required=True)
            if not _NAME_RE.match(name):
                raise self.err(w, ("name",), f"expected letters, digits, '.', '_', '-', "
                                             f"got {_show(name)}")
            if name in switches:
                raise self.err(w, ("name",), f"duplicate switch name (first on line "
                                             f"{switches[name].line})")
            ctl = self.get(w, s, ("control",), "str", required=True)
            switches[name] = SwitchEntry(name, self.local_path(w, ("control",), ctl, False),
                                         line)

        raw = data.get("host", [])
        if not raw:
            raise self.fail(1, "", "no [[host]] entries")
        names = [h.get("name") for h in raw]
        hosts: list[HostEntry] = []
        for i, h in enumerate(raw):
            hosts.append(self.host(i, h, switches, names))
        seen_name: dict[str, HostEntry] = {}
        # Data addresses are unique per fabric: hosts behind different fault switches are
        # separate networks (two VM labs both use 10.0.0.x).
        seen_addr: dict[tuple, HostEntry] = {}
        for i, h in enumerate(hosts):
            w = ("host", i, f"host {json.dumps(h.name)}")
            if h.name in seen_name:
                raise self.err(w, ("name",), f"duplicate host name (first on line "
                                             f"{seen_name[h.name].line})")
            seen_name[h.name] = h
            a = (h.facts.wire_switch, str(ipaddress.ip_address(h.facts.data_address)))
            if a in seen_addr:
                raise self.err(w, ("data_address",),
                               f"{h.facts.data_address} is also host "
                               f"{json.dumps(seen_addr[a].name)}'s (line {seen_addr[a].line})")
            seen_addr[a] = h
            if h.facts.wire_bridge == h.name:
                raise self.err(w, ("wire", "bridge"), "a host cannot be its own bridge")
        return Inventory(self.path, hosts, switches, pathlib.Path(known_hosts), agent_dir)

    def host(self, i: int, h: dict, switches: Mapping[str, SwitchEntry],
             names: list) -> HostEntry:
        line = self.lines.block("host", i)[0] + 1
        label = f"host {json.dumps(h['name'])}" if isinstance(h.get("name"), str) \
            else f"host #{i + 1}"
        w = ("host", i, label)
        self.keys(w, (), h, _HOST_KEYS)
        name = self.get(w, h, ("name",), "str", required=True)
        if not _NAME_RE.match(name):
            raise self.err(w, ("name",), f"expected letters, digits, '.', '_', '-' "
                                         f"(it names an ssh_config Host), got {_show(name)}")

        ssh = self.get(w, h, ("ssh",), "table", required=True)
        self.keys(w, ("ssh",), ssh, _SSH_KEYS)
        identity = self.get(w, ssh, ("ssh", "identity"), "str")
        target = SshTarget(
            user=self.get(w, ssh, ("ssh", "user"), "str", getpass.getuser()),
            address=self.get(w, ssh, ("ssh", "address"), "str", required=True),
            port=self.get(w, ssh, ("ssh", "port"), "tcp-port", 22),
            identity=self.local_path(w, ("ssh", "identity"), identity, True)
            if identity else None,
            host_key_alias=self.get(w, ssh, ("ssh", "host_key_alias"), "str"))
        for f in ("user", "address", "host_key_alias"):
            v = getattr(target, f)
            if v and (any(c.isspace() for c in v) or v.startswith("-")):
                raise self.err(w, ("ssh", f), f"expected no spaces and no leading '-', "
                                              f"got {_show(v)}")

        data_address = self.get(w, h, ("data_address",), "str", required=True)
        try:
            ipaddress.ip_address(data_address)
        except ValueError:
            raise self.err(w, ("data_address",), f"expected an IPv4 or IPv6 address, "
                                                 f"got {_show(data_address)}") from None
        mac = self.get(w, h, ("mac",), "str", "")
        if mac and not _MAC_RE.match(mac):
            raise self.err(w, ("mac",), f"expected aa:bb:cc:dd:ee:ff, got {_show(mac)}")

        power = PowerCommands()
        pw = self.get(w, h, ("power",), "table", {})
        self.keys(w, ("power",), pw, _POWER_KEYS)
        for f in _POWER_KEYS:
            setattr(power, f, self.get(w, pw, ("power", f), "str"))

        wire = self.get(w, h, ("wire",), "table", {})
        self.keys(w, ("wire",), wire, _WIRE_KEYS)
        via = self.get(w, wire, ("wire", "via"), "str", "none")
        if via not in WIRE_KINDS:
            raise self.err(w, ("wire", "via"), f"expected one of {', '.join(WIRE_KINDS)}, "
                                               f"got {_show(via)}")
        sw = self.get(w, wire, ("wire", "switch"), "str", "")
        br = self.get(w, wire, ("wire", "bridge"), "str", "")
        if via == WIRE_SWITCH:
            if not sw:
                raise self.err(w, ("wire", "switch"), 'missing: via = "switch" needs '
                                                      "switch = <a [[switch]] name>")
            if sw not in switches:
                raise self.err(w, ("wire", "switch"),
                               f"{_show(sw)} names no [[switch]] (switches: "
                               f"{', '.join(switches) or 'none'})")
        elif sw:
            raise self.err(w, ("wire", "switch"), 'only with via = "switch"')
        if via == WIRE_NFT_BRIDGE:
            if not br:
                raise self.err(w, ("wire", "bridge"), 'missing: via = "nft-bridge" needs '
                                                      "bridge = <a [[host]] name>")
            if br not in names:
                raise self.err(w, ("wire", "bridge"),
                               f"{_show(br)} names no [[host]] (hosts: "
                               f"{', '.join(n for n in names if isinstance(n, str))})")
        elif br:
            raise self.err(w, ("wire", "bridge"), 'only with via = "nft-bridge"')

        facts = HostFacts(
            device=self.get(w, h, ("device",), "str", required=True),
            port=self.get(w, h, ("port",), "int>=1", 1),
            gid_index=self.get(w, h, ("gid_index",), "int>=0", 0),
            netdev=self.get(w, h, ("netdev",), "str", required=True),
            data_address=data_address, mac=mac.lower(), wire=via, wire_switch=sw,
            wire_bridge=br)
        if not _NAME_RE.match(facts.device):
            raise self.err(w, ("device",), f"expected a device name like mlx5_0, "
                                           f"got {_show(facts.device)}")
        return HostEntry(name, target, facts, power, line)


def load(path: str | os.PathLike) -> Inventory:
    """Reads and checks an inventory; InventoryError names the file, line and field, never a
    secret's value (nor does any local of a frame the error passes through)."""
    p = pathlib.Path(path)
    data, lines, problem = _read(p)
    if problem is not None:
        raise InventoryError(problem)      # outside any except: nothing chained to it
    return _Loader(p, lines).load(data)


def _read(p: pathlib.Path) -> tuple[Optional[dict], Optional[_Lines], Optional[str]]:
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
    lines = _Lines(text)
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


def _refuse_secret(p: pathlib.Path, lines: _Lines, data: dict, path: tuple) -> str:
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


# ---------------------------------------------------------------------------------------------
# Writing: tomllib has no writer; this schema needs strings, integers, booleans and one level
# of inline tables, so a small writer keeps the controller free of another package.

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
