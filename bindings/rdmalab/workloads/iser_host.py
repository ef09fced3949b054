"""The host side of the iSER workload (rdmalab.workloads.iser), run in a host's agent.

The target is LIO with the isert transport, configured through configfs directly (no
targetcli), in the order rtslib-fb writes it (rtslib/tcm.py, rtslib/target.py) and the kernel
accepts it (drivers/target/target_core_configfs.c, iscsi/iscsi_target_configfs.c): an iblock
storage object on the backing device (udev_path, enable, then its T10 unit serial, which
cannot change once a LUN exports it); an iSCSI target with one TPG; LUN 0 linked to the
object; a network portal at the target's address, where `iser` = 1 adds the iSER listener
beside the TCP one every portal starts with; demo mode (generate_node_acls, no
authentication); the TPG enabled last.

The initiator is open-iscsi: iscsid started here once per boot (a guest has no systemd), an
iface of transport iser, SendTargets discovery through it, the scenario's replacement and
NOP-Out timeouts written to the node record, login; the session's state and its SCSI disk's
state are watched (Watcher: `ulp_state` records)."""

from __future__ import annotations

import errno as _errno
import glob
import os
import re
import socket
import subprocess
import time
import uuid
from typing import Optional

from .host import (StepFailed, Watcher, answered, at_close, configfs, ensure_dir, modprobe,
                   read_attr, set_attr, step, undone, write_attr)

WORKLOAD = "iser"
HBA = "iblock_0"      # the iblock backstore's HBA (rtslib: one per storage object)
OBJECT = "rdmalab"    # the storage object's name under it
TPGT = "tpgt_1"
LUN = "lun_0"
LUN_LINK = "rdmalab"  # the LUN's link to the object (any name; rtslib draws one)
IFACE = "rdmalab-iser"  # our iface record: iscsiadm's built-in "iser" may be the user's
# open-iscsi's command socket (usr/mgmt_ipc.h ISCSIADM_NAMESPACE): iscsid answers there.
ISCSID_SOCKET = "@ISCSIADM_ABSTRACT_NAMESPACE"
RUN_DIR = "/run/rdmalab-iscsi"
# iscsiadm's exit codes used here (open-iscsi include/iscsi_err.h, iscsiadm(8)).
ERR_SESS_EXISTS = 15
ERR_NO_OBJS_FOUND = 21
# The TPG's attributes for an initiator without an ACL of its own (rtslib's demo mode).
TPG_ATTRIBS = (("authentication", "0"), ("generate_node_acls", "1"),
               ("demo_mode_write_protect", "0"), ("cache_dynamic_acls", "1"))
# The scenario's timeouts, by the node record's names (iscsid.conf(5)).
NODE_SETTINGS = {"replacement_timeout": "node.session.timeo.replacement_timeout",
                 "noop_out_interval": "node.conn[0].timeo.noop_out_interval",
                 "noop_out_timeout": "node.conn[0].timeo.noop_out_timeout",
                 "login_timeout": "node.conn[0].timeo.login_timeout"}
CLEANUP_S = 30.0  # a logout left to the lab's close (the scenario failed before its own)
_WATCHERS: dict[str, Watcher] = {}
_ISCSID: list = []  # the iscsid this agent started (kept: its exit is reaped here)


# -- what can be computed without a kernel (tests/python/test_py_iser.py)
def portal_name(address: str, port: int) -> str:
    """A network portal as LIO's configfs and iscsiadm spell it: ip:port, [ipv6]:port."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def target_paths(root: str, iqn: str, address: str, port: int) -> dict:
    """The configfs paths of the target under root (/sys/kernel/config/target)."""
    tpg = os.path.join(root, "iscsi", iqn, TPGT)
    obj = os.path.join(root, "core", HBA, OBJECT)
    return {"hba": os.path.join(root, "core", HBA), "object": obj,
            "serial": os.path.join(obj, "wwn", "vpd_unit_serial"),
            "fabric": os.path.join(root, "iscsi"), "wwn": os.path.join(root, "iscsi", iqn),
            "tpg": tpg, "lun": os.path.join(tpg, "lun", LUN),
            "lun_link": os.path.join(tpg, "lun", LUN, LUN_LINK),
            "np": os.path.join(tpg, "np", portal_name(address, port)),
            "attrib": os.path.join(tpg, "attrib")}


def unit_serial(iqn: str) -> str:
    """The LUN's T10 unit serial (VPD page 0x80; page 0x83's NAA identifier is derived from
    it), the same at every export of iqn: LIO has none until one is written (rtslib draws a
    random one and saves it), and a host that sees a device identity change would take it
    for another disk."""
    return uuid.uuid5(uuid.NAMESPACE_URL, iqn).hex[:32]


def shown_serial(text: Optional[str]) -> str:
    """The serial out of vpd_unit_serial's "T10 VPD Unit Serial Number: X"."""
    return (text or "").partition(":")[2].strip()


