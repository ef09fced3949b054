"""python3 -m lab.vmlab {prepare|selftest|boot} (run from the repository root)."""
from __future__ import annotations

import argparse
import json
import sys
import time

from . import initrd, kernel, selftest
from .vm import Lab, VmError


def _log(msg: str) -> None:
    print(f"[vmlab {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def cmd_prepare(_: argparse.Namespace) -> int:
    t0 = time.monotonic()
    k = kernel.ensure()
    rd = initrd.ensure(k)
    _log(f"kernel {k.vmlinuz}\n  siw {k.siw_ko}\n  initrd {rd}\n  "
         f"({time.monotonic() - t0:.1f} s)")
    return 0


def cmd_selftest(args: argparse.Namespace) -> int:
    reports = {}
    try:
        for rdma in args.rdma:
            reports[rdma] = selftest.run_provider(rdma, _log, reboot=args.reboot)
    except (VmError, kernel.KernelError) as exc:
        _log(f"FAIL: {exc}")
        return 1
    print(json.dumps(reports, indent=2))
    _log("selftest passed")
    return 0


def cmd_boot(args: argparse.Namespace) -> int:
    """Boots VMs and runs one command in each: a manual check."""
    with Lab(args.n, rdma=args.rdma) as lab:
        lab.start_all()
        try:
            _log(f"ready after {lab.wait_all_ready()} s")
            for vm in lab.vms:
                r = vm.run(args.cmd, args.timeout)
                print(f"--- {vm.spec.name} rc={r.rc} ({r.elapsed_s} s)\n{r.out}{r.err}")
        except VmError as exc:
            _log(f"FAIL: {exc}")
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m lab.vmlab")
    sub = ap.add_subparsers(dest="action", required=True)
    sub.add_parser("prepare", help="fetch the kernel, build siw.ko and the initrd")
    st = sub.add_parser("selftest", help="boot two VMs per provider, rping/pingpong them")
    st.add_argument("--rdma", nargs="+", default=["rxe", "siw"], choices=["rxe", "siw"])
    st.add_argument("--reboot", action="store_true",
                    help="also SIGKILL the second VM, reboot it and rping again")
    bt = sub.add_parser("boot", help="boot N VMs and run a command in each")
    bt.add_argument("-n", type=int, default=1)
    bt.add_argument("--rdma", default="rxe", choices=["rxe", "siw", "none"])
    bt.add_argument("--timeout", type=float, default=60.0)
    bt.add_argument("cmd", nargs="?", default="rdma link; ibv_devices")
    args = ap.parse_args(argv)
    return {"prepare": cmd_prepare, "selftest": cmd_selftest, "boot": cmd_boot}[args.action](args)


if __name__ == "__main__":
    sys.exit(main())
