"""End-to-end check of the VM lab: two VMs, the RDMA device, rping and ibv_rc_pingpong.

For each provider (rxe, then siw): boot two VMs, check `rdma link` and `ibv_devices` name
the device and that `modprobe nvme-rdma` loads it, run rping between them (rdma_cm), and on
rxe ibv_rc_pingpong too (siw cannot: it needs rdma_cm to connect). Any failure raises with
the serial log tails.
"""
from __future__ import annotations

import re
import socket
import threading
import time
from typing import Callable

from . import pcap
from ..machine import MachineError
from .vm import VmGroup, Result, Vm, VmError

BOOT_DEADLINE_S = 120.0
SERVER_DEADLINE_S = 60.0
PINGPONG_ITERS = 200
RPING_COUNT = 10
# Prints the index of the IPv4-mapped GID (::ffff:a.b.c.d): RoCEv2 over IPv4 on rxe.
GID_INDEX = ("for f in /sys/class/infiniband/{dev}/ports/1/gids/*; do "
             "case $(cat $f) in 0000:0000:0000:0000:0000:ffff:*) basename $f; break;; esac; done")


def _in_background(fn: Callable[[], Result]) -> Callable[[], Result]:
    """Starts fn in a thread; the returned callable joins it and gives its result."""
    box: dict[str, object] = {}

    def body() -> None:
        try:
            box["r"] = fn()
        except Exception as exc:  # handed to the joining thread
            box["e"] = exc

    t = threading.Thread(target=body, daemon=True)
    t.start()

    def join() -> Result:
        t.join(SERVER_DEADLINE_S + 30.0)
        if "e" in box:
            raise box["e"]  # type: ignore[misc]
        if "r" not in box:
            raise VmError("background command gave no result")
        return box["r"]  # type: ignore[return-value]
    return join