_PORTAL = r"(?P<portal>\[[^\]]+\]:\d+|[^\s,\[]+:\d+),(?P<tpgt>\d+)"
_DISCOVERED = re.compile(rf"^{_PORTAL}\s+(?P<target>\S+)$")
_SESSION = re.compile(rf"^(?P<transport>[\w-]+): \[(?P<sid>\d+)\] {_PORTAL}\s+(?P<target>\S+)")


def parse_discovery(text: str) -> list[dict]:
    """`iscsiadm -m discovery -t st` lines ("10.0.0.1:3260,1 iqn...") as portal, tpgt,
    target."""
    return [m.groupdict() for m in map(_DISCOVERED.match, text.splitlines()) if m]


def parse_sessions(text: str) -> list[dict]:
    """`iscsiadm -m session` lines ("iser: [1] 10.0.0.1:3260,1 iqn... (non-flash)") as
    transport, sid, portal, tpgt, target."""
    return [m.groupdict() for m in map(_SESSION.match, text.splitlines()) if m]


def parse_ifaces(text: str) -> dict:
    """`iscsiadm -m iface` lines ("iser iser,<empty>,...": name, then transport first of the
    binding) as name -> transport."""
    return {w[0]: w[1].split(",")[0] for w in map(str.split, text.splitlines()) if len(w) > 1}


def node_settings(timeouts: dict) -> list[tuple[str, str]]:
    """The node record's (name, value) for each timeout the scenario chose (None: iscsid.conf's
    default)."""
    return [(NODE_SETTINGS[k], str(v)) for k, v in timeouts.items() if v is not None]


def initiator_name(hostname: str, boot_id: str) -> str:
    """This boot's initiator name (RFC 3720 3.2.6.3.1): a guest shares its host's
    /etc/iscsi/initiatorname.iscsi, which may hold no name at all ("GenerateName=yes")."""
    host = re.sub(r"[^a-z0-9.-]", "-", hostname.lower()) or "host"
    return f"iqn.2026-11.io.rdmalab:{host}.{boot_id.replace('-', '')[:8]}"


# -- the target
def _storage_object(p: dict, device: str, serial: str) -> None:
    """The iblock object on device, enabled, with its serial (rtslib's order)."""
    ensure_dir(p["hba"])
    ensure_dir(p["object"])
    if read_attr(os.path.join(p["object"], "enable")) == "1":
        on = read_attr(os.path.join(p["object"], "udev_path"))
        if on != device:  # an enabled object's device cannot change
            raise StepFailed("target_up", _errno.EBUSY, f"{p['object']} already exports {on}")
    else:
        write_attr(os.path.join(p["object"], "udev_path"), device)
        write_attr(os.path.join(p["object"], "control"), f"udev_path={device}")
        write_attr(os.path.join(p["object"], "control"), "readonly=0")
        write_attr(os.path.join(p["object"], "enable"), "1")
    if shown_serial(read_attr(p["serial"])) != serial:
        write_attr(p["serial"], serial)  # EINVAL once a LUN exports it (export_count)


@answered
def target_up(lab, iqn: str, device: str, address: str, port: int) -> dict:
    """Exports device as LUN 0 of iqn at an iSER portal address:port."""
    portal = portal_name(address, port)
    with step(lab, WORKLOAD, "target_up", iqn=iqn, device=device, portal=portal):
        modprobe("target_core_mod", "target_core_iblock", "iscsi_target_mod", "ib_isert")
        p = target_paths(os.path.join(configfs(), "target"), iqn, address, port)
        serial = unit_serial(iqn)
        _storage_object(p, device, serial)
        for d in ("fabric", "wwn", "tpg", "lun"):
            ensure_dir(p[d])
        if not os.path.islink(p["lun_link"]):
            try:
                os.symlink(p["object"], p["lun_link"])
            except OSError as e:
                raise StepFailed(f"link {LUN} to {p['object']}", e.errno or 0,
                                 e.strerror or "") from None
        ensure_dir(p["np"])
        set_attr(os.path.join(p["np"], "iser"), "1")  # ib_isert's listener: rdma_listen
        for attr, value in TPG_ATTRIBS:
            set_attr(os.path.join(p["attrib"], attr), value)
        set_attr(os.path.join(p["tpg"], "enable"), "1")
        at_close(lab, ("iser target", iqn), lambda: target_down(lab, iqn, address, port))
        return {"serial": serial, "portal": portal}


