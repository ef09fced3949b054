"""The labs: how long from nothing to every host ready.

For the qemu VM lab (bindings/rdmalab/machines/vmlab) with rxe and with siw: from the call that makes the lab
(vm.VmGroup: kernel and initrd checked, switch started) until every guest's agent answered
(VmGroup.wait_all_ready), with no VM of this run before. Two hosts, the lab scenarios use,
measured ROUNDS times each (median), beside the same measurement for one host alone in the
same run: the ratio says what the second host costs on this machine (two TCG guests share
its cores). The goal is absolute: two hosts ready within GOAL_S, printed in the note.

Each boot's console stamps (init.sh's `vmlab-init: [uptime]`, the agent's `VMLAB-READY ...
uptime`) split the time: before the guest kernel's clock starts (qemu, firmware, kernel
decompression), kernel to init's modules, 9p root and network, rdma link, the agent's
python start, and the controller noticing.

The netns lab (bindings/rdmalab/machines/netns/) beside the two-VM lab, both as the scenarios get them (an agent
pool: every host up, its agent shipped and answering, the data path warm): two rxe hosts as
network namespaces (in one sid guest here: this machine's kernel has no rxe) against two rxe
guests with the same kernel. Without --quick also the scenario suite's wall time on each
(tests/scenarios, pytest, one run each, the same kernel).
"""
from __future__ import annotations

import json
import pathlib
import re
import statistics
import time

from .report import Figure

REPO = pathlib.Path(__file__).resolve().parents[1]
ROUNDS = 3
GOAL_S = 10.0
STAMP = re.compile(r"vmlab-init: \[([0-9.]+)\] (.*)")
READY = re.compile(r"VMLAB-READY \S+ port \d+ uptime ([0-9.]+)")


