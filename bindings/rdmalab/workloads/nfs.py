"""NFS over RDMA as a workload: the kernel's nfsd with an RDMA listener on the target host, an
NFS mount with proto=rdma on the initiator (rdmalab.workloads.nfs_host does the host side).

    nfs = Nfs(lab, target="a", initiator="b", hard=True, timeo=100, retrans=2)
    nfs.setup()                       # exported from the spare disk, mounted, answering
    nfs.start_io()                    # the durability ledger writes a file on the mount
    ...                               # faults
    nfs.wait_state("answering", 120)  # recovered
    nfs.stop_io(); assert nfs.verify()["lost_count"] == 0
    nfs.teardown()                    # umount, unexport, nfsd stopped

timeo (tenths of a second) and retrans are the mount's (nfs(5)); None leaves the client's
default (600 and 2 for a connection-oriented transport). With `hard` the client retries for
ever and no I/O error reaches the application; with `soft` a call fails with EIO after retrans
retransmissions. The export has a fixed fsid, so its file handles outlive a reboot of the
server (a changing one leaves the client with ESTALE). grace_s is the server's NFSv4 grace
period (None: the kernel's, its 90 s lease time): after each start of nfsd, an OPEN that
reclaims no state before the reboot waits it out (NFS4ERR_GRACE, nfsd4_open,
fs/nfsd/nfs4proc.c), the first one of a setup included. By default NFSv4's export is the
server's pseudo-root (fsid=0; the client mounts "/"): nfsd builds the pseudo-root of other
exports from the server's "/", which in a VM lab guest is an overlayfs, not exportable
(overlayfs exports file handles only with nfs_export=on, Documentation/filesystems/
overlayfs.rst), so a mount of the export's path fails with ENOENT there."""

from __future__ import annotations

from typing import Optional

from ..machines.machine import SPARE_DISK_SERIAL
from .base import Workload
from .ledger import BLOCK
from .nfs_host import EXPORT_DIR

MODULE = "rdmalab.workloads.nfs_host"
NFS_RDMA_PORT = 20049  # the IANA port of NFS over RDMA (RFC 8267)
VERSIONS = ("3", "4", "4.0", "4.1", "4.2")
# What `rdma res` names the owner of what NFS holds: the client (xprtrdma) and the server
# (svcrdma) are both built into rpcrdma.ko, whose KBUILD_MODNAME the restrack entries carry
# (rdma_create_id and ib_alloc_pd are macros passing it).
OWNERS = ("rpcrdma", "svcrdma")


