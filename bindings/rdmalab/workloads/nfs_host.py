"""The host side of the NFS over RDMA workload (rdmalab.workloads.nfs), run in a host's agent.

The server is the kernel's nfsd started by hand, as nfs-kernel-server's service does where
there is no systemd: nfsd's filesystem on /proc/fs/nfsd, rpcbind, rpc.mountd, `rpc.nfsd`, the
RDMA listener added through nfsd's portlist (Documentation/filesystems/nfs/nfs-rdma.rst), and
one export (exportfs) of a directory on an ext4 filesystem on the host's spare disk. The
server's /var/lib/nfs lives on that disk too: it holds NFSv4's client records (6.1 in a guest
uses the legacy v4recovery directory, nfsd4_client_tracking_init, fs/nfsd/nfs4recover.c),
without which a rebooted server knows none of its clients and refuses their reclaims.

The client mounts with proto=rdma; there is no sysfs state for a mount, so a MountWatcher
probes it (`ulp_state` records)."""

from __future__ import annotations

import os
import threading
import time
from typing import Optional

from . import records
from .host import (StepFailed, Watcher, answered, at_close, host_name, modprobe, read_attr, run,
                   step, undone, write_attr)
from .host import disk_by_serial

WORKLOAD = "nfs"
DISK_DIR = "/srv/rdmalab-nfs"            # the spare disk's filesystem on the server
EXPORT_DIR = DISK_DIR + "/export"        # what is exported
STATE_DIR = DISK_DIR + "/var-lib-nfs"    # the server's /var/lib/nfs, kept across reboots
MOUNT_POINT = "/mnt/rdmalab-nfs"         # where the client mounts it
NFSD_FS = "/proc/fs/nfsd"
NFSD_THREADS = 4                         # a TCG guest: a few threads are plenty
PROBE_EVERY_S = 0.5
PROBE_LATE_S = 2.0   # a statvfs not back after this: the server is not answering
CLEANUP_S = 20.0     # an umount or unexport left to the lab's close (its budget: 60 s)
ANSWERING, NOT_ANSWERING, ERROR = "answering", "not answering", "error"
STATES = (ANSWERING, NOT_ANSWERING, ERROR, records.GONE)  # a mount's, as MountWatcher says
_WATCHERS: dict[str, "MountWatcher"] = {}


def mounted(path: str, mounts: str = "") -> Optional[str]:
    """The filesystem type mounted at path (the last mount there), None when none is."""
    if not mounts:
        with open("/proc/mounts") as f:
            mounts = f.read()
    got = None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[1] == path:
            got = fields[2]
    return got


def has_listener(portlist: str, port: int) -> bool:
    """Whether nfsd's portlist (one "class port" a line: "rdma 20049") shows RDMA on port."""
    return any(line.split() == ["rdma", str(port)] for line in portlist.splitlines())


def _running(comm: str) -> bool:
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == comm:
                    return True
        except OSError:
            continue
    return False


def _disk_fs(lab, device: str) -> None:
    """device formatted ext4 once, mounted at DISK_DIR, with the export and the server's
    state directories on it. mkfs only where there is no sound ext4: none that blkid finds,
    or one fsck cannot repair (another workload of the session wrote the raw disk)."""
    os.makedirs(DISK_DIR, exist_ok=True)
    if mounted(DISK_DIR) is None:
        why = ""
        try:
            if run(["blkid", "-o", "value", "-s", "TYPE", device], 30.0, "blkid").strip() \
                    != "ext4":
                why = "not ext4"
        except StepFailed:  # blkid exits 2 when it finds no filesystem
            why = "no filesystem"
        if not why:
            try:  # exit 1: errors corrected (a reboot's journal replayed); 4 and up: not
                run(["fsck.ext4", "-p", device], 300.0, "fsck.ext4")
            except StepFailed as e:
                why = "" if "exited 1:" in e.detail else f"fsck: {e.detail[-200:]}"
        if why:
            with step(lab, WORKLOAD, "mkfs", device=device, why=why):
                run(["mkfs.ext4", "-q", "-F", device], 300.0, "mkfs.ext4")
        run(["mount", "-t", "ext4", device, DISK_DIR], 60.0, "mount the spare disk")
    for d in (EXPORT_DIR, STATE_DIR, STATE_DIR + "/v4recovery", STATE_DIR + "/nfsdcltrack"):
        os.makedirs(d, exist_ok=True)
    for f in ("etab", "rmtab"):  # exportfs and mountd read them before they write them
        open(os.path.join(STATE_DIR, f), "a").close()
    if mounted("/var/lib/nfs") is None:
        run(["mount", "--bind", STATE_DIR, "/var/lib/nfs"], 30.0, "bind /var/lib/nfs")