def _log(msg: str) -> None:
    print(f"[bench labs {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def stamps(serial_log: pathlib.Path) -> dict:
    """Guest uptimes (s) of init's steps and of the agent's READY line."""
    out = {}
    text = serial_log.read_text(errors="replace") if serial_log.exists() else ""
    for m in STAMP.finditer(text):
        step = m.group(2).strip()
        key = ("modules" if step.startswith("modules") else "network" if step.startswith(
            "network") else "rdma" if step.startswith("rdma") else step.split()[0])
        out.setdefault(key, float(m.group(1)))
    m = READY.search(text)
    if m:
        out["ready"] = float(m.group(1))
    return out


def boot(n: int, rdma: str) -> dict:
    """One lab of n guests from nothing to ready, then closed. Seconds."""
    from rdmalab.machines.vmlab.vm import VmGroup
    t0 = time.monotonic()
    lab = VmGroup(n, rdma=rdma)
    try:
        t_made = time.monotonic()
        lab.start_all()
        per_vm = lab.wait_all_ready()
        total = time.monotonic() - t0
        guests = []
        for vm, wall in zip(lab.vms, per_vm):
            s = stamps(vm.serial_log)
            guests.append({"vm": vm.spec.name, "wall_s": wall, **s})
    finally:
        t_close = time.monotonic()
        lab.close()
        close_s = time.monotonic() - t_close
    return {"hosts": n, "rdma": rdma, "total_s": total, "setup_s": t_made - t0,
            "guests": guests, "close_s": close_s}


def _breakdown(r: dict) -> str:
    """The slowest guest's time line: pre-kernel, kernel+modules, 9p+network, rdma, agent."""
    g = max(r["guests"], key=lambda g: g["wall_s"])
    if "ready" not in g or "modules" not in g:
        return "no console stamps"
    pre = g["wall_s"] - g["ready"]  # qemu + firmware + decompression, and the poll's lag
    return (f"slowest guest {g['wall_s']:.1f} s = {pre:.1f} s before the guest clock (qemu, "
            f"firmware, kernel decompression, READY seen) + kernel to modules loaded "
            f"{g['modules']:.1f} s + 9p root and network {g.get('network', 0) - g['modules']:.1f} s"
            f" + rdma link {g.get('rdma', 0) - g.get('network', 0):.1f} s + agent (python) up "
            f"{g['ready'] - g.get('rdma', 0):.1f} s; lab setup {r['setup_s']:.2f} s")


def run(args) -> list[Figure]:
    quick = getattr(args, "quick", False)
    rounds = 1 if quick else ROUNDS
    t_start = time.monotonic()
    results = []
    figures = []
    for rdma in ("rxe", "siw"):
        two, one = [], []
        for i in range(rounds):
            # alternate which goes first, so a warm page cache or a busy host favours neither
            for n in ((2, 1) if i % 2 == 0 else (1, 2)):
                r = boot(n, rdma)
                results.append(r)
                (two if n == 2 else one).append(r)
                guests = ", ".join(f"{g['wall_s']:.1f}" for g in r["guests"])
                _log(f"{rdma} x{n} round {i + 1}: ready in {r['total_s']:.1f} s "
                     f"(guests {guests}; close {r['close_s']:.1f} s)")
        med2 = statistics.median(r["total_s"] for r in two)
        med1 = statistics.median(r["total_s"] for r in one)
        typical = sorted(two, key=lambda r: r["total_s"])[len(two) // 2]
        verdict = "met" if med2 <= GOAL_S else "MISSED"
        runs2 = "/".join(f"{r['total_s']:.1f}" for r in two)
        runs1 = "/".join(f"{r['total_s']:.1f}" for r in one)
        figures.append(Figure(
            "labs", f"VM lab, 2 {rdma} hosts: nothing to ready", med2, "s",
            f"1 {rdma} host alone", med1, better="lower",
            note=f"goal <= {GOAL_S:g} s for two hosts: {verdict} (median of {len(two)}: "
                 f"{runs2} s; one host {runs1} s); median run: {_breakdown(typical)}"))
    figures += netns_figures(quick, rounds)
    (args.out / "labs.json").write_text(json.dumps(results, indent=1) + "\n")
    figures[-1].note += f"; section {time.monotonic() - t_start:.0f} s"
    return figures


NETNS_KERNEL = "sid"  # the kernel both labs run for the comparison (rxe per namespace: 7.1)


def pool_ready(kind: str) -> float:
    """Seconds from nothing to an agent pool of two rxe hosts (netns or VM), then closed."""
    import os
    os.environ["RDMALAB_VM_KERNEL"] = NETNS_KERNEL
    from rdmalab.labs.agent import AgentPool
    from rdmalab.machines.netns.fleet import netns_fleet
    from rdmalab.machines.qemu import vm_fleet
    t0 = time.monotonic()
    pool = AgentPool((netns_fleet if kind == "netns" else vm_fleet)("rxe", 2))
    took = time.monotonic() - t0
    pool.close()
    return took


def suite_s(lab: str) -> tuple[float, str]:
    """Wall seconds of the scenario suite on one lab (pytest), and its summary line."""
    import subprocess
    import sys
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "rdmalab.run.pytest_plugin", "-q",
                        "tests/scenarios", "--lab", lab, "--kernel", NETNS_KERNEL,
                        "--rdmalab-timeout", "180", "-p", "no:cacheprovider"],
                       cwd=REPO, capture_output=True, text=True, timeout=3600)
    lines = [line for line in r.stdout.splitlines() if " in " in line and "passed" in line]
    return time.monotonic() - t0, (lines[-1].strip("= ") if lines else f"rc {r.returncode}")


def netns_figures(quick: bool, rounds: int) -> list[Figure]:
    netns, vm = [], []
    for i in range(rounds):
        for kind in (("netns", "vm") if i % 2 == 0 else ("vm", "netns")):
            took = pool_ready(kind)
            (netns if kind == "netns" else vm).append(took)
            _log(f"{kind} pool of 2 rxe hosts ({NETNS_KERNEL}) round {i + 1}: {took:.1f} s")
    figures = [Figure(
        "labs", "netns lab, 2 rxe hosts: nothing to agents ready", statistics.median(netns), "s",
        "VM lab, 2 rxe guests, agents ready", statistics.median(vm), better="lower",
        note=f"both on {NETNS_KERNEL}; the namespaces live in one guest (this machine's kernel "
             f"has no rxe), so the figure includes that guest's boot; median of {rounds}: "
             f"netns {'/'.join(f'{t:.1f}' for t in netns)} s, VM "
             f"{'/'.join(f'{t:.1f}' for t in vm)} s")]
    if not quick:
        n_s, n_sum = suite_s("netns:rxe")
        v_s, v_sum = suite_s("vm:rxe")
        _log(f"suite on netns:rxe {n_s:.0f} s ({n_sum}); on vm:rxe {v_s:.0f} s ({v_sum})")
        figures.append(Figure(
            "labs", "scenario suite on netns:rxe", n_s, "s", "the same on vm:rxe", v_s,
            better="lower", note=f"{NETNS_KERNEL}; netns: {n_sum}; vm: {v_sum}"))
    return figures
