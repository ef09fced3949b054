"""The host side of the SRP workload (rdmalab.workloads.srp), run in a host's agent.

The target is LIO with the ib_srpt fabric, configured through configfs in the order blktests'
tests/srp/rc writes it (start_lio_srpt, configure_target_ports) and the kernel accepts it
(drivers/infiniband/ulp/srpt/ib_srpt.c, drivers/target/target_core_configfs.c): an iblock
storage object on the backing device with a T10 unit serial of its own, ib_srpt's RDMA/CM
listener (srpt/discovery_auth/rdma_cm_port: a configfs attribute on 6.1, a listener on any
address of the initial namespace), the port named by its GID 0 in the "0x<32 hex digits>"
form (srpt_make_tport; srpt_lookup_port), one TPG with LUN 0, an ACL for the initiator (ib_srpt
has no demo mode) naming its SRP initiator port identifier, and the TPG enabled last.

The initiator is ib_srp over RDMA/CM: a login string written to
/sys/class/infiniband_srp/srp-<device>-<port>/add_target makes a SCSI host, its SRP remote
port (/sys/class/srp_remote_ports/port-<host>:1) and, after the scan, the disk of LUN 0; the
scenario's reconnect_delay, fast_io_fail_tmo and dev_loss_tmo are written to the remote port;
both the remote port's state and the disk's are watched (Watcher: `ulp_state` records)."""

from __future__ import annotations

import errno as _errno
import glob
import json
import os
import time
import uuid
from typing import Optional

from .host import (StepFailed, Watcher, answered, at_close, configfs, ensure_dir, modprobe,
                   read_attr, run, set_attr, step, undone, write_attr)

WORKLOAD = "srp"
HBA = "iblock_1"       # iSER's object is iblock_0's (iser_host.HBA)
OBJECT = "rdmalab-srp"
TPG = "tpgt_1"         # any name: srpt_make_tpg ignores it
LUN = "lun_0"
LUN_LINK = "rdmalab-srp"
# The remote port's timeouts, in the order that keeps every intermediate combination valid
# from the kernel's defaults (srp_tmo_valid: fast_io_fail_tmo < dev_loss_tmo).
TIMEOUTS = ("reconnect_delay", "dev_loss_tmo", "fast_io_fail_tmo")
SCSI_DEVICE_BLOCK_MAX_TIMEOUT = 600  # include/scsi/scsi_device.h: srp_tmo_valid's ceiling
_WATCHERS: dict[str, Watcher] = {}
CLEANUP_S = 30.0  # a logout left to the lab's close (the scenario failed before its own)


# -- what can be computed without a kernel (tests/python/test_py_srp.py)
def gid_hex(gid: str) -> str:
    """A GID as sysfs prints it (fe80:0000:...:0001) as 32 hex digits."""
    digits = gid.replace(":", "").lower()
    if len(digits) != 32 or any(c not in "0123456789abcdef" for c in digits):
        raise ValueError(f"not a GID: {gid!r}")
    return digits


def tport_name(gid: str) -> str:
    """ib_srpt's name of a port by its GID 0 (srpt_refresh_port: gid_name, "0x%016llx%016llx";
    srpt_lookup_port takes it for any link layer, unlike the GUID form)."""
    return "0x" + gid_hex(gid)


def initiator_port_id(gid: str) -> tuple[str, str]:
    """(initiator_ext, the SRP initiator port identifier) of an initiator whose GID 0 is gid:
    ib_srp sends initiator_ext then its GID's interface id (srp_send_req), and with
    initiator_ext = the GID's subnet prefix (as blktests' do_rdma_cm_login) the identifier is
    the GID itself; ib_srpt looks its ACL up as "0x" and 32 hex digits (srpt_cm_req_recv)."""
    digits = gid_hex(gid)
    return digits[:16], "0x" + digits


def login_string(guid: str, address: str, port: int, initiator_ext: str,
                 source: str = "", tl_retry_count: Optional[int] = None) -> str:
    """ib_srp's add_target options for an RDMA/CM login (srp_parse_options; mandatory over
    RDMA/CM: id_ext, ioc_guid, dest): the target port identifier is id_ext then ioc_guid, both
    ib_srpt's srpt_service_guid, which it checks (srpt_cm_req_recv). tl_retry_count: the RC
    QP's transport retry count (2..7; ib_srp's default 7)."""
    g = guid.lower().removeprefix("0x")
    if not g or len(g) > 16 or any(c not in "0123456789abcdef" for c in g):
        raise ValueError(f"not a 64-bit GUID: {guid!r}")
    dest = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
    opts = [f"id_ext={g}", f"ioc_guid={g}", f"initiator_ext={initiator_ext}", f"dest={dest}"]
    if source:  # an IPv6 one bracketed too: srp_parse_in takes the last ':' for a port's
        opts.append(f"src=[{source}]" if ":" in source else f"src={source}")
    if tl_retry_count is not None:
        opts.append(f"tl_retry_count={tl_retry_count}")
    return ",".join(opts)