@answered
def server_up(lab, serial: str, port: int, fsid: int, grace_s: Optional[int]) -> dict:
    """The spare disk (serial) mounted, nfsd running with an RDMA listener on port, EXPORT_DIR
    exported with fsid, its NFSv4 grace period grace_s (None: the kernel's, its lease time);
    what is already so is kept (a second call is cheap)."""
    with step(lab, WORKLOAD, "server_up", port=port, fsid=fsid, grace_s=grace_s) as data:
        device = disk_by_serial(lab, serial).get("device", "")
        if not device:
            raise StepFailed("server_up", 0, f"no disk with serial {serial!r}")
        data["device"] = device
        _disk_fs(lab, device)
        modprobe("nfsd", "rpcrdma")
        if mounted(NFSD_FS) is None:
            run(["mount", "-t", "nfsd", "nfsd", NFSD_FS], 30.0, "mount nfsd")
        if not _running("rpcbind"):
            os.makedirs("/run/rpcbind", exist_ok=True)
            run(["rpcbind"], 30.0, "rpcbind")
        run(["exportfs", "-o", f"rw,no_root_squash,sync,insecure,no_subtree_check,fsid={fsid}",
             f"*:{EXPORT_DIR}"], 60.0, "exportfs")
        if not _running("rpc.mountd"):
            run(["rpc.mountd"], 60.0, "rpc.mountd")
        if grace_s is not None and read_attr(os.path.join(NFSD_FS, "threads")) in (None, "0"):
            # only while nfsd is stopped: EBUSY once it runs (__nfsd4_write_time, nfsctl.c)
            write_attr(os.path.join(NFSD_FS, "nfsv4gracetime"), str(grace_s))
        run(["rpc.nfsd", str(NFSD_THREADS)], 120.0, "rpc.nfsd")
        with open(os.path.join(NFSD_FS, "portlist")) as f:
            listening = has_listener(f.read(), port)
        if not listening:
            try:
                with open(os.path.join(NFSD_FS, "portlist"), "w") as f:
                    f.write(f"rdma {port}\n")
            except OSError as e:
                raise StepFailed(f"rdma {port} > portlist", e.errno or 0,
                                 e.strerror or "") from None
        at_close(lab, ("server", port), lambda: (server_down(lab, port), release_disk(lab)))
        return {"device": device, "export": EXPORT_DIR}


@answered
def server_down(lab, port: int) -> dict:
    """The export removed and nfsd stopped (its threads and listeners, the RDMA one's QPs
    with them). The disk stays mounted, rpcbind and mountd running (the server's storage and
    daemons, which hold no RDMA resource); server_up takes them as they are."""
    t0 = time.monotonic()
    with step(lab, WORKLOAD, "server_down", port=port):
        if mounted(NFSD_FS) is not None:
            run(["exportfs", "-u", f"*:{EXPORT_DIR}"], 60.0, "exportfs -u")
            run(["rpc.nfsd", "0"], 120.0, "rpc.nfsd 0")
        undone(lab, ("server", port))
        return {"took_s": time.monotonic() - t0}


@answered
def release_disk(lab) -> dict:
    """The server's storage let go once nfsd is stopped (server_down): rpc.mountd, which
    keeps /var/lib/nfs's files, stopped and the spare disk unmounted, so that another workload
    of the session can take the disk (LIO's iblock opens it exclusively: EBUSY while it is
    mounted). server_up mounts it again."""
    with step(lab, WORKLOAD, "release_disk", disk_dir=DISK_DIR):
        if _running("rpc.mountd"):
            run(["pkill", "-x", "rpc.mountd"], 30.0, "pkill rpc.mountd")
            end = time.monotonic() + 10.0
            while _running("rpc.mountd"):
                if time.monotonic() > end:
                    raise StepFailed("release_disk", 0, "rpc.mountd still runs 10 s after "
                                     "SIGTERM")
                time.sleep(0.1)
        for path in ("/var/lib/nfs", DISK_DIR):
            while mounted(path) is not None:  # a bind mount may sit on another
                run(["umount", path], 60.0, f"umount {path}")
        return {}


