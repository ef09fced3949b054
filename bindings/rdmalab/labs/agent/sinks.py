"""Where an agent lab's wire rules go (rdmalab.faults.wire's sinks): the fault switch on the
path (Switch), or nftables in the sending hosts' output hooks or in the bridge on their path
(Nftables, through NftSink). Each hands back a handle: SwitchRule or NftRule."""

from __future__ import annotations

import io
import os
import select
import threading
import time
from typing import TYPE_CHECKING, Optional

from ...errors import FaultNotSupported
from ...faults import nft
from ...faults.fabric import SwitchControl
from ...faults.wire import expand_cm
from ...machines.machine import end_session

if TYPE_CHECKING:
    from .lab import AgentLab


class SwitchRule:
    """A wire rule in the lab's fault switch: `hits` is the frames it acted on (a watch rule:
    the frames it counted); `remove()` takes it out."""

    _final_hits = 0

    def __init__(self, switch: "Switch", action: str, rule: dict, rule_id: int):
        self.action, self.rule, self.id = action, rule, rule_id
        self._switch = switch

    @property
    def hits(self) -> int:
        for r in self._switch.control().request("rules")["rules"]:
            if r["id"] == self.id:
                return int(r["acted"])
        return self._final_hits

    def remove(self) -> None:
        self._final_hits = self.hits
        self._switch.control().request("remove_rule", id=self.id)

    def __repr__(self) -> str:
        return f"<SwitchRule {self.id} {self.rule}>"


class Switch:
    """The lab's fault switch: connected at the first rule, every action of the rule language;
    its records since then are the lab's (switch_history)."""

    def __init__(self, lab: "AgentLab"):
        self._lab = lab
        self._control: Optional[SwitchControl] = None
        self.rules: list[SwitchRule] = []
        self._records: list[dict] = []  # what the switch said, kept when the lab clears
        self._since = 0  # the switch's history seq at this lab's first rule

    def usable(self) -> bool:
        return not self._lab.switch_unusable()

    def control(self) -> SwitchControl:
        if self._control is None:
            why = self._lab.switch_unusable()
            if why:
                raise FaultNotSupported("switch", why)
            self._control = SwitchControl(self._lab.switch_path())
            self._since = self._history_end()
            self._control.request("hosts", hosts={
                n: {"mac": m.facts.mac, "ip": m.facts.data_address}
                for n, m in ((n, self._lab.machine_of(n)) for n in self._lab.addresses)})
        return self._control

    def _history_end(self) -> int:
        """The end of what earlier labs left in the switch's history."""
        since = 0
        while True:
            page = self._control.request("history", since=since)
            if not page["records"]:
                return since
            since = page["last_seq"]

    def refusal(self, spec: dict) -> Optional[str]:
        return None  # the rule language is the switch's

    def add(self, spec: dict) -> SwitchRule:
        action = spec["action"]
        rid = self.control().request("add_rule", rule=spec)["id"]
        handle = SwitchRule(self, action, spec, rid)
        self.rules.append(handle)
        self._lab.record("wire_rule", object="switch", fault=action, rule=spec, id=rid)
        return handle

    def history(self) -> list[dict]:
        """The switch's records (every rule action) since this lab's first switch rule."""
        if self._control is None:
            return list(self._records)
        return self._control.request("history", since=self._since)["records"]

    def _await_releases(self, deadline_s: float = 5.0) -> list[dict]:
        """The switch's records once every delayed or held frame has its release record (at
        most deadline_s: a longer delay is recorded as still pending)."""
        end = time.monotonic() + deadline_s
        while True:
            records = self.history()
            held = {r.get("seq") for r in records if r.get("action") in ("delay", "reorder")}
            released = {r.get("of_seq") for r in records if r.get("action") == "release"}
            if held <= released:
                return records
            if time.monotonic() > end:
                self._lab.record("switch_holds_pending", object="switch",
                                 seqs=sorted(held - released))
                return records
            time.sleep(0.02)

    def clear(self) -> None:
        if self._control is not None:
            self._control.request("clear")  # no new holds; frames held already still go
            # Kept for the lab's history, with the release of every frame it held back.
            self._records = self._await_releases()
            self._control.close()
            self._control = None
        self.rules.clear()