@answered
def target_down(lab, iqn: str, address: str, port: int) -> dict:
    """Undoes target_up, innermost first: the TPG disabled (its sessions closed, their QPs
    drained), the portal, the LUN, the TPG, the target, the storage object. What is gone
    already is skipped; the HBA stays where another object still uses it. The seconds it
    took (the TPG's disable waits for its connections' drains)."""
    t0 = time.monotonic()
    with step(lab, WORKLOAD, "target_down", iqn=iqn):
        p = target_paths(os.path.join(configfs(), "target"), iqn, address, port)
        undo = ((os.path.join(p["tpg"], "enable"), "0"), (os.path.join(p["np"], "iser"), "0"),
                (p["np"], os.rmdir), (p["lun_link"], os.unlink), (p["lun"], os.rmdir),
                (p["tpg"], os.rmdir), (p["wwn"], os.rmdir), (p["object"], os.rmdir))
        for path, how in undo:
            if not os.path.lexists(path):
                continue
            try:
                if isinstance(how, str):
                    if read_attr(path) != how:
                        write_attr(path, how)
                else:
                    how(path)
            except OSError as e:
                raise StepFailed(f"remove {path}", e.errno or 0, e.strerror or "") from None
        try:
            os.rmdir(p["hba"])
        except OSError as e:
            if e.errno not in (_errno.ENOENT, _errno.ENOTEMPTY, _errno.EBUSY):
                raise StepFailed(f"remove {p['hba']}", e.errno or 0, e.strerror or "") from None
        undone(lab, ("iser target", iqn))
        return {"took_s": time.monotonic() - t0}


# -- the initiator
def iscsiadm(args: list[str], deadline_s: float, allow: tuple = ()) -> tuple[int, str]:
    """iscsiadm with args: (exit code, stdout). A code other than 0 or those in allow raises
    StepFailed with what it said."""
    argv = ["iscsiadm", *args]
    what = f"iscsiadm -m {args[1]}" if len(args) > 1 else "iscsiadm"
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=deadline_s)
    except subprocess.TimeoutExpired:
        raise StepFailed(what, _errno.ETIMEDOUT, f"{' '.join(argv)} still running after "
                         f"{deadline_s} s") from None
    except OSError as e:
        raise StepFailed(what, e.errno or 0, f"iscsiadm: {e.strerror}") from None
    if p.returncode not in (0, *allow):
        said = (p.stderr or p.stdout).strip()[-600:]
        raise StepFailed(what, 0, f"{' '.join(argv)} exited {p.returncode}: {said}")
    return p.returncode, p.stdout


def _iscsid_listening() -> bool:
    with open("/proc/net/unix") as f:
        return any(line.split()[-1] == ISCSID_SOCKET for line in f if len(line.split()) > 7)


