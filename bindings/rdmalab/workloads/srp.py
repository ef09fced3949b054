"""The SCSI RDMA Protocol as a workload: LIO with ib_srpt on the target host, ib_srp over
RDMA/CM on the initiator (rdmalab.workloads.srp_host does the host side).

    srp = Srp(lab, target="a", initiator="b", reconnect_delay=2, dev_loss_tmo=600)
    srp.setup()                    # target exported, initiator logged in, remote port running
    srp.start_io()                 # the durability ledger writes (rdmalab.workloads.ledger)
    ...                            # faults
    srp.wait_state("running", 60)  # recovered
    srp.stop_io(); assert srp.verify()["lost_count"] == 0
    srp.teardown()                 # remote port deleted, target removed, modules unloaded

Timeouts are the SRP remote port's (Documentation/ABI/stable/sysfs-transport-srp,
drivers/scsi/scsi_transport_srp.c), in seconds or "off"; None leaves ib_srp's default
(reconnect_delay 10 s, fast_io_fail_tmo 15 s, dev_loss_tmo 600 s). A transport error blocks
the port and its disk (I/O waits) and ib_srp tries to reconnect every reconnect_delay; past
fast_io_fail_tmo the port is fail-fast (I/O fails), past dev_loss_tmo it is removed.

SRP has no keep-alive: a target that goes silent (rebooted) is noticed only when a command
outlives the SCSI command timeout (scsi_timeout, sd's 30 s by default). The error handler's
host reset then reconnects (srp_reset_host -> srp_reconnect_rport); while the target is still
away that fails and, the port still running, fails I/O at once whatever fast_io_fail_tmo says
(scsi_transport_srp.c srp_reconnect_rport: __rport_fail_io_fast), and the SCSI error handler
offlines the disk ("not ready after error recovery"). A scenario that wants I/O to wait out
an outage chooses scsi_timeout longer than it."""

from __future__ import annotations

from typing import Optional, Union

from ..errors import FaultNotSupported
from .base import STEP_DEADLINE_S, Workload
from .srp_host import SCSI_DEVICE_BLOCK_MAX_TIMEOUT, initiator_port_id, login_string

MODULE = "rdmalab.workloads.srp_host"
# ib_srpt's RDMA/CM port: SRP has no IANA port; blktests' srp_rdma_cm_port.
SRP_RDMA_CM_PORT = 5555
# ib_srp.c SRP_ABORT_TIMEOUT_MS: the error handler's abort, then its LUN reset, each waits this.
SRP_ABORT_S = 5.0
# ib_srp's defaults (ib_srp.c: srp_reconnect_delay, srp_fast_io_fail_tmo, srp_dev_loss_tmo).
DEFAULTS = {"reconnect_delay": 10, "fast_io_fail_tmo": 15, "dev_loss_tmo": 600}
# Who owns each side's resources in `rdma res`: the ULP (its cm_ids, CQs, MRs, PD) and rdma_cm,
# which creates the QPs both make with rdma_create_qp over RDMA/CM (srpt_create_ch_ib,
# srp_create_ch_ib; cma.c creates them under its KBUILD_MODNAME).
OWNERS = {"target": ["ib_srpt", "rdma_cm"], "initiator": ["ib_srp", "rdma_cm"]}
Tmo = Optional[Union[int, str]]
# Why an iWARP target is reached at its IPv6 link-local address (as blktests' srp tests do).
IPV4_ON_IWARP = (
    "ib_srpt listens on the IPv6 wildcard whenever it can (ib_srpt.c srpt_rdma_cm_port_store: "
    "in6addr_any first, IPv4 only if that fails); an iWARP device's listener is then an IPv6 "
    "socket, and an IPv4 login to it is reset before ib_srpt sees it (6.1 on siw: REJ "
    "-ECONNRESET, no SRP_LOGIN_REQ on the target), so the login goes to the target's IPv6 "
    "link-local address, which this host or its peer lacks")


def _seconds(value) -> float:
    return -1 if value == "off" else value


def check_timeouts(timeouts: dict) -> None:
    """Each timeout whole seconds or "off", and the three together as srp_tmo_valid
    (scsi_transport_srp.c) takes them, ib_srp's default standing for None."""
    for name, value in ((k, timeouts.get(k)) for k in DEFAULTS):
        if value is not None and value != "off" and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"srp {name}={value!r}: whole seconds, 1 or more, or 'off' "
                             "(None: ib_srp's default)")
    t = {k: _seconds(DEFAULTS[k] if timeouts.get(k) is None else timeouts[k])
         for k in DEFAULTS}
    rd, ff, dl = t["reconnect_delay"], t["fast_io_fail_tmo"], t["dev_loss_tmo"]
    if rd < 0 and ff < 0 and dl < 0:
        raise ValueError("srp timeouts: reconnect_delay, fast_io_fail_tmo and dev_loss_tmo "
                         "all off (srp_tmo_valid)")
    if ff > SCSI_DEVICE_BLOCK_MAX_TIMEOUT or (ff < 0 and dl > SCSI_DEVICE_BLOCK_MAX_TIMEOUT):
        raise ValueError(f"srp timeouts: a port may stay blocked at most "
                         f"{SCSI_DEVICE_BLOCK_MAX_TIMEOUT} s (fast_io_fail_tmo {ff}, "
                         f"dev_loss_tmo {dl}; srp_tmo_valid)")
    if ff >= 0 and dl >= 0 and ff >= dl:
        raise ValueError(f"srp timeouts: fast_io_fail_tmo {ff} must be below dev_loss_tmo "
                         f"{dl} (srp_tmo_valid)")