class NftRule:
    """A wire rule installed as nftables rules (rdmalab.faults.nft): in the sending hosts' output
    hooks or in the bridge on their path. `hits` is what their counters saw; `remove()` takes
    them out."""

    def __init__(self, tables: "Nftables", action: str, fields: dict, installed: dict):
        self.action, self.fields = action, fields
        # place key (a host name, or "bridge:<machine>") -> (machine, nft place, handle)
        self._tables, self._installed = tables, installed

    @property
    def hits(self) -> int:
        return sum(nft.rule_packets(self._tables.listing(machine, key, place), handle)
                   for key, (machine, place, handle) in self._installed.items())

    def remove(self) -> None:
        for key, (machine, place, handle) in list(self._installed.items()):
            self._tables.run(machine, key, nft.delete_rule_command(handle, place))
            del self._installed[key]

    def __repr__(self) -> str:
        return f"<NftRule {self.action} {self.fields} on {sorted(self._installed)}>"


class NftSink:
    """nftables at one place kind ("host" or "bridge") as a sink: it drops or counts packets,
    by match keys only (rdmalab.faults.nft names what it cannot express)."""

    def __init__(self, tables: "Nftables", where: str):
        self._tables, self._where = tables, where

    def refusal(self, spec: dict) -> Optional[str]:
        action = spec.get("action")
        if action not in ("drop", "watch"):
            return f"nftables can drop or count packets: {action} needs the fault switch"
        if "count" in spec:
            return "nftables counts bytes, not packets: count= needs the fault switch"
        if "every" in spec or "probability" in spec:
            return "nftables counts bytes: every=/probability= need the fault switch"
        return None

    def add(self, spec: dict) -> NftRule:
        action = spec["action"]
        fields = {k: v for k, v in spec.items() if k != "action"}
        return self._tables.install(action, "drop" if action == "drop" else "accept", fields,
                                    self._where)