def start_iscsid(deadline_s: float) -> None:
    """iscsid, started once per boot where none answers (a machine's own one is used), in
    the foreground of a session of its own, its log in RUN_DIR; back once it listens."""
    if _iscsid_listening():
        return
    os.makedirs(RUN_DIR, exist_ok=True)
    os.makedirs("/run/lock/iscsi", exist_ok=True)  # iscsiadm's and iscsid's lock files
    name_file = os.path.join(RUN_DIR, "initiatorname.iscsi")
    with open(name_file, "w") as f:
        f.write("InitiatorName=" + initiator_name(
            socket.gethostname(), read_attr("/proc/sys/kernel/random/boot_id") or "") + "\n")
    log = open(os.path.join(RUN_DIR, "iscsid.log"), "ab")
    proc = subprocess.Popen(["iscsid", "-f", "-i", name_file], stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    _ISCSID.append(proc)
    end = time.monotonic() + deadline_s
    while not _iscsid_listening():
        if proc.poll() is not None or time.monotonic() > end:
            with open(os.path.join(RUN_DIR, "iscsid.log"), errors="replace") as f:
                said = f.read()[-600:]
            raise StepFailed("start iscsid", 0 if proc.returncode is not None
                             else _errno.ETIMEDOUT, f"iscsid (exit {proc.returncode}): {said}")
        time.sleep(0.05)


def _iface(deadline_s: float) -> None:
    """Our iface record, bound to the iser transport."""
    _, out = iscsiadm(["-m", "iface"], deadline_s)
    if parse_ifaces(out).get(IFACE) != "iser":
        if IFACE not in parse_ifaces(out):
            iscsiadm(["-m", "iface", "-I", IFACE, "-o", "new"], deadline_s)
        iscsiadm(["-m", "iface", "-I", IFACE, "-o", "update", "-n", "iface.transport_name",
                  "-v", "iser"], deadline_s)


def _session(iqn: str, portal: str, deadline_s: float) -> Optional[dict]:
    code, out = iscsiadm(["-m", "session"], deadline_s, allow=(ERR_NO_OBJS_FOUND,))
    return next((s for s in parse_sessions(out) if s["target"] == iqn
                 and s["portal"] == portal and s["transport"] == "iser"), None)


def session_disk(sid: str) -> Optional[str]:
    """The SCSI disk of session sid's LUN (sdX), once the scan made it."""
    found = glob.glob(f"/sys/class/iscsi_session/session{sid}/device/target*/*:*:*:*/block/*")
    return os.path.basename(found[0]) if found else None


def _watch(lab, unit: str, path: str) -> None:
    old = _WATCHERS.pop(unit, None)
    if old is not None:
        old.stop()
    _WATCHERS[unit] = Watcher(lab, WORKLOAD, unit, path)


@answered
def login(lab, iqn: str, address: str, port: int, timeouts: dict, deadline_s: float) -> dict:
    """Discovers iqn at address:port through the iser iface and logs in with the scenario's
    timeouts: the session and its disk; Watchers follow both from here on."""
    portal = portal_name(address, port)
    with step(lab, WORKLOAD, "login", iqn=iqn, portal=portal, **timeouts) as data:
        # ib_iser brings scsi_transport_iscsi (iscsid's netlink); sd_mod makes the LUN a
        # disk, which no udev loads in a guest.
        modprobe("ib_iser", "sd_mod")
        start_iscsid(deadline_s)
        _iface(deadline_s)
        _, out = iscsiadm(["-m", "discovery", "-t", "st", "-p", portal, "-I", IFACE],
                          deadline_s)
        offered = parse_discovery(out)
        if not any(d["target"] == iqn and d["portal"] == portal for d in offered):
            raise StepFailed("iscsiadm -m discovery", 0, f"{portal} offers {offered}, not {iqn}")
        node = ["-m", "node", "-T", iqn, "-p", portal, "-I", IFACE]
        for name, value in node_settings(timeouts):
            iscsiadm([*node, "-o", "update", "-n", name, "-v", value], deadline_s)
        iscsiadm([*node, "--login"], deadline_s, allow=(ERR_SESS_EXISTS,))
        s = _session(iqn, portal, deadline_s)
        if s is None:
            raise StepFailed("iscsiadm --login", 0, f"no iser session of {iqn} at {portal} "
                             "after the login returned")
        end = time.monotonic() + deadline_s
        while (disk := session_disk(s["sid"])) is None:  # the LUN scan after the login
            if time.monotonic() > end:
                raise StepFailed("scan", _errno.ETIMEDOUT, f"session {s['sid']} shows no disk")
            time.sleep(0.05)
        session = f"session{s['sid']}"
        data.update(session=session, disk=disk)
        _watch(lab, session, f"/sys/class/iscsi_session/{session}/state")
        _watch(lab, disk, f"/sys/block/{disk}/device/state")
        at_close(lab, ("iser initiator", iqn),
                 lambda: logout(lab, iqn, address, port, CLEANUP_S))
        return {"session": session, "disk": disk, "device": f"/dev/{disk}"}


@answered
def state(lab, session: str, disk: str) -> dict:
    """The session's state (LOGGED_IN, FAILED, FREE) and its disk's (running, blocked,
    transport-offline, ...) as sysfs says now; "gone" for what is not there."""
    return {"session": read_attr(f"/sys/class/iscsi_session/{session}/state") or "gone",
            "disk": read_attr(f"/sys/block/{disk}/device/state") or "gone"}


@answered
def logout(lab, iqn: str, address: str, port: int, deadline_s: float) -> dict:
    """Logs out of iqn at address:port and forgets the node and discovery records made for
    it (a real host's /etc/iscsi keeps nothing of the workload)."""
    portal = portal_name(address, port)
    with step(lab, WORKLOAD, "logout", iqn=iqn, portal=portal):
        node = ["-m", "node", "-T", iqn, "-p", portal, "-I", IFACE]
        _, out = iscsiadm([*node, "--logout"], deadline_s, allow=(ERR_NO_OBJS_FOUND,))
        iscsiadm([*node, "-o", "delete"], deadline_s, allow=(ERR_NO_OBJS_FOUND,))
        iscsiadm(["-m", "discoverydb", "-t", "st", "-p", portal, "-I", IFACE, "-o", "delete"],
                 deadline_s, allow=(ERR_NO_OBJS_FOUND,))
        undone(lab, ("iser initiator", iqn))
        return {"said": out.strip()[-300:]}
