"""iSCSI Extensions for RDMA as a workload: LIO with ib_isert on the target host, open-iscsi
with ib_iser on the initiator (rdmalab.workloads.iser_host does the host side).

    iser = Iser(lab, target="a", initiator="b", replacement_timeout=120)
    iser.setup()                      # target exported, initiator logged in, session LOGGED_IN
    iser.start_io()                   # the durability ledger writes (rdmalab.workloads.ledger)
    ...                               # faults
    iser.wait_state("LOGGED_IN", 60)  # recovered
    iser.stop_io(); assert iser.verify()["lost_count"] == 0
    iser.teardown()                   # logout, target removed

Timeouts are the node record's (iscsid.conf(5)), in seconds; None leaves iscsid.conf's
(replacement 120 s, NOP-Out every 5 s answered within 5 s, login 15 s). While the session is
down the disk is blocked and its I/O waits; past replacement_timeout it is failed
(transport-offline, EIO)."""

from __future__ import annotations

import errno as _errno
from typing import Optional

from ..errors import FaultNotSupported, WorkloadError
from .base import HOST, STEP_DEADLINE_S, Workload

MODULE = "rdmalab.workloads.iser_host"
ISCSI_PORT = 3260  # the IANA port of iSCSI (RDMA/CM's service id for iSER too)
IQN_MAX = 223      # RFC 3720 3.2.6.1: an iSCSI name is at most 223 bytes
# Why LIO's iSER listener cannot start on an iWARP device whose connections are the host's own
# TCP sockets (siw); an offloading iWARP NIC keeps its own TCP ports.
SHARED_PORT = ("LIO starts every network portal with a TCP listener on its address and port "
               "(iscsi_target_configfs.c lio_target_call_addnptotpg: ISCSI_TCP), and the "
               "portal's iser attribute adds ib_isert's RDMA/CM listener on the same ones "
               "(lio_target_np_driver_store, isert_setup_id: rdma_listen); on {device} that "
               "listener is a kernel TCP socket bound to them (siw_cm.c siw_create_listen), "
               "which the listening iSCSI socket refuses, SO_REUSEADDR or not "
               "(inet_bind_conflict): EADDRINUSE for portal {portal}")
# Who owns each side's resources in `rdma res`: the ULP (its cm_ids, MRs, PD) and rdma_cm,
# which creates every QP made with rdma_create_qp (cma.c: ib_create_qp under its
# KBUILD_MODNAME); on a host whose only kernel ULP is this workload, rdma_cm's QPs are ours.
OWNERS = {"target": ["ib_isert", "rdma_cm"], "initiator": ["ib_iser", "rdma_cm"]}


def check_timeouts(timeouts: dict) -> None:
    for name, value in timeouts.items():
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 0):
            raise ValueError(f"iser {name}={value!r}: whole seconds, 0 or more (None: "
                             "iscsid.conf's default)")


def check_iqn(iqn: str) -> None:
    """An iSCSI name LIO takes as a target (RFC 3720 3.2.6.3: iqn. or eui.; naa. from RFC
    3980)."""
    if not iqn.startswith(("iqn.", "eui.", "naa.")) or len(iqn.encode()) > IQN_MAX \
            or any(c.isspace() or c == "/" for c in iqn):
        raise ValueError(f"iser iqn {iqn!r}: an iSCSI name (iqn., eui. or naa.; at most "
                         f"{IQN_MAX} bytes, no spaces or /)")


