"""The host side of the NVMe over Fabrics workload (rdmalab.workloads.nvme), run in a host's
agent.

The target is nvmet-rdma configured through configfs, the layout nvmetcli writes
(drivers/nvme/target/configfs.c): a subsystem that allows any host, one namespace on a block
device, one RDMA port bound to it. The initiator connects with nvme-cli (`nvme connect -t rdma`
with the scenario's keep-alive, reconnect-delay and ctrl-loss timeouts; fast_io_fail_tmo, which
nvme-cli 2.3 has no option for, through the controller's sysfs attribute), and its controller's
state file is watched (Watcher: `ulp_state` records)."""

from __future__ import annotations

import glob
import os
import time
import uuid

from .host import (StepFailed, Watcher, answered, at_close, configfs, ensure_dir, modprobe,
                   read_attr, run, set_attr, step, undone, write_attr)

WORKLOAD = "nvme"
PORT_ID = "1"  # the configfs port's name; the scenario's trsvcid is its address
_WATCHERS: dict[str, Watcher] = {}
CLEANUP_S = 30.0  # a disconnect left to the lab's close (the scenario failed before its own)


def _nvmet() -> str:
    return os.path.join(configfs(), "nvmet")


def stable_ids(nqn: str) -> dict:
    """The subsystem's serial and the namespace's UUID and NGUID, the same at every export of
    nqn: nvmet makes random ones per namespace, and a host that reconnects to a namespace
    whose identifiers changed removes it ("identifiers changed for nsid 1",
    nvme_validate_ns; the NVMe base specification: a namespace's NGUID and UUID do not change
    for its life). A target restored after a reboot keeps them, as nvmetcli's saved
    configuration does."""
    u = uuid.uuid5(uuid.NAMESPACE_URL, nqn)
    return {"uuid": str(u), "nguid": str(uuid.UUID(bytes=u.bytes[::-1])),
            "serial": u.hex[:20]}


@answered
def target_up(lab, nqn: str, device: str, address: str, port: int) -> dict:
    """Exports device as namespace 1 of subsystem nqn on an RDMA port at address:port."""
    with step(lab, WORKLOAD, "target_up", nqn=nqn, device=device, traddr=address,
              trsvcid=port):
        modprobe("nvmet", "nvmet-rdma")
        root = _nvmet()
        sub = os.path.join(root, "subsystems", nqn)
        ensure_dir(sub)
        write_attr(os.path.join(sub, "attr_allow_any_host"), "1")
        ids = stable_ids(nqn)
        set_attr(os.path.join(sub, "attr_serial"), ids["serial"])
        ns = os.path.join(sub, "namespaces", "1")
        ensure_dir(ns)
        if read_attr(os.path.join(ns, "enable")) != "1":
            write_attr(os.path.join(ns, "device_path"), device)
            write_attr(os.path.join(ns, "device_uuid"), ids["uuid"])
            write_attr(os.path.join(ns, "device_nguid"), ids["nguid"])
            write_attr(os.path.join(ns, "enable"), "1")
        p = os.path.join(root, "ports", PORT_ID)
        ensure_dir(p)
        for attr, value in (("addr_trtype", "rdma"), ("addr_adrfam", "ipv4"),
                            ("addr_traddr", address), ("addr_trsvcid", str(port))):
            set_attr(os.path.join(p, attr), value)
        link = os.path.join(p, "subsystems", nqn)
        if not os.path.islink(link):
            try:
                os.symlink(sub, link)
            except OSError as e:
                raise StepFailed(f"bind {nqn} to port {PORT_ID}", e.errno or 0,
                                 e.strerror or "") from None
        at_close(lab, ("target", nqn), lambda: target_down(lab, nqn))
        return {"subsystem": sub}


@answered
def target_down(lab, nqn: str) -> dict:
    """Undoes target_up, innermost first (the port's link, the port, the namespace, the
    subsystem): what is already gone is skipped."""
    t0 = time.monotonic()
    with step(lab, WORKLOAD, "target_down", nqn=nqn):
        root = _nvmet()
        sub = os.path.join(root, "subsystems", nqn)
        p = os.path.join(root, "ports", PORT_ID)
        for path, undo in ((os.path.join(p, "subsystems", nqn), os.unlink), (p, os.rmdir),
                           (os.path.join(sub, "namespaces", "1", "enable"), None),
                           (os.path.join(sub, "namespaces", "1"), os.rmdir), (sub, os.rmdir)):
            if not os.path.lexists(path):
                continue
            try:
                if undo is None:
                    write_attr(path, "0")
                else:
                    undo(path)
            except OSError as e:
                raise StepFailed(f"remove {path}", e.errno or 0, e.strerror or "") from None
        undone(lab, ("target", nqn))
        return {"took_s": time.monotonic() - t0}