def _check_int(name: str, value, low: int, high: int, what: str) -> None:
    """value is None or an int (not a bool) from low to high, else ValueError naming it."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                              or not low <= value <= high):
        raise ValueError(f"nfs {name} {value!r}: {what}")


def mount_options(vers: str, port: int, hard: bool, timeo: Optional[int],
                  retrans: Optional[int]) -> str:
    """mount -o of an RDMA mount (nfs(5)): timeo in tenths of a second, None the client's
    default; NFSv3 without the NLM (nolock: no rpc.statd runs in a guest)."""
    opts = ["proto=rdma", f"port={port}", f"vers={vers}", "hard" if hard else "soft"]
    if timeo is not None:
        opts.append(f"timeo={timeo}")
    if retrans is not None:
        opts.append(f"retrans={retrans}")
    if vers.split(".")[0] == "3":
        opts.append("nolock")
    return ",".join(opts)


class Nfs(Workload):
    kind = "nfs"
    module = MODULE
    owners = {"target": list(OWNERS), "initiator": list(OWNERS)}

    def __init__(self, lab, target: str = "a", initiator: str = "b", *, vers: str = "4.2",
                 port: int = NFS_RDMA_PORT, hard: bool = True, timeo: Optional[int] = 100,
                 retrans: Optional[int] = 2, fsid: Optional[int] = None,
                 grace_s: Optional[int] = None):
        super().__init__(lab, target, initiator)
        if str(vers) not in VERSIONS:
            raise ValueError(f"nfs vers {vers!r}: one of {', '.join(VERSIONS)} (nfs(5))")
        _check_int("timeo", timeo, 1, 2**31, "a positive integer or None")
        _check_int("retrans", retrans, 1, 2**31, "a positive integer or None")
        _check_int("grace_s", grace_s, 10, 3600, "10 to 3600 s or None (nfsd's "
                   "nfsv4gracetime, __nfsd4_write_time)")
        _check_int("fsid", fsid, 0, 2**31, "an integer from 0 (NFSv4's pseudo-root, "
                   "exports(5)) or None")
        v4 = str(vers).startswith("4")
        if fsid is None:
            fsid = 0 if v4 else 1
        self.vers, self.port, self.hard, self.fsid = str(vers), port, hard, fsid
        self.path = "/" if v4 and fsid == 0 else EXPORT_DIR  # what the client mounts
        self.timeo, self.retrans, self.grace_s = timeo, retrans, grace_s
        self.options = mount_options(self.vers, port, hard, timeo, retrans)
        self.mount_point = ""
        self.file = ""

    def retry_bound_s(self) -> float:
        """The longest a hard mount waits between two tries of a call: timeo grows by timeo
        at each retransmission up to retrans of them (linear backoff of a connection-oriented
        transport, xprt_adjust_timeout, net/sunrpc/xprt.c), then starts again."""
        timeo = 600 if self.timeo is None else self.timeo
        retrans = 2 if self.retrans is None else self.retrans
        return timeo * (retrans + 1) / 10.0

    # -- set up and tear down
    def setup(self, deadline_s: float = 120.0) -> None:
        """The target exports a directory of its spare disk over RDMA; the initiator mounts it;
        the mount answers."""
        self.export()
        self.connect(deadline_s)

    def export(self) -> None:
        """Starts the server (again, after a reboot: what nfs-kernel-server's boot does)."""
        self.spare_disk()  # the export's file system lives there
        self.on(self.target, "server_up", SPARE_DISK_SERIAL, self.port, self.fsid, self.grace_s,
                deadline_s=600.0)  # mkfs of the spare disk the first time, on a TCG guest

    def connect(self, deadline_s: float = 120.0) -> None:
        got = self.on(self.initiator, "mount", f"{self.lab.address_of(self.target)}:{self.path}",
                      self.options, {"vers": self.vers, "hard": self.hard, "timeo": self.timeo,
                                     "retrans": self.retrans}, deadline_s,
                      deadline_s=deadline_s + 30)
        self.mount_point = got["mount_point"]
        self.wait_state("answering", deadline_s)

    def remove_target(self) -> float:
        """The export removed and nfsd stopped with the client still mounted: the seconds it
        took."""
        return self.on(self.target, "server_down", self.port)["took_s"]

    def teardown(self, deadline_s: float = 120.0) -> None:
        """Unmounts (within deadline_s, else WorkloadError), stops the server and lets its
        disk go (another workload may take it next)."""
        if self._ledger is not None:
            self.stop_io()
        try:
            if self.mount_point:
                self.on(self.initiator, "umount", deadline_s, deadline_s=deadline_s + 30)
                self.mount_point = ""
        finally:
            self.on(self.target, "server_down", self.port)
            self.on(self.target, "release_disk")

    # -- state
    def state(self) -> str:
        """The mount's state as the initiator's watcher last saw it (nfs_host.MountWatcher):
        answering, not answering, error, or gone (not mounted)."""
        return self.on(self.initiator, "state", self.mount_point)["state"]

    def unit_name(self) -> str:
        return "the nfs mount"

    # -- I/O: the ledger writes a file on the mount
    def io_path(self, blocks: int) -> str:
        """A file of blocks on the mount, made for the ledger (O_DIRECT | O_DSYNC: a write
        that returned was a stable write or was committed, RFC 1813 3.3.7)."""
        self.file = self.on(self.initiator, "ledger_file", "ledger", blocks, BLOCK)["path"]
        return self.file

    def verify_path(self) -> str:
        return self.file

    # -- I/O