class Iser(Workload):
    kind = "iser"
    owners = OWNERS
    module = MODULE

    def __init__(self, lab, target: str = "a", initiator: str = "b", *,
                 iqn: str = "iqn.2026-11.io.rdmalab:iser", port: int = ISCSI_PORT,
                 backing: str = "null_blk", size_mb: int = 64,
                 replacement_timeout: Optional[int] = 120,
                 noop_out_interval: Optional[int] = 5, noop_out_timeout: Optional[int] = 5,
                 login_timeout: Optional[int] = None):
        if backing not in ("null_blk", "disk"):
            raise ValueError(f"iser backing {backing!r}: null_blk (a RAM disk, gone with a "
                             "reboot of the target) or disk (the host's spare disk)")
        check_iqn(iqn)
        self.timeouts = {"replacement_timeout": replacement_timeout,
                         "noop_out_interval": noop_out_interval,
                         "noop_out_timeout": noop_out_timeout, "login_timeout": login_timeout}
        check_timeouts(self.timeouts)
        super().__init__(lab, target, initiator)
        if self.one_kernel():
            raise FaultNotSupported("iser", f"{target} and {initiator} are network namespaces "
                                    "of one kernel: ib_isert and ib_iser make their RDMA/CM ids "
                                    "in the initial namespace (rdma_create_id(&init_net, ...), "
                                    "drivers/infiniband/ulp/isert/ib_isert.c and "
                                    "ulp/iser/iser_verbs.c), where the hosts' addresses are not")
        self.iqn, self.port, self.backing, self.size_mb = iqn, port, backing, size_mb
        self.session = self.disk = self.device = ""

    # -- set up and tear down
    def setup(self, deadline_s: float = 120.0) -> None:
        """The target exports its backing device; the initiator logs in; its session is
        LOGGED_IN and its disk there."""
        self.export()
        self.connect(deadline_s)

    def export(self) -> None:
        dev = self.backing_device(self.backing, self.size_mb)
        try:
            self.on(self.target, "target_up", self.iqn, dev, self._address(), self.port)
        except WorkloadError as e:
            caps = self.lab.host(self.target).caps()
            if not (e.errno == _errno.EADDRINUSE and e.step.endswith("/iser")
                    and caps.transport == "iWARP"):
                raise
            self.remove_target()  # the half-built target goes: the host serves other scenarios
            raise FaultNotSupported(f"iser on {caps.name}", SHARED_PORT.format(
                device=caps.name, portal=e.step.split("/")[-2])) from e

    def remove_target(self, deadline_s: float = STEP_DEADLINE_S) -> float:
        """Removes the target (its sessions closed first, their QPs drained; Hung past
        deadline_s), the initiator still logged in: the seconds it took. The initiator
        recovers once export() runs again."""
        return self.on(self.target, "target_down", self.iqn, self._address(), self.port,
                       deadline_s=deadline_s)["took_s"]

    def connect(self, deadline_s: float = 120.0) -> None:
        """Logs in (iscsid started where it is not running)."""
        got = self.on(self.initiator, "login", self.iqn, self._address(), self.port,
                      self.timeouts, deadline_s, deadline_s=deadline_s + 30)
        self.session, self.disk, self.device = got["session"], got["disk"], got["device"]
        self.wait_state("LOGGED_IN", deadline_s)

    def teardown(self, deadline_s: float = 120.0) -> None:
        """Logs out (within deadline_s, else WorkloadError) and removes the target."""
        if self._ledger is not None:
            self.stop_io()
        try:
            if self.session:
                self.on(self.initiator, "logout", self.iqn, self._address(), self.port,
                        deadline_s, deadline_s=deadline_s + 30)
        finally:
            self.remove_target()

    def connections(self) -> set:
        """The initiator's iSER connections as `rdma res` numbers their cm_ids (cm-idn): one
        per connection until ib_iser releases it, which waits for its DISCONNECTED
        (iser_verbs.c iser_release_work)."""
        got = self.on(self.initiator, "kernel_owned", OWNERS["initiator"][:1], module=HOST)
        return {e["cm-idn"] for e in got["held"].get("cm_id", [])}

    def _address(self) -> str:
        return self.lab.address_of(self.target)

    # -- state
    def states(self) -> dict:
        """The session's state (LOGGED_IN, FAILED, FREE; "gone" once logged out) and its
        disk's (running, blocked, transport-offline, ...) as the kernel says them now."""
        return self.on(self.initiator, "state", self.session, self.disk)

    def state(self) -> str:
        return self.states()["session"]

    def unit_name(self) -> str:
        return self.session or "the iSCSI session"

    # -- I/O