def _controllers(nqn: str) -> list[str]:
    return sorted(os.path.basename(os.path.dirname(p))
                  for p in glob.glob("/sys/class/nvme/nvme*/subsysnqn")
                  if read_attr(p) == nqn and read_attr(os.path.join(os.path.dirname(p),
                                                                    "transport")) == "rdma")


def _namespace(ctrl: str) -> str:
    """The block device of the controller's namespace 1. Its name numbers the namespace's
    instance, not its nsid: nvmeXnY (no multipath), or with native multipath the path
    nvmeScCnY under the controller and its head nvmeSnY, what I/O goes to. A head still held
    open after its controller went (an application's descriptor) keeps its instance, so the
    namespace seen again through a new controller gets another Y: found by its nsid file."""
    for path in sorted(glob.glob(f"/sys/class/nvme/{ctrl}/nvme*n*")):
        if read_attr(os.path.join(path, "nsid")) != "1":
            continue
        name = os.path.basename(path)
        if "c" in name[4:]:  # a path device nvmeScCnY: its head is nvmeSnY
            s, rest = name[4:].split("c", 1)
            name = f"nvme{s}n{rest.split('n', 1)[1]}"
        if os.path.exists(f"/dev/{name}"):
            return f"/dev/{name}"
    raise StepFailed("namespace", 0, f"{ctrl} shows no namespace 1")


@answered
def connect(lab, nqn: str, address: str, port: int, timeouts: dict,
            deadline_s: float) -> dict:
    """nvme connect -t rdma to the target, with the scenario's timeouts; its controller and
    namespace device; a Watcher follows the controller's state from here on."""
    with step(lab, WORKLOAD, "connect", nqn=nqn, traddr=address, trsvcid=port,
              **timeouts) as data:
        modprobe("nvme-rdma")
        argv = ["nvme", "connect", "-t", "rdma", "-a", address, "-s", str(port), "-n", nqn]
        for opt, key in (("--keep-alive-tmo", "keep_alive_tmo"),
                         ("--reconnect-delay", "reconnect_delay"),
                         ("--ctrl-loss-tmo", "ctrl_loss_tmo")):
            if timeouts.get(key) is not None:
                argv.append(f"{opt}={timeouts[key]}")
        run(argv, deadline_s, "nvme connect")
        ctrls = _controllers(nqn)
        if not ctrls:
            raise StepFailed("nvme connect", 0, f"no rdma controller of {nqn} in sysfs after "
                             "nvme connect returned")
        ctrl = ctrls[-1]
        if timeouts.get("fast_io_fail_tmo") is not None:
            write_attr(f"/sys/class/nvme/{ctrl}/fast_io_fail_tmo",
                       str(timeouts["fast_io_fail_tmo"]))
        end = time.monotonic() + deadline_s
        while True:  # the namespace's block device appears after the scan
            try:
                device = _namespace(ctrl)
                break
            except StepFailed:
                if time.monotonic() > end:
                    raise
                time.sleep(0.05)
        data.update(ctrl=ctrl, device=device)
        old = _WATCHERS.pop(ctrl, None)
        if old is not None:
            old.stop()
        _WATCHERS[ctrl] = Watcher(lab, WORKLOAD, ctrl, f"/sys/class/nvme/{ctrl}/state")
        at_close(lab, ("initiator", nqn), lambda: disconnect(lab, nqn, CLEANUP_S))
        return {"ctrl": ctrl, "device": device}


@answered
def state(lab, ctrl: str) -> dict:
    """The controller's state as its sysfs file says now ("gone" when it is not there)."""
    return {"state": read_attr(f"/sys/class/nvme/{ctrl}/state") or "gone"}


@answered
def disconnect(lab, nqn: str, deadline_s: float) -> dict:
    """nvme disconnect -n nqn: every controller of the subsystem deleted."""
    with step(lab, WORKLOAD, "disconnect", nqn=nqn):
        out = run(["nvme", "disconnect", "-n", nqn], deadline_s, "nvme disconnect")
        undone(lab, ("initiator", nqn))
        return {"said": out.strip()[-300:]}
