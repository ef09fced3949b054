"""The inventory's schema and its checks: the records a file becomes (Inventory, HostEntry,
SwitchEntry, SshTarget, PowerCommands) and the loader that checks every field. Every refusal is
an InventoryError naming the file, the line and the field, so a user fixes the file without
guessing."""
from __future__ import annotations

import dataclasses
import getpass
import ipaddress
import json
import os
import pathlib
import re
from typing import Any, Iterable, Mapping, Optional

from ..deploy.common import AGENT_DIR as DEFAULT_AGENT_DIR
from ..machine import WIRE_KINDS, WIRE_NFT_BRIDGE, WIRE_SWITCH, HostFacts
from .lines import Lines
from .secret_rule import read

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
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")   # safe in ssh_config, lock files
_MAC_RE = re.compile(r"([0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}\Z")


class InventoryError(ValueError):
    """A malformed inventory: `file:line: where: field f: what is wrong`."""


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



def _show(v: Any) -> str:
    if isinstance(v, dict):
        return "a table"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, (str, int, float, bool)):
        return json.dumps(v)
    return repr(v)


class _Loader:
    def __init__(self, path: pathlib.Path, lines: Lines):
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
        switches = self.switches(data.get("switch", []))
        raw = data.get("host", [])
        if not raw:
            raise self.fail(1, "", "no [[host]] entries")
        names = [h.get("name") for h in raw]
        hosts = [self.host(i, h, switches, names) for i, h in enumerate(raw)]
        self.unique(hosts)
        return Inventory(self.path, hosts, switches, pathlib.Path(known_hosts), agent_dir)

    def switches(self, raw: list) -> dict[str, SwitchEntry]:
        switches: dict[str, SwitchEntry] = {}
        for i, s in enumerate(raw):
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
        return switches

    def unique(self, hosts: list[HostEntry]) -> None:
        """Names once in the file; data addresses once per fabric: hosts behind different
        fault switches are separate networks (two VM labs both use 10.0.0.x)."""
        seen_name: dict[str, HostEntry] = {}
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
        target = self.ssh(w, h)
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
        via, sw, br = self.wire(w, h, switches, names)
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

    def ssh(self, w, h: dict) -> SshTarget:
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
        return target

    def wire(self, w, h: dict, switches: Mapping[str, SwitchEntry],
             names: list) -> tuple[str, str, str]:
        """(via, switch, bridge) of a host's wire table, each checked against the others."""
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
        return via, sw, br


def load(path: str | os.PathLike) -> Inventory:
    """Reads and checks an inventory; InventoryError names the file, line and field, never a
    secret's value (nor does any local of a frame the error passes through)."""
    p = pathlib.Path(path)
    data, lines, problem = read(p)
    if problem is not None:
        raise InventoryError(problem)      # outside any except: nothing chained to it
    return _Loader(p, lines).load(data)