def tmo_text(value) -> str:
    """A remote port timeout as its sysfs file takes and shows it: seconds or "off"."""
    return "off" if value == "off" else str(int(value))


def unit_serial(name: str) -> str:
    """The LUN's T10 unit serial, the same at every export of name (a host that sees a
    device's identity change takes it for another disk)."""
    return uuid.uuid5(uuid.NAMESPACE_URL, "srp:" + name).hex[:32]


def target_paths(root: str, gid: str, acl: str) -> dict:
    """The configfs paths of the target under root (/sys/kernel/config/target)."""
    obj = os.path.join(root, "core", HBA, OBJECT)
    tpg = os.path.join(root, "srpt", tport_name(gid), TPG)
    return {"hba": os.path.join(root, "core", HBA), "object": obj,
            "serial": os.path.join(obj, "wwn", "vpd_unit_serial"),
            "fabric": os.path.join(root, "srpt"),
            "cm_port": os.path.join(root, "srpt", "discovery_auth", "rdma_cm_port"),
            "tport": os.path.dirname(tpg), "tpg": tpg,
            "lun": os.path.join(tpg, "lun", LUN), "lun_link": os.path.join(tpg, "lun", LUN,
                                                                           LUN_LINK),
            "acl": os.path.join(tpg, "acls", acl),
            "mapped": os.path.join(tpg, "acls", acl, LUN),
            "mapped_link": os.path.join(tpg, "acls", acl, LUN, LUN)}


def parse_links(text: str) -> list[dict]:
    """`rdma -j link show` as device, port, netdev (absent where the link has none)."""
    return [{"device": e.get("ifname", ""), "port": int(e.get("port", 1)),
             "netdev": e.get("netdev", "")} for e in json.loads(text or "[]")]


# -- the RDMA port of an address
def _addr_info(netdev: str) -> list:
    got = json.loads(run(["ip", "-j", "addr", "show", "dev", netdev], 30.0, "ip addr") or "[]")
    return [a for i in got for a in i.get("addr_info", [])]


def link_local(addr_info: list) -> str:
    """The netdev's IPv6 link-local address ("" where it has none)."""
    return next((a["local"] for a in addr_info if a.get("family") == "inet6"
                 and a.get("scope") == "link"), "")


@answered
def port_of(lab, address: str) -> dict:
    """The RDMA device and port whose netdev holds address, the port's GID 0, and the
    netdev's IPv6 link-local address and ifindex (its scope)."""
    links = parse_links(run(["rdma", "-j", "link", "show"], 30.0, "rdma link show"))
    for ln in links:
        info = _addr_info(ln["netdev"]) if ln["netdev"] else []
        if any(a.get("local") == address for a in info):
            break
    else:
        raise StepFailed("port_of", _errno.ENODEV, f"no RDMA link's netdev holds {address}: "
                         f"{links}")
    gid = read_attr(f"/sys/class/infiniband/{ln['device']}/ports/{ln['port']}/gids/0") or ""
    return {"device": ln["device"], "port": ln["port"], "gid": gid,
            "link_local": link_local(info),
            "ifindex": int(read_attr(f"/sys/class/net/{ln['netdev']}/ifindex") or 0)}


# -- the target
def _link(src: str, link: str) -> None:
    if not os.path.islink(link):
        try:
            os.symlink(src, link)
        except OSError as e:
            raise StepFailed(f"link {link}", e.errno or 0, e.strerror or "") from None


def _storage_object(p: dict, device: str, serial: str) -> None:
    ensure_dir(p["hba"])
    ensure_dir(p["object"])
    if read_attr(os.path.join(p["object"], "enable")) != "1":
        write_attr(os.path.join(p["object"], "udev_path"), device)
        write_attr(os.path.join(p["object"], "control"), f"udev_path={device}")
        write_attr(os.path.join(p["object"], "enable"), "1")
    if (read_attr(p["serial"]) or "").partition(":")[2].strip() != serial:
        write_attr(p["serial"], serial)  # EINVAL once a LUN exports it


