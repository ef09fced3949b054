"""AgentFaults: the faults an agent lab applies to real hosts (wire rules, links, devices,
reboots)."""

from __future__ import annotations

import errno
import subprocess
import time
from typing import TYPE_CHECKING, Optional

from ...errors import FaultNotSupported, Hung
from ...errors import make_error as _make_error
from ...faults.common import NoFaults, host_name
from ...faults.wire import WireFaults
from ...machines.machine import SOFT_DEVICES
from .common import device_label
from .sinks import Nftables, NftSink, Switch

if TYPE_CHECKING:
    from .lab import AgentLab


class AgentFaults(WireFaults, NoFaults):
    """The faults an agent lab applies: wire rules in the fault switch on the path (drop,
    delay, duplicate, reorder, corrupt, watch) or as nftables rules in the sending hosts
    (software providers send through the host's stack); link down/up of a host's data NIC;
    removal and re-adding of a soft device; reboots by power cycle. What a host cannot have
    (no switch on its path, no power commands) raises FaultNotSupported naming it."""

    def __init__(self, lab: "AgentLab"):
        super().__init__(lab)
        self._counts: dict[str, int] = {}
        self._down: set[str] = set()
        self._removed: dict = {}  # host -> (device, the background `rdma link delete`)
        self._switch = Switch(lab)
        self._nft = Nftables(lab)

    # -- wire rules: the sink for at= (rdmalab.faults.wire)
    def _wire_sink(self, at: Optional[str]):
        """switch | bridge | host. Default: the fault switch where the path has one, else the
        nftables bridge on the path (the netns lab's), else the sending hosts' nftables."""
        if at is None:
            if self._switch.usable():
                return self._switch
            machines = [self._lab.machine_of(h) for h in self._lab.addresses]
            at = "bridge" if all(m.bridge_machine is not None for m in machines) else "host"
        return self._switch if at == "switch" else NftSink(self._nft, at)

    def switch_history(self) -> list[dict]:
        """The switch's records (every rule action) since this lab's first switch rule."""
        return self._switch.history()

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
        name = host_name(host)
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
        name = host_name(host)
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
        dev, proc = self._removed[name]
        try:
            out, _ = proc.communicate(timeout=deadline_s)
        except subprocess.TimeoutExpired:
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
        name = host_name(host)
        self._lab.reboot_host(name, down_ns)
        self._nft.forget_host(name)  # the rebooted guest has no rules
        self._counts["reboot"] = self._counts.get("reboot", 0) + 1

    def _ip_link(self, host, state: str) -> None:
        name = host_name(host)
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
        name = host_name(host)
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
        drops = sum(r.hits for r in self._nft.rules if r.action == "drop")
        for r in self._switch.rules:
            if r.action != "watch":
                counts[r.action] = counts.get(r.action, 0) + r.hits
        drops += counts.pop("drop", 0)
        if drops or "drop" in self._counts or any(r.action == "drop" for r in self._switch.rules):
            counts["drop"] = drops
        return counts

    def clear(self) -> None:
        if self._counts or any(r.action != "watch" for r in self._nft.rules + self._switch.rules):
            self._lab.pool.neighbours_unsure = True  # resolved again before the next lab
        lost = self._lab.lost_hosts()  # a lost host is restarted before its next lab
        for name in list(self._down):  # the next lab on these hosts starts with links up
            if name not in lost:
                self.port_up(name)
        self._nft.clear(lost)  # and with no rules
        self._switch.clear()

    def _unsupported_reason(self, fault: str) -> str:
        return (f"{self._lab.description} cannot apply {fault} (injected events and verb "
                "hooks are the model's)")