def _wait_tcp_listen(vm: Vm, port: int, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if f":{port} " in vm.run("ss -ltnH", 10).out:
            return
        time.sleep(0.3)
    raise VmError(f"{vm.spec.name}: nothing listens on {port} after {deadline_s} s\n"
                  f"{vm.diagnostic()}")


def check_device(vm: Vm, dev: str) -> str:
    r = vm.run("rdma link; ibv_devices", 30).check(f"{vm.spec.name}: rdma link")
    if f"link {dev}/1 state ACTIVE" not in r.out or dev not in r.out.split("rdma link")[-1]:
        raise VmError(f"{vm.spec.name}: {dev} not ACTIVE:\n{r.out}")
    return r.out


def check_modprobe(vm: Vm) -> None:
    """modprobe finds the guest kernel's modules and their dependencies (moddep.py)."""
    r = vm.run("modprobe nvme-rdma && lsmod", 60).check(f"{vm.spec.name}: modprobe nvme-rdma")
    loaded = {line.split()[0] for line in r.out.splitlines()[1:] if line.strip()}
    if not {"nvme_rdma", "nvme_fabrics"} <= loaded:
        raise VmError(f"{vm.spec.name}: modprobe nvme-rdma loaded {sorted(loaded)}")


def rping(server: Vm, client: Vm) -> dict:
    join = _in_background(lambda: server.run(
        f"rping -s -a {server.spec.ip} -C {RPING_COUNT} -v", SERVER_DEADLINE_S))
    time.sleep(1.5)  # rping has no readiness signal: the client retries instead
    for attempt in range(5):
        c = client.run(f"rping -c -a {server.spec.ip} -C {RPING_COUNT} -v", 30)
        if c.rc == 0:
            break
        time.sleep(1.0)
    c.check(f"rping client (attempt {attempt + 1})")
    s = join().check("rping server")
    pings = c.out.count("ping data:")
    if pings != RPING_COUNT:
        raise VmError(f"rping: {pings} pings, expected {RPING_COUNT}\n{c.out}")
    return {"client_s": c.elapsed_s, "server_s": s.elapsed_s, "pings": pings,
            "client_attempts": attempt + 1}


def rc_pingpong(server: Vm, client: Vm, dev: str) -> dict:
    gid = server.run(GID_INDEX.format(dev=dev), 10).check("gid index").out.strip()
    if not gid:
        raise VmError(f"{server.spec.name}: no IPv4-mapped GID on {dev}")
    base = f"ibv_rc_pingpong -d {dev} -g {gid} -n {PINGPONG_ITERS}"
    join = _in_background(lambda: server.run(base, SERVER_DEADLINE_S))
    _wait_tcp_listen(server, 18515, 20.0)
    c = client.run(f"{base} {server.spec.ip}", SERVER_DEADLINE_S).check("ibv_rc_pingpong client")
    join().check("ibv_rc_pingpong server")
    m = re.search(r"(\d+) iters in ([\d.]+) seconds = ([\d.]+) usec/iter", c.out)
    if not m or int(m.group(1)) != PINGPONG_ITERS:
        raise VmError(f"ibv_rc_pingpong: unexpected output\n{c.out}")
    return {"gid_index": int(gid), "iters": int(m.group(1)), "usec_per_iter": float(m.group(3)),
            "client_s": c.elapsed_s}


def check_share(vm: Vm) -> None:
    """The read-write 9p share: what the guest writes at /vmlab appears on the host."""
    vm.run(f"echo {vm.spec.name} $(uname -r) > /vmlab/hello", 10).check("write /vmlab")
    text = (vm.share / "hello").read_text() if (vm.share / "hello").exists() else ""
    if not text.startswith(vm.spec.name):
        raise VmError(f"{vm.spec.name}: share file reads {text!r}")


def check_ssh(vm: Vm) -> None:
    r = vm.ssh("hostname", 30).check(f"{vm.spec.name}: ssh hostname")
    if r.out.strip() != vm.spec.name:
        raise VmError(f"{vm.spec.name}: ssh reached {r.out.strip()!r}")


def check_isolation(vm: Vm) -> None:
    """restrict=on: the guest reaches nothing through the user-mode NIC, not even a listener
    on the host's loopback (which 10.0.2.2 would map to without restrict)."""
    with socket.socket() as bait:
        bait.bind(("127.0.0.1", 0))
        bait.listen(1)
        bait.setblocking(False)
        port = bait.getsockname()[1]
        targets = f"10.0.2.2/{port} 10.0.2.2/22 10.0.2.3/53 1.1.1.1/443"
        probe = (f"for t in {targets}; do timeout 5 bash -c \"echo > /dev/tcp/$t\" "
                 "2>/dev/null && echo OPEN $t; done; true")
        r = vm.run(probe, 60).check(f"{vm.spec.name}: isolation probe")
        try:
            bait.accept()[0].close()
            reached = True
        except BlockingIOError:
            reached = False
    if "OPEN" in r.out or reached:
        raise VmError(f"{vm.spec.name}: the guest reached outside: {r.out} (host bait: {reached})")


def crash_and_reboot(lab: VmGroup, dev: str, log: Callable[[str], None]) -> dict:
    """SIGKILL the second VM, boot it again on the same socket and MAC, rping again."""
    a, b = lab.vms
    b.kill()
    ready = b.reboot(BOOT_DEADLINE_S)
    check_device(b, dev)
    log(f"{b.spec.name} rebooted after SIGKILL: ready in {ready:.2f} s")
    return {"ready_s": round(ready, 2), "rping": rping(a, b)}


def run_provider(rdma: str, log: Callable[[str], None], reboot: bool = False) -> dict:
    dev = f"{rdma}0"
    t0 = time.monotonic()
    with VmGroup(2, rdma=rdma) as lab:
        try:
            report = _exercise(lab, rdma, dev, log, reboot)
        except MachineError as exc:  # add every VM's serial log, whichever step failed
            tails = "\n".join(vm.diagnostic() for vm in lab.vms)
            raise VmError(f"{rdma}: {exc}\n{tails}") from exc
        t_off = time.monotonic()
    report["poweroff_s"] = round(time.monotonic() - t_off, 2)
    report["total_s"] = round(time.monotonic() - t0, 2)
    log(f"{rdma}: powered off in {report['poweroff_s']} s; total {report['total_s']} s")
    return report


def _exercise(lab: VmGroup, rdma: str, dev: str, log: Callable[[str], None], reboot: bool) -> dict:
    report: dict = {"workdir": str(lab.workdir)}
    lab.start_all()
    report["ready_s"] = [round(t, 2) for t in lab.wait_all_ready(BOOT_DEADLINE_S)]
    log(f"{rdma}: both VMs ready {report['ready_s']} s after qemu start")
    for vm in lab.vms:
        check_device(vm, dev)
        check_share(vm)
        check_ssh(vm)
    check_isolation(lab.vms[0])
    check_modprobe(lab.vms[0])
    log(f"{rdma}: {dev} ACTIVE in both (rdma link, ibv_devices); 9p share writable; ssh works; "
        "no way out through the control NIC; modprobe loads nvme-rdma")
    a, b = lab.vms
    report["rping"] = rping(a, b)
    log(f"{rdma}: rping {report['rping']}")
    if rdma == "rxe":
        report["rc_pingpong"] = rc_pingpong(a, b, dev)
        log(f"{rdma}: ibv_rc_pingpong {report['rc_pingpong']}")
    if rdma == "rxe" and lab.pcap is not None:
        report["fabric"] = fabric_summary(lab.pcap)
        log(f"{rdma}: switch capture {report['fabric']}")
    if reboot:
        report["reboot"] = crash_and_reboot(lab, dev, log)
        log(f"{rdma}: after reboot, rping {report['reboot']['rping']}")
    return report


def fabric_summary(path) -> dict:
    """RoCEv2 frames and CM messages the switch carried; rping must have connected (REQ,
    REP, RTU) and disconnected (DREQ, DREP) through it."""
    time.sleep(0.5)  # the switch flushes when its queue runs dry
    roce, cm = 0, []
    for _, frame in pcap.read(path):
        roce += pcap.bth(frame) is not None
        msg = pcap.cm_message(frame)
        if msg:
            cm.append(msg)
    missing = [m for m in ("REQ", "REP", "RTU", "DREQ", "DREP") if m not in cm]
    if missing:
        raise VmError(f"{path}: no {missing} among CM messages {cm}")
    return {"roce_frames": roce, "cm": cm}