@answered
def target_up(lab, name: str, device: str, gid: str, cm_port: int,
              initiator_gid: str) -> dict:
    """Exports device as LUN 0 of ib_srpt's port of GID gid to the initiator of initiator_gid,
    listening for RDMA/CM logins on cm_port: the srpt_service_guid a login names."""
    acl = initiator_port_id(initiator_gid)[1]
    with step(lab, WORKLOAD, "target_up", target=name, device=device, tport=tport_name(gid),
              rdma_cm_port=cm_port, acl=acl):
        modprobe("target_core_mod", "target_core_iblock", "ib_srpt")
        p = target_paths(os.path.join(configfs(), "target"), gid, acl)
        _storage_object(p, device, unit_serial(name))
        ensure_dir(p["fabric"])
        set_attr(p["cm_port"], str(cm_port))  # srpt_rdma_cm_port_store: rdma_listen on any address
        for d in ("tport", "tpg", "lun"):
            ensure_dir(p[d])
        _link(p["object"], p["lun_link"])
        ensure_dir(p["acl"])
        ensure_dir(p["mapped"])
        _link(p["lun"], p["mapped_link"])
        set_attr(os.path.join(p["tpg"], "enable"), "1")
        guid = read_attr("/sys/module/ib_srpt/parameters/srpt_service_guid") or ""
        at_close(lab, ("target", name), lambda: target_down(lab, name))
        return {"guid": guid, "tport": tport_name(gid)}


def _undo(path: str, how) -> None:
    if not os.path.lexists(path):
        return
    try:
        if isinstance(how, str):
            set_attr(path, how)
        else:
            how(path)
    except OSError as e:
        raise StepFailed(f"remove {path}", e.errno or 0, e.strerror or "") from None


@answered
def target_down(lab, name: str) -> dict:
    """Undoes target_up on every ib_srpt port, innermost first (each TPG disabled: its
    channels closed and their QPs drained), the listener closed (rdma_cm_port 0) and ib_srpt
    unloaded (its per-device PD goes with it); what is gone already is skipped."""
    t0 = time.monotonic()
    with step(lab, WORKLOAD, "target_down", target=name):
        root = os.path.join(configfs(), "target")
        for tpg in glob.glob(os.path.join(root, "srpt", "0x*", "*")):
            if not os.path.isdir(os.path.join(tpg, "lun")):
                continue
            _undo(os.path.join(tpg, "enable"), "0")
            for mapped in glob.glob(os.path.join(tpg, "acls", "*", "lun_*")):
                for link in glob.glob(os.path.join(mapped, "*")):
                    if os.path.islink(link):
                        _undo(link, os.unlink)
                _undo(mapped, os.rmdir)
            for acl in glob.glob(os.path.join(tpg, "acls", "*")):
                _undo(acl, os.rmdir)
            for lun in glob.glob(os.path.join(tpg, "lun", "lun_*")):
                for link in glob.glob(os.path.join(lun, "*")):
                    if os.path.islink(link):
                        _undo(link, os.unlink)
                _undo(lun, os.rmdir)
            _undo(tpg, os.rmdir)
            _undo(os.path.dirname(tpg), os.rmdir)
        for tport in glob.glob(os.path.join(root, "srpt", "0x*")):
            _undo(tport, os.rmdir)
        _undo(os.path.join(root, "srpt", "discovery_auth", "rdma_cm_port"), "0")
        _undo(os.path.join(root, "srpt"), os.rmdir)
        _undo(os.path.join(root, "core", HBA, OBJECT), os.rmdir)
        _undo(os.path.join(root, "core", HBA), os.rmdir)
        if os.path.exists("/sys/module/ib_srpt"):
            run(["modprobe", "-r", "ib_srpt"], 60.0, "modprobe -r ib_srpt")
        undone(lab, ("target", name))
        return {"took_s": time.monotonic() - t0}


# -- the initiator
def _hosts(guid: str, device: str) -> list[int]:
    """The SCSI hosts ib_srp made for target guid on device, oldest first."""
    want = "0x" + guid.lower().removeprefix("0x").rjust(16, "0")
    found = []
    for path in glob.glob("/sys/class/scsi_host/host*/id_ext"):
        d = os.path.dirname(path)
        if read_attr(path) == want and read_attr(os.path.join(d, "local_ib_device")) == device:
            found.append(int(os.path.basename(d)[4:]))
    return sorted(found)


def host_disk(host: int) -> Optional[str]:
    """LUN 0's disk (sdX) of SCSI host host, once the scan made it."""
    found = glob.glob(f"/sys/class/scsi_device/{host}:*:*:0/device/block/*")
    return os.path.basename(found[0]) if found else None


def _watch(lab, unit: str, path: str) -> None:
    old = _WATCHERS.pop(unit, None)
    if old is not None:
        old.stop()
    _WATCHERS[unit] = Watcher(lab, WORKLOAD, unit, path)