class Srp(Workload):
    kind = "srp"
    owners = OWNERS
    module = MODULE

    def __init__(self, lab, target: str = "a", initiator: str = "b", *,
                 name: str = "rdmalab-srp", port: int = SRP_RDMA_CM_PORT,
                 reconnect_delay: Tmo = 2, fast_io_fail_tmo: Tmo = 300,
                 dev_loss_tmo: Tmo = 600, scsi_timeout: Optional[int] = None,
                 tl_retry_count: Optional[int] = None, backing: str = "disk"):
        if backing != "disk":
            raise ValueError(f"srp backing {backing!r}: disk (the host's spare disk, kept "
                             "across a reboot of the target)")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise ValueError(f"srp port {port!r}: ib_srpt's RDMA/CM port, 1..65535")
        self.timeouts = {"reconnect_delay": reconnect_delay,
                         "fast_io_fail_tmo": fast_io_fail_tmo, "dev_loss_tmo": dev_loss_tmo}
        check_timeouts(self.timeouts)
        if tl_retry_count is not None and (not isinstance(tl_retry_count, int)
                                           or isinstance(tl_retry_count, bool)
                                           or not 2 <= tl_retry_count <= 7):
            raise ValueError(f"srp tl_retry_count={tl_retry_count!r}: the RC transport retry "
                             "count, 2..7 (ib_srp's srp_parse_options)")
        self.tl_retry_count = tl_retry_count
        if scsi_timeout is not None and (not isinstance(scsi_timeout, int)
                                         or isinstance(scsi_timeout, bool) or scsi_timeout < 1):
            raise ValueError(f"srp scsi_timeout={scsi_timeout!r}: whole seconds, 1 or more "
                             "(None: sd's 30 s)")
        self.timeouts["scsi_timeout"] = scsi_timeout
        super().__init__(lab, target, initiator)
        if self.one_kernel():
            raise FaultNotSupported("srp", f"{target} and {initiator} are network namespaces "
                                    "of one kernel: ib_srpt listens and ib_srp connects with "
                                    "RDMA/CM ids of the initial namespace (rdma_create_id("
                                    "&init_net, ...), drivers/infiniband/ulp/srpt/ib_srpt.c "
                                    "srpt_create_rdma_id and ulp/srp/ib_srp.c "
                                    "srp_new_rdma_cm_id), where the hosts' addresses are not")
        self.name, self.port = name, port
        self.guid = self.rport = self.disk = self.device = ""

    # -- set up and tear down
    def setup(self, deadline_s: float = 120.0) -> None:
        """The target exports its spare disk; the initiator logs in; its remote port is
        running and its disk there."""
        self.export()
        self.connect(deadline_s)

    def _port_of(self, host: str) -> dict:
        return self.on(host, "port_of", self.lab.address_of(host))

    def export(self) -> None:
        dev = self.spare_disk()
        got = self.on(self.target, "target_up", self.name, dev,
                      self._port_of(self.target)["gid"], self.port,
                      self._port_of(self.initiator)["gid"])
        self.guid = got["guid"]

    def connect(self, deadline_s: float = 120.0) -> None:
        """Logs in over RDMA/CM to the exported target (export first)."""
        if not self.guid:
            raise ValueError("srp connect: the target is not exported (export)")
        mine = self._port_of(self.initiator)
        dest, src = self.lab.address_of(self.target), self.lab.address_of(self.initiator)
        caps = self.lab.host(self.target).caps()
        if caps.transport == "iWARP":
            theirs = self._port_of(self.target)
            if not (theirs["link_local"] and mine["link_local"]):
                raise FaultNotSupported(f"srp on {caps.name}", IPV4_ON_IWARP)
            scope = f"%{mine['ifindex']}"
            dest, src = theirs["link_local"] + scope, mine["link_local"] + scope
        options = login_string(self.guid, dest, self.port, initiator_port_id(mine["gid"])[0],
                               src, self.tl_retry_count)
        got = self.on(self.initiator, "login", options, mine["device"], mine["port"],
                      self.guid, self.timeouts, deadline_s, deadline_s=deadline_s + 30)
        self.rport, self.disk, self.device = got["rport"], got["disk"], got["device"]
        self.wait_state("running", deadline_s)

    def remove_target(self, deadline_s: float = STEP_DEADLINE_S) -> float:
        """Removes the target (its channels closed, their QPs drained) with the initiator
        still logged in: the seconds it took. The initiator reconnects once export() runs
        again."""
        return self.on(self.target, "target_down", self.name,
                       deadline_s=deadline_s)["took_s"]

    def teardown(self, deadline_s: float = 120.0) -> None:
        """Logs out (the remote port deleted and its SCSI host gone within deadline_s, else
        WorkloadError) and removes the target."""
        if self._ledger is not None:
            self.stop_io()
        try:
            if self.rport:
                self.on(self.initiator, "logout", self.rport, deadline_s,
                        deadline_s=deadline_s + 30)
        finally:
            self.remove_target()

    # -- state
    def states(self) -> dict:
        """The remote port's state (running, blocked, fail-fast, lost; "gone" once deleted)
        and its disk's (running, blocked, transport-offline, ...) as the kernel says now."""
        return self.on(self.initiator, "state", self.rport, self.disk)

    def state(self) -> str:
        return self.states()["rport"]

    def unit_name(self) -> str:
        return self.rport or "the SRP remote port"

    # -- I/O
