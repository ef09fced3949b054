"""python3 -m rdmalab.machines.vmlab {prepare|selftest|boot|up|down|power|serve} (run from the repository
root; up/down/power/serve: bindings/rdmalab/machines/vmlab/up.py)."""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

from . import initrd, kernel, moddep, prepare, selftest, up
from ..machine import MachineError
from .vm import VmGroup


def _log(msg: str) -> None:
    print(f"[vmlab {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def cmd_prepare(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    k = prepare.ensure(siw=not args.no_siw)
    rd = initrd.ensure(k)
    md = moddep.ensure(k)
    _log(f"kernel {k.release} ({k.suite}) {k.vmlinuz}\n  siw {k.siw_ko}\n  initrd {rd}\n  "
         f"modules for modprobe {md}\n  ({time.monotonic() - t0:.1f} s)")
    return 0


def cmd_selftest(args: argparse.Namespace) -> int:
    reports = {}
    try:
        for rdma in args.rdma:
            reports[rdma] = selftest.run_provider(rdma, _log, reboot=args.reboot)
    except (MachineError, kernel.KernelError) as exc:  # VmError, a failed check
        _log(f"FAIL: {exc}")
        return 1
    print(json.dumps(reports, indent=2))
    _log("selftest passed")
    return 0


def cmd_boot(args: argparse.Namespace) -> int:
    """Boots VMs and runs one command in each: a manual check."""
    with VmGroup(args.n, rdma=args.rdma) as lab:
        lab.start_all()
        try:
            _log(f"ready after {lab.wait_all_ready()} s")
            failed = 0
            for vm in lab.vms:
                r = vm.run(args.cmd, args.timeout)
                print(f"--- {vm.spec.name} rc={r.rc} ({r.elapsed_s} s)\n{r.out}{r.err}")
                failed += r.rc != 0
        except MachineError as exc:
            _log(f"FAIL: {exc}")
            return 1
    return 1 if failed else 0  # the command's failure in any VM is the run's


def cmd_up(args: argparse.Namespace) -> int:
    if not 1 <= args.hosts <= 16:
        raise up.UpError(f"--hosts {args.hosts}: 1 to 16")
    return up.up(args.device, args.hosts, args.inventory, args.memory)


def cmd_serve(args: argparse.Namespace) -> int:
    return up.serve(args.state.resolve(), args.device, args.hosts, args.memory)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m rdmalab.machines.vmlab")
    ap.add_argument("--kernel", default=None, metavar="SUITE|RELEASE",
                    help="the guests' kernel: bookworm (default), trixie, sid, bookworm-"
                         "backports, or a Debian release such as 6.12.117+deb13-amd64 "
                         "(also RDMALAB_VM_KERNEL)")
    sub = ap.add_subparsers(dest="action", required=True)
    pr = sub.add_parser("prepare", help="fetch the kernel, build siw.ko, the initrd and the "
                        "guests' module indexes")
    pr.add_argument("--no-siw", action="store_true", help="do not build siw.ko")
    st = sub.add_parser("selftest", help="boot two VMs per provider, rping/pingpong them")
    st.add_argument("--rdma", nargs="+", default=["rxe", "siw"], choices=["rxe", "siw"])
    st.add_argument("--reboot", action="store_true",
                    help="also SIGKILL the second VM, reboot it and rping again")
    bt = sub.add_parser("boot", help="boot N VMs and run a command in each")
    bt.add_argument("-n", type=int, default=1)
    bt.add_argument("--rdma", default="rxe", choices=["rxe", "siw", "none"])
    bt.add_argument("--timeout", type=float, default=60.0)
    bt.add_argument("cmd", nargs="?", default="rdma link; ibv_devices")
    u = sub.add_parser("up", help="boot N guests that do not see this checkout, write an "
                       "inventory for them and leave them running")
    sv = sub.add_parser("serve", help="(started by up) the supervisor that owns the guests")
    for p in (u, sv):
        p.add_argument("--device", default="rxe", choices=["rxe", "siw"])
        p.add_argument("--hosts", type=int, default=2)
        p.add_argument("--memory", type=int, default=512, metavar="MB")
    u.add_argument("--inventory", type=pathlib.Path, required=True)
    sv.add_argument("--state", type=pathlib.Path, required=True)
    dn = sub.add_parser("down", help="stop the guests an inventory from up describes")
    dn.add_argument("--inventory", type=pathlib.Path, required=True)
    pw = sub.add_parser("power", help="SIGKILL (off), boot (on) or both (cycle) one guest")
    pw.add_argument("--inventory", type=pathlib.Path, required=True)
    pw.add_argument("--host", required=True)
    pw.add_argument("what", choices=["on", "off", "cycle"])
    args = ap.parse_args(argv)
    if args.kernel:  # read by rdmalab.machines.vmlab.debian, here and in up's supervisor process
        os.environ["RDMALAB_VM_KERNEL"] = args.kernel
    commands = {"prepare": cmd_prepare, "selftest": cmd_selftest, "boot": cmd_boot,
                "up": cmd_up, "serve": cmd_serve,
                "down": lambda a: up.down(a.inventory),
                "power": lambda a: up.power(a.inventory, a.host, a.what)}
    try:
        return commands[args.action](args)
    except kernel.KernelError as exc:
        print(f"vmlab {args.action}: the guest kernel: {exc}", file=sys.stderr, flush=True)
        return 1
    except up.UpError as exc:
        print(f"vmlab {args.action}: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