def set_timeouts(rport: str, timeouts: dict) -> dict:
    """Writes the scenario's timeouts (None: the kernel's) to the remote port, retrying those
    the current combination refused (srp_tmo_valid checks each write against the others):
    what the port shows afterwards."""
    want = {k: tmo_text(timeouts[k]) for k in TIMEOUTS if timeouts.get(k) is not None}
    for last in (False, False, True):
        for k, v in want.items():
            path = f"/sys/class/srp_remote_ports/{rport}/{k}"
            if read_attr(path) == v:
                continue
            try:
                write_attr(path, v)
            except StepFailed as e:
                if last or e.errno != _errno.EINVAL:
                    raise
    return {k: read_attr(f"/sys/class/srp_remote_ports/{rport}/{k}") for k in TIMEOUTS}


@answered
def login(lab, options: str, device: str, port: int, guid: str, timeouts: dict,
          deadline_s: float) -> dict:
    """Writes the login string to ib_srp's add_target of device:port (already connected to
    that target: its existing host is taken), sets the remote port's timeouts: the SCSI host,
    remote port and disk; Watchers follow the port and the disk from here on."""
    with step(lab, WORKLOAD, "login", options=options, **timeouts) as data:
        # sd_mod makes LUN 0 a disk: no udev loads it in a guest.
        modprobe("ib_srp", "sd_mod")
        add = f"/sys/class/infiniband_srp/srp-{device}-{port}/add_target"
        try:
            write_attr(add, options)
        except StepFailed as e:
            if e.errno != _errno.EEXIST or not _hosts(guid, device):
                raise
        hosts = _hosts(guid, device)
        if not hosts:
            raise StepFailed("add_target", 0, f"no SCSI host of id_ext {guid} on {device} "
                             "after add_target took the login")
        host = hosts[-1]
        rport = f"port-{host}:1"
        applied = set_timeouts(rport, timeouts)
        end = time.monotonic() + deadline_s
        while (disk := host_disk(host)) is None:  # sd's probe after the scan
            if time.monotonic() > end:
                raise StepFailed("scan", _errno.ETIMEDOUT, f"SCSI host {host} shows no disk")
            time.sleep(0.05)
        if timeouts.get("scsi_timeout") is not None:  # sd's command timeout (scsi_sysfs.c)
            write_attr(f"/sys/block/{disk}/device/timeout", str(timeouts["scsi_timeout"]))
        applied["scsi_timeout"] = read_attr(f"/sys/block/{disk}/device/timeout")
        data.update(scsi_host=host, rport=rport, disk=disk, applied=applied)
        _watch(lab, rport, f"/sys/class/srp_remote_ports/{rport}/state")
        _watch(lab, disk, f"/sys/block/{disk}/device/state")
        at_close(lab, ("initiator", rport), lambda: logout(lab, rport, CLEANUP_S))
        return {"host": host, "rport": rport, "disk": disk, "device": f"/dev/{disk}",
                "applied": applied}


@answered
def state(lab, rport: str, disk: str) -> dict:
    """The remote port's state (running, blocked, fail-fast, lost) and its disk's (running,
    blocked, transport-offline, ...) as sysfs says now; "gone" for what is not there."""
    return {"rport": read_attr(f"/sys/class/srp_remote_ports/{rport}/state") or "gone",
            "disk": read_attr(f"/sys/block/{disk}/device/state") or "gone"}


@answered
def logout(lab, rport: str, deadline_s: float) -> dict:
    """Deletes the remote port (ib_srp removes its SCSI host: srp_rport_delete), waits until
    the host is gone, and unloads ib_srp where no other host of it is left (its per-device PD
    goes with it)."""
    host = rport.removeprefix("port-").split(":")[0]
    with step(lab, WORKLOAD, "logout", rport=rport):
        delete = f"/sys/class/srp_remote_ports/{rport}/delete"
        if os.path.exists(delete):
            write_attr(delete, "1")
        end = time.monotonic() + deadline_s
        while os.path.exists(f"/sys/class/scsi_host/host{host}"):
            if time.monotonic() > end:
                raise StepFailed("logout", _errno.ETIMEDOUT, f"SCSI host {host} still there "
                                 f"{deadline_s} s after {delete}")
            time.sleep(0.05)
        undone(lab, ("initiator", rport))
        if os.path.exists("/sys/module/ib_srp") and \
                not glob.glob("/sys/class/srp_remote_ports/*"):
            run(["modprobe", "-r", "ib_srp"], 60.0, "modprobe -r ib_srp")
        return {}