class Nftables:
    """The nftables rules of one agent lab: the table made once per place, one lister per place
    reading counters without a process each (Lister), the rules installed."""

    def __init__(self, lab: "AgentLab"):
        self._lab = lab
        self.rules: list[NftRule] = []
        self._ready: dict = {}  # place key -> (machine, nft place) with the table made
        self._listers: dict = {}  # place key -> Lister

    @staticmethod
    def run(machine, key: str, cmd: str) -> str:
        return machine.run(cmd, 30, root=True).check(f"{key}: {cmd}").out

    def listing(self, machine, key: str, place) -> str:
        """`nft -j list chain` of place on machine: from the place's Lister, or (its first
        read, or the lister gone) the one-shot command, which names any error."""
        lister = self._listers.get(key)
        if lister is None:
            lister = self._listers[key] = Lister(machine)
            return self.run(machine, key, nft.list_command(place))
        return lister.read(place) or self.run(machine, key, nft.list_command(place))

    def close_listers(self, keys=None) -> None:
        for key in list(self._listers if keys is None else keys):
            lister = self._listers.pop(key, None)
            if lister is not None:
                lister.close()

    def _place(self, host: str, where: str):
        """(key, machine, nft place) where host's packets meet a rule: its own output hook
        (where == "host"), or the bridge machine on its path (where == "bridge")."""
        m = self._lab.machine_of(host)
        if where == "bridge":
            bridge = m.bridge_machine
            if bridge is None:
                raise FaultNotSupported("wire", f"{host} ({m.name}): no nftables bridge on "
                                        "its path")
            return f"bridge:{bridge.name}", bridge, nft.BRIDGE
        return host, m, nft.HOST

    def _transport(self) -> str:
        """How nftables finds RDMA in the hosts' traffic: TCP (iWARP) or UDP 4791 (RoCEv2)."""
        name = next(iter(self._lab.addresses))
        return "iwarp" if self._lab.host(name).caps().transport == "iWARP" else "roce"

    def install(self, fault: str, verdict: str, fields: dict, where: str) -> NftRule:
        fields = expand_cm(fields)
        src = fields.get("src_host")
        hosts = [src] if src is not None else list(self._lab.addresses)
        for host in hosts:
            why = self._lab.nftables_unusable(host)
            if why:
                raise FaultNotSupported(fault, why)
        places = {}
        for host in hosts:  # a bridge carries every host's packets: one rule there
            key, machine, place = self._place(host, where)
            places.setdefault(key, (machine, place))
        netdev = self._lab.machine_of(hosts[0]).facts.netdev if where == "host" else None
        macs = {n: self._lab.machine_of(n).facts.mac for n in self._lab.addresses}
        installed, expr = {}, ""
        for key, (machine, place) in places.items():
            expr = nft.match_expr(fields, self._lab.addresses, self._transport(), netdev, place,
                                  macs)
            if key not in self._ready:
                self.run(machine, key, nft.setup_commands(place))
                self._ready[key] = (machine, place)
            out = self.run(machine, key,
                           nft.add_rule_command(expr, verdict, f"rdmalab {fault}", place))
            handle = nft.parse_handle(out)
            if handle is None:
                raise RuntimeError(f"{key}: nft printed no rule handle: {out!r}")
            installed[key] = (machine, place, handle)
        rule = NftRule(self, fault, fields, installed)
        self.rules.append(rule)
        self._lab.record("wire_rule", object="nft", fault=fault, fields=fields, expr=expr,
                         hosts=sorted(installed), place=where)
        return rule

    def forget_host(self, name: str) -> None:
        """A rebooted host has no rules and no table."""
        self._ready.pop(name, None)
        self.close_listers([name])
        self.rules = [r for r in self.rules if name not in r._installed]

    def clear(self, lost) -> None:
        """Every table removed (but on lost hosts: restarted before their next lab)."""
        self.close_listers()
        for key, (machine, place) in list(self._ready.items()):
            if key not in lost:
                self.run(machine, key, nft.delete_table_command(place))
        self._ready.clear()
        self.rules.clear()


class Lister:
    """One `nft -j -i` kept running on a machine: each listing is a line on its stdin and one
    JSON line back, with no process started per read. A read in a TCG guest otherwise starts
    a shell and nft (about 300 ms of its CPU each; a scenario that samples a counter every
    50 ms kept a guest's two vCPUs busy). Whatever is not that line (nft's error, the process
    gone, no answer within the deadline) ends the lister: read() returns None and the caller
    runs the one-shot command instead, which reports the error."""

    def __init__(self, machine, deadline_s: float = 10.0) -> None:
        self._proc = machine.popen("nft -j -i", root=True, stdin=True)
        self._deadline_s = deadline_s
        self._buf = b""
        self._lock = threading.Lock()  # one question and its answer at a time

    def read(self, place) -> Optional[str]:
        with self._lock:
            return self._read(place)

    def _read(self, place) -> Optional[str]:
        proc = self._proc
        if proc is None:
            return None
        try:
            line = nft.list_line(place)
            proc.stdin.write(line.encode() if not _text(proc) else line)
            proc.stdin.flush()
            fd, end = proc.stdout.fileno(), time.monotonic() + self._deadline_s
            while b"\n" not in self._buf:
                left = end - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    raise TimeoutError
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise EOFError
                self._buf += chunk
        except (OSError, EOFError, TimeoutError, ValueError):
            self.close()
            return None
        got, self._buf = self._buf.split(b"\n", 1)
        text = got.decode(errors="replace")
        if not text.startswith('{"nftables"'):
            self.close()
            return None
        return text

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            end_session(proc, 5.0)  # nft -i ends at EOF


def _text(proc) -> bool:
    """Whether proc's pipes are text (LocalMachine.popen) or bytes (the SSH machines)."""
    return isinstance(proc.stdin, io.TextIOBase)
