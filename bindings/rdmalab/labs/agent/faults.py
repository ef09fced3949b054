"""AgentFaults: the faults an agent lab applies to real hosts (wire rules, links, devices,
reboots)."""

from __future__ import annotations

import errno
import json
import time
from typing import TYPE_CHECKING, Optional

from ...errors import FaultNotSupported, Hung
from ...errors import make_error as _make_error
from ...faults.frontend import NoFaults, _host_name
from .common import SOFT_DEVICES, device_label
from .wire import NftRule, SwitchRule

if TYPE_CHECKING:
    from .lab import AgentLab


class AgentFaults(NoFaults):
    """The faults an agent lab applies: wire rules in the fault switch on the path (drop,
    delay, duplicate, reorder, corrupt, watch) or as nftables rules in the sending hosts
    (software providers send through the host's stack); link down/up of a host's data NIC;
    removal and re-adding of a soft device; reboots by power cycle. What a host cannot have
    (no switch on its path, no power commands) raises FaultNotSupported naming it."""

    def __init__(self, lab: "AgentLab"):
        super().__init__(lab)
        self._counts: dict[str, int] = {}
        self._down: set[str] = set()
        self._rules: list[NftRule] = []
        self._nft_ready: dict = {}  # place key -> (machine, nft place) with the table made
        self._listers: dict = {}  # place key -> nft.Lister (counters read without a process)
        self._removed: dict = {}  # host -> (device, the background `rdma link delete`)
        self._control = None  # SwitchControl, connected at the first switch rule
        self._switch_rules: list[SwitchRule] = []
        self._switch_records: list[dict] = []
        self._since = 0  # the switch's history seq at this lab's first rule

    # -- wire rules (nftables in the guests, or in the bridge between them)
    @staticmethod
    def _nft_on(machine, key: str, cmd: str) -> str:
        return machine.run(cmd, 30, root=True).check(f"{key}: {cmd}").out

    def _nft_list(self, machine, key: str, place) -> str:
        """`nft -j list chain` of place on machine: from the place's Lister, or (its first
        read, or the lister gone) the one-shot command, which names any error."""
        from ...faults import nft
        lister = self._listers.get(key)
        if lister is None:
            lister = self._listers[key] = nft.Lister(machine)
            return self._nft_on(machine, key, nft.list_command(place))
        return lister.read(place) or self._nft_on(machine, key, nft.list_command(place))

    def _close_listers(self, keys=None) -> None:
        for key in list(self._listers if keys is None else keys):
            lister = self._listers.pop(key, None)
            if lister is not None:
                lister.close()

    def _nft_place(self, host: str, where: str):
        """(key, machine, nft place) where host's packets meet a rule: its own output hook
        (where == "host"), or the bridge machine on its path (where == "bridge")."""
        from ...faults import nft
        m = self._lab.machine_of(host)
        if where == "bridge":
            bridge = getattr(m, "bridge_machine", None)
            if bridge is None:
                raise FaultNotSupported("wire", f"{host} ({m.name}): no nftables bridge on "
                                        "its path")
            return f"bridge:{bridge.name}", bridge, nft.BRIDGE
        return host, m, nft.HOST

    def _transport(self) -> str:
        """How nftables finds RDMA in the hosts' traffic: TCP (iWARP) or UDP 4791 (RoCEv2)."""
        name = next(iter(self._lab.addresses))
        return "iwarp" if self._lab.host(name).caps().transport == "iWARP" else "roce"

    def _wire_rule(self, fault: str, verdict: str, match, count, fields: dict,
                   where: str = "host") -> NftRule:
        from ...faults import nft
        from ...faults.frontend import expand_cm
        if match is not None:
            raise FaultNotSupported(fault, "a Python predicate cannot run in nftables: give "
                                    "the fields (cm=, opcode=, dest_qpn=, ...)")
        if count is not None:
            raise FaultNotSupported(fault, "nftables counts bytes, not packets: count= needs "
                                    "the fault switch")
        fields = expand_cm(fields)
        src = fields.get("src_host")
        hosts = [src] if src is not None else list(self._lab.addresses)
        for host in hosts:
            why = self._lab.nftables_unusable(host)
            if why:
                raise FaultNotSupported(fault, why)
        places = {}
        for host in hosts:  # a bridge carries every host's packets: one rule there
            key, machine, place = self._nft_place(host, where)
            places.setdefault(key, (machine, place))
        netdev = self._lab.machine_of(hosts[0]).facts.netdev if where == "host" else None
        macs = {n: self._lab.machine_of(n).facts.mac for n in self._lab.addresses}
        installed = {}
        expr = ""
        for key, (machine, place) in places.items():
            expr = nft.match_expr(fields, self._lab.addresses, self._transport(), netdev, place,
                                  macs)
            if key not in self._nft_ready:
                self._nft_on(machine, key, nft.setup_commands(place))
                self._nft_ready[key] = (machine, place)
            out = self._nft_on(machine, key,
                               nft.add_rule_command(expr, verdict, f"rdmalab {fault}", place))
            handle = nft.parse_handle(out)
            if handle is None:
                raise RuntimeError(f"{key}: nft printed no rule handle: {out!r}")
            installed[key] = (machine, place, handle)
        rule = NftRule(self, fault, fields, installed)
        self._rules.append(rule)
        self._lab.record("fault", object="nft", fault=fault, fields=fields, expr=expr,
                         hosts=sorted(installed), place=where)
        return rule

    # -- devices
    def device_fatal(self, host) -> None:
        """Removes the host's RDMA device, as a driver unload or a fatal firmware error would:
        rdma_link_delete; the device comes back when the lab shuts down, after its contexts
        are closed (or earlier with rdma_link_add)."""
        self.rdma_link_delete(host, fault="device_fatal")

    def rdma_link_delete(self, host, *, fault: str = "rdma_link_delete") -> None:
        """`rdma link delete` of the host's soft device. The command may block while user
        contexts stay open (a provider without disassociate_ucontext), so it runs in the
        background; rdma_link_add (or the lab's shutdown) waits for it."""
        name = _host_name(host)
        if name in self._removed:
            raise _make_error("rdma link delete", errno.EBUSY, f"{name}: its device is already being removed")
        m = self._lab.machine_of(name)
        dev = m.facts.device
        if device_label(dev) not in SOFT_DEVICES:
            raise FaultNotSupported(fault, f"{name}: {dev} is not a soft device: `rdma link "
                                    "add` could not bring it back (rxe and siw only)")
        self._removed[name] = (dev, m.popen(f"rdma link delete {dev}", root=True))
        self._counts[fault] = self._counts.get(fault, 0) + 1
        self._lab.record("fault", object="device", host=name, fault=fault,
                         command=f"rdma link delete {dev}")

    def rdma_link_add(self, host, deadline_s: float = 30.0) -> None:
        """`rdma link add` of the device rdma_link_delete removed, once the removal has
        finished (Hung if it is still blocked after deadline_s: a context is still open);
        returns when the port is ACTIVE and usable."""
        name = _host_name(host)
        if name not in self._removed:
            raise _make_error("rdma link add", errno.ENODEV, f"{name}: no device of it was deleted")
        self._restore(name, deadline_s, hung=True)
        self._counts["rdma_link_add"] = self._counts.get("rdma_link_add", 0) + 1

    def note_removals(self) -> None:
        """Records, before the lab's contexts close, whether each removal still blocks."""
        for name, (dev, proc) in self._removed.items():
            self._lab.record("device_removal_state", object="device", host=name, device=dev,
                             blocked=proc.poll() is None)

    def restore_devices(self, deadline_s: float = 30.0) -> None:
        """After the lab's contexts are closed: waits for each removal, adds the device back
        and waits for its port. A removal still blocked marks the host for a reboot."""
        for name in list(self._removed):
            self._restore(name, deadline_s, hung=False)

    def _restore(self, name: str, deadline_s: float, hung: bool) -> None:
        import subprocess as sp
        dev, proc = self._removed[name]
        try:
            out, _ = proc.communicate(timeout=deadline_s)
        except sp.TimeoutExpired:
            if hung:  # the scenario still holds a context: say so, keep waiting at shutdown
                raise Hung(f"{name}: rdma link delete {dev}", f"rdma link delete {dev} on "
                           f"{name} still blocks after {deadline_s} s: a user context on it "
                           "is still open") from None
            del self._removed[name]
            proc.kill()
            self._lab.agent_for(name).broken = f"rdma link delete {dev} still blocked"
            return
        del self._removed[name]
        self._lab.record("device_removed", object="device", host=name, rc=proc.returncode,
                         output=out.decode(errors="replace")[-500:])
        m = self._lab.machine_of(name)
        self._link_add(name, m, dev)
        self._lab.record("device_added", object="device", host=name, device=dev)
        self._wait_usable(name, m)

    @staticmethod
    def _link_add(name: str, m, dev: str) -> None:
        """`rdma link add` of soft device dev on m's netdev, as it was before its removal."""
        m.run(f"rdma link add {dev} type {device_label(dev)} netdev {m.facts.netdev}", 30,
              root=True).check(f"{name}: rdma link add {dev}")

    # -- hosts
    def reboot(self, host, down_ns: int) -> None:
        """Power the host off (a qemu guest: SIGKILL of qemu, a crash: nothing is closed,
        nothing sent; an inventory host: its power commands), wait down_ns, power it on (a
        guest on the same switch port, MAC and address), and start a fresh agent and lab
        there. Returns once the host is back: its earlier objects are gone."""
        name = _host_name(host)
        self._lab.reboot_host(name, down_ns)
        self._nft_ready.pop(name, None)  # the rebooted guest has no rules
        self._close_listers([name])
        self._rules = [r for r in self._rules if name not in r._installed]
        self._counts["reboot"] = self._counts.get("reboot", 0) + 1

    # -- wire rules in the fault switch
    def _switch(self):
        from ...faults.fabric import SwitchControl
        if self._control is None:
            path = self._lab.switch_unusable()
            if path.startswith("!"):
                raise FaultNotSupported("switch", path[1:])
            self._control = SwitchControl(path)
            since = 0  # the end of what earlier labs left in the switch's history
            while True:
                page = self._control.request("history", since=since)
                if not page["records"]:
                    break
                since = page["last_seq"]
            self._since = since
            self._control.request("hosts", hosts={
                n: {"mac": m.facts.mac, "ip": m.facts.data_address}
                for n, m in ((n, self._lab.machine_of(n)) for n in self._lab.addresses)})
        return self._control

    def _switch_rule(self, action: str, match, fields: dict, **params) -> SwitchRule:
        if match is not None:
            raise FaultNotSupported(action, "a Python predicate cannot run in the switch: give "
                                    "the fields (cm=, opcode=, dest_qpn=, tcp_flags=, ...)")
        rule = {"action": action, **{k: v for k, v in fields.items() if v is not None},
                **{k: v for k, v in params.items() if v is not None}}
        rid = self._switch().request("add_rule", rule=rule)["id"]
        handle = SwitchRule(self, action, rule, rid)
        self._switch_rules.append(handle)
        self._lab.record("fault", object="switch", fault=action, rule=rule, id=rid)
        return handle

    def rule(self, spec: dict) -> SwitchRule:
        """A wire rule given as the fault switch's JSON object ({"action": "drop", "cm":
        "DREP", ...}), sent to the switch as is: the model's lab.faults.rule takes the same
        dict. A bad rule raises ValueError naming the key, checked here by the switch's own
        parser (the model's add_rule gives the same message)."""
        if not isinstance(spec, dict):
            raise TypeError(f"rule: a dict (the switch's JSON rule object), got {spec!r}")
        from ... import _core
        _core.check_wire_rule(json.dumps(spec))
        fields = {k: v for k, v in spec.items() if k != "action"}
        return self._switch_rule(spec["action"], None, fields)

    def _where(self, at: Optional[str]) -> str:
        """switch | bridge | host. Default: the fault switch where the path has one, else the
        nftables bridge on the path (the netns lab's), else the sending hosts' nftables."""
        if at is None:
            if not self._lab.switch_unusable().startswith("!"):
                return "switch"
            machines = [self._lab.machine_of(h) for h in self._lab.addresses]
            if all(getattr(m, "bridge_machine", None) is not None for m in machines):
                return "bridge"
            return "host"
        if at not in ("switch", "bridge", "host"):
            raise ValueError(f"at={at!r}: 'switch' (the fault switch), 'bridge' (nftables in "
                             "the bridge on the path) or 'host' (nftables in the sending host)")
        return at

    def drop(self, match=None, *, count=None, every=None, probability=None,
             at: Optional[str] = None, **fields):
        """Drops matching packets: in the fault switch (default where there is one), in the
        nftables bridge on the path (the netns lab's default), or with at="host" where they
        leave the sending host (nftables; all hosts unless src_host=)."""
        where = self._where(at)
        if where != "switch":
            if every is not None or probability is not None:
                raise FaultNotSupported("drop", "nftables counts bytes: every=/probability= "
                                        "need the fault switch")
            rule = self._wire_rule("drop", "drop", match, count, fields, where)
            self._counts["drop"] = self._counts.get("drop", 0)  # read from the counters
            return rule
        return self._switch_rule("drop", match, fields, count=count, every=every,
                                 probability=probability)

    def watch(self, match=None, *, at: Optional[str] = None, **fields):
        """Counts matching packets without touching them (rule.hits)."""
        where = self._where(at)
        if where != "switch":
            return self._wire_rule("watch", "accept", match, None, fields, where)
        return self._switch_rule("watch", match, fields)

    def delay(self, match=None, *, delay_ns: int, count=None, every=None, probability=None,
              **fields) -> SwitchRule:
        return self._switch_rule("delay", match, fields, delay_ns=delay_ns, count=count,
                                 every=every, probability=probability)

    def duplicate(self, match=None, *, count=None, every=None, probability=None,
                  **fields) -> SwitchRule:
        return self._switch_rule("duplicate", match, fields, count=count, every=every,
                                 probability=probability)

    def reorder(self, match=None, *, hold_ns=None, count=None, **fields) -> SwitchRule:
        return self._switch_rule("reorder", match, fields, hold_ns=hold_ns, count=count)

    def corrupt(self, match=None, *, layer: str, offset: int, xor: int = 0xFF, count=None,
                **fields) -> SwitchRule:
        """Flips bits at `offset` of `layer` ("bth", "mpa", "ddp", ...) and recomputes the
        checksums checked before that layer (IPv4, UDP/TCP, ICRC, MPA CRC), so the corruption
        reaches it."""
        return self._switch_rule("corrupt", match, fields, layer=layer, offset=offset, xor=xor,
                                 count=count)

    def _await_releases(self, deadline_s: float = 5.0) -> list[dict]:
        """The switch's records once every delayed or held frame has its release record (at
        most deadline_s: a longer delay is recorded as still pending)."""
        end = time.monotonic() + deadline_s
        while True:
            records = self.switch_history()
            held = {r.get("seq") for r in records if r.get("action") in ("delay", "reorder")}
            released = {r.get("of_seq") for r in records if r.get("action") == "release"}
            if held <= released:
                return records
            if time.monotonic() > end:
                self._lab.record("switch_holds_pending", object="switch",
                                 seqs=sorted(held - released))
                return records
            time.sleep(0.02)

    def switch_history(self) -> list[dict]:
        """The switch's records (every rule action) since this lab's first switch rule."""
        if self._control is None:
            return list(self._switch_records)
        return self._switch().request("history", since=self._since)["records"]

    def _ip_link(self, host, state: str) -> None:
        name = _host_name(host)
        m = self._lab.machine_of(name)
        netdev = m.facts.netdev
        m.run(f"ip link set {netdev} {state}", 30, root=True).check(
            f"{name}: ip link set {state}")
        if state == "up":
            self._wait_usable(name, m)
            # Down flushed this host's neighbours (and a peer that sent meanwhile holds a FAILED
            # entry for it): resolved again here, or the next rdma_resolve_addr of a scenario
            # that is not about it waits its whole timeout (ib-addr-neighbour-update-lost).
            self._lab.pool.warm_data_path()
        self._link_fault(name, f"port_{state}", netdev)
        (self._down.add if state == "down" else self._down.discard)(name)

    @staticmethod
    def _wait_usable(name: str, m, deadline_s: float = 30.0) -> None:
        """Up is not usable yet: the port must be ACTIVE again and the link-local address (the
        GID RoCEv2 routes by) past duplicate address detection, or modify to RTR fails with
        ETIMEDOUT resolving the peer."""
        f = m.facts
        probe = (f"cat /sys/class/infiniband/{f.device}/ports/{f.port}/state; "
                 f"ip -6 addr show dev {f.netdev} tentative")
        end = time.monotonic() + deadline_s
        while True:
            out = m.run(probe, 30).out
            if "ACTIVE" in out and "inet6" not in out:
                return
            if time.monotonic() > end:
                raise Hung(f"{name}: link up", f"{name}: {f.netdev} not usable "
                           f"{deadline_s} s after link up:\n{out}")
            time.sleep(0.1)

    def neigh_flush(self, host) -> None:
        """`ip neigh flush dev <netdev>` on the host: it forgets every neighbour (ARP and
        IPv6 ND entries) of its data NIC, as after a link flap or the neighbour table's garbage
        collection; the next resolution of a peer sends a request again."""
        name = _host_name(host)
        m = self._lab.machine_of(name)
        netdev = m.facts.netdev
        m.run(f"ip neigh flush dev {netdev}", 30, root=True).check(f"{name}: ip neigh flush")
        self._link_fault(name, "neigh_flush", netdev)

    def _link_fault(self, name: str, fault: str, netdev: str) -> None:
        """Counts and records a fault applied to a host's data NIC."""
        self._counts[fault] = self._counts.get(fault, 0) + 1
        self._lab.record("fault", object="link", host=name, fault=fault, netdev=netdev)

    def port_down(self, host) -> None:
        self._ip_link(host, "down")

    def port_up(self, host) -> None:
        self._ip_link(host, "up")

    def counts(self) -> dict[str, int]:
        """Faults applied so far; "drop" is the packets the drop rules' counters saw."""
        counts = {k: v for k, v in self._counts.items() if k != "drop"}
        drops = sum(r.hits for r in self._rules if r.action == "drop")
        for r in self._switch_rules:
            if r.action != "watch":
                counts[r.action] = counts.get(r.action, 0) + r.hits
        drops += counts.pop("drop", 0)
        if drops or "drop" in self._counts or any(r.action == "drop" for r in self._switch_rules):
            counts["drop"] = drops
        return counts

    def clear(self) -> None:
        from ...faults import nft
        if self._counts or any(r.action != "watch" for r in self._rules + self._switch_rules):
            self._lab.pool.neighbours_unsure = True  # resolved again before the next lab
        lost = self._lab.lost_hosts()  # a lost host is restarted before its next lab
        for name in list(self._down):  # the next lab on these hosts starts with links up
            if name not in lost:
                self.port_up(name)
        self._close_listers()
        for key, (machine, place) in list(self._nft_ready.items()):  # and with no rules
            if key not in lost:
                self._nft_on(machine, key, nft.delete_table_command(place))
        self._nft_ready.clear()
        self._rules.clear()
        if self._control is not None:
            self._control.request("clear")  # no new holds; frames held already still go
            # Kept for the lab's history, with the release of every frame it held back.
            self._switch_records = self._await_releases()
            self._control.close()
            self._control = None
        self._switch_rules.clear()

    def _unsupported_reason(self, fault: str) -> str:
        return (f"{self._lab.description} cannot apply {fault} (injected events and verb "
                "hooks are the model's)")