class MountWatcher(Watcher):
    """A mount's state as its server answers it (`ulp_state` records, on change): every
    PROBE_EVERY_S a statvfs of the mount point (an FSSTAT/STATFS call the client always sends
    to the server; a stat could be answered from the attribute cache) in a thread of its own.
    "answering": the last probe came back within PROBE_LATE_S; "not answering": one has been
    out longer (a hard mount's call waits for the server for ever; no second probe is sent
    while it waits); "error": it came back failed (a soft mount's EIO); "gone": nothing is
    mounted there."""

    _thread_probe: Optional[threading.Thread] = None
    _since = 0.0
    _result = ANSWERING

    def _probe(self) -> None:
        try:
            os.statvfs(self.path)
            self._result = ANSWERING
        except OSError:
            self._result = ERROR

    def _now(self) -> str:
        if mounted(self.path) not in ("nfs", "nfs4"):
            return records.GONE
        if self._thread_probe is None or not self._thread_probe.is_alive():
            self._thread_probe = threading.Thread(target=self._probe, daemon=True,
                                                  name="rdmalab-nfs-probe")
            self._since = time.monotonic()
            self._thread_probe.start()
        self._thread_probe.join(max(0.0, self._since + PROBE_LATE_S - time.monotonic()))
        return NOT_ANSWERING if self._thread_probe.is_alive() else self._result

    def _run(self) -> None:  # Watcher's loop, a probe in place of a state file's read
        host = host_name(self.lab)
        while not self._stop.is_set():
            state = self._now()
            if state != self.state:
                self.lab.record(records.ULP_STATE, object=self.workload, host=host,
                                unit=self.unit, state=state, previous=self.state or "")
                self.state = state
                if state == records.GONE:
                    return
            self._stop.wait(PROBE_EVERY_S)


@answered
def mount(lab, source: str, options: str, params: dict, deadline_s: float) -> dict:
    """Mounts source (address:path) at MOUNT_POINT with options (params: the mount's vers,
    hard, timeo and retrans, recorded as the step's data); a MountWatcher follows it."""
    with step(lab, WORKLOAD, "mount", source=source, options=options, **params):
        modprobe("nfs", "rpcrdma")
        os.makedirs(MOUNT_POINT, exist_ok=True)
        if mounted(MOUNT_POINT) is None:
            run(["mount", "-t", "nfs", "-o", options, source, MOUNT_POINT], deadline_s,
                "mount -t nfs")
        old = _WATCHERS.pop(MOUNT_POINT, None)
        if old is not None:
            old.stop()
        _WATCHERS[MOUNT_POINT] = MountWatcher(lab, WORKLOAD, MOUNT_POINT, MOUNT_POINT)
        at_close(lab, ("client", MOUNT_POINT), lambda: umount(lab, CLEANUP_S, force=True))
        return {"mount_point": MOUNT_POINT}


@answered
def ledger_file(lab, name: str, blocks: int, block: int) -> dict:
    """A file of blocks * block bytes on the mount for the durability ledger (its blocks stay
    holes until written: they read back as zeros, which the ledger takes as never written)."""
    path = os.path.join(MOUNT_POINT, name)
    with step(lab, WORKLOAD, "ledger_file", path=path, blocks=blocks):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, blocks * block)
            os.fsync(fd)
        finally:
            os.close(fd)
        return {"path": path}


@answered
def state(lab, mount_point: str) -> dict:
    """The mount's state as its watcher last recorded it ("gone" when none watches it)."""
    w = _WATCHERS.get(mount_point)
    if w is None or mounted(mount_point) is None:
        return {"state": records.GONE}
    return {"state": w.state or ""}


@answered
def umount(lab, deadline_s: float, force: bool = False) -> dict:
    """umount MOUNT_POINT (a hard mount whose server is gone waits: the deadline fails it).
    force: its calls aborted and the mount detached at once (umount -f -l), for the lab's
    close after a failed scenario, which must not wait for a server."""
    with step(lab, WORKLOAD, "umount", mount_point=MOUNT_POINT, force=force):
        if mounted(MOUNT_POINT) is not None:
            run(["umount", *(["-f", "-l"] if force else []), MOUNT_POINT], deadline_s,
                "umount")
        w = _WATCHERS.pop(MOUNT_POINT, None)
        if w is not None:
            w.stop()
        undone(lab, ("client", MOUNT_POINT))
        return {"mount_point": MOUNT_POINT}
