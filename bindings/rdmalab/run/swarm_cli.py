"""python3 -m rdmalab swarm --lab LAB [--seeds N | --minutes M] [--first-seed S] [--steps 30]
                            [--workers 2] [--out DIR] [--mutation NAME] [--no-shrink]
python3 -m rdmalab swarm --workload KIND --lab LAB [--seeds N] [--first-seed S] [--out DIR]
python3 -m rdmalab replay FILE --lab LAB [--lab LAB ...] [--out DIR] [--mutation NAME]

swarm --lab model[:p1,p2]: seeds on the model (every personality in turn when none is named),
each checked by every history checker; a failing seed is written as DIR/fail-<p>-<seed>.json
with its replay command, then shrunk to DIR/fail-<p>-<seed>.shrunk.json.
swarm --lab vm:rxe (vm:siw, netns:rxe, inventory:PATH): the same seeds' schedules run on the
device through pytest, the model twin's run is the oracle, and each divergence is written as
a candidate finding in DIR/candidates/.
swarm --workload nvme --lab vm:rxe (vm:siw, inventory:PATH): each seed draws a fault campaign
against a running kernel ULP (rdmalab.schedules.swarm_workload), run on the device through
pytest and judged by every checker; the model has no kernel ULPs, so there is no twin run.

replay: one schedule on each lab. Model labs run in this process with the schedule's seed;
device labs through pytest and the rdmalab plugin (the same lab set-up as `rdmalab run`). With
a model lab and a device lab it prints where their outcomes differ; a schedule with a workload
is judged on the device alone (the model refuses it).

Exit status: 0 all valid and no divergence, 1 a failure or a divergence, 2 bad input (an
option, a lab, a mutation name or the schedule file refused before anything ran; a malformed
schedule names the step and the field).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import pathlib
import subprocess
import sys
import time
from typing import Optional

from ..findings.agreement import twin as model_twin
from ..paths import REPO
from ..schedules import differential, shrink, swarm as sw
from ..schedules.schedule import Schedule
from ..schedules.swarm_workload import draw_workload
from ..schedules.workload_ops import KINDS
from . import inputs
from .inputs import BadInput

SCENARIO = pathlib.Path(sw.__file__).resolve().parent / "scenario.py"  # schedules/scenario.py
PROGRESS_S = 30.0
# A workload campaign's pytest bound: set-up, faults of up to a minute each, reboots of a TCG
# guest, the liveness bound (~3 min), teardown.
WORKLOAD_TIMEOUT_S = 1800.0


def parser(command: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python3 -m rdmalab {command}", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=inputs.EXIT_HELP)
    if command == "replay":
        p.add_argument("file", help="a schedule (JSON)")
    p.add_argument("--lab", action="append", required=True,
                   help="model, model:roce[,ib,...], vm:rxe, vm:siw, netns:rxe, inventory:PATH")
    p.add_argument("--out", default=f"out/{command}", help=f"output folder (out/{command})")
    p.add_argument("--mutation", action="append", default=[],
                   help="run the model with this planted defect (rdmalab.labs.engine.MUTATIONS)")
    p.add_argument("--vm-hosts", type=int, default=2, help="hosts of a device lab (2)")
    p.add_argument("--kernel", default=None, help="the VM lab's guest kernel (--kernel of run)")
    if command == "swarm":
        p.add_argument("--seeds", type=int, default=None, help="how many seeds")
        p.add_argument("--minutes", type=float, default=None, help="or for how long")
        p.add_argument("--first-seed", type=int, default=1)
        p.add_argument("--steps", type=int, default=30, help="steps per schedule (30)")
        p.add_argument("--workers", type=int, default=2, help="processes (2)")
        p.add_argument("--no-shrink", action="store_true")
        p.add_argument("--stop-at-first", action="store_true")
        p.add_argument("--workload", choices=sorted(KINDS), default=None,
                       help="fault campaigns against a running kernel ULP of this kind (a lab "
                       "with kernel ULPs: vm:rxe, vm:siw, inventory:PATH)")
    return p


def model_personalities(lab: str) -> Optional[list[str]]:
    """model -> every personality, model:a,b -> those; None for a device lab."""
    kind, names = inputs.lab_parts(lab)
    return names if kind == "model" else None


def check_args(command: str, args) -> None:
    """Every value checked before anything runs (rdmalab.run.inputs); BadInput names the first
    wrong one."""
    args.lab = inputs.labs(args.lab)
    args.mutation = inputs.mutations(args.mutation)
    inputs.count(args.vm_hosts, "--vm-hosts", 1, 8)
    inputs.kernel(args.kernel)
    args.out = inputs.out_dir(args.out)
    if command == "replay":
        args.schedule = inputs.schedule(args.file)
        return
    if args.seeds is not None:
        inputs.count(args.seeds, "--seeds", 1)
    if args.minutes is not None:
        inputs.duration(args.minutes, "--minutes")
    inputs.count(args.first_seed, "--first-seed", 0)
    inputs.count(args.steps, "--steps", 1, 500)
    inputs.count(args.workers, "--workers", 1, 64)
    models = [lab for lab in args.lab if model_personalities(lab) is not None]
    if args.workload and models:
        raise BadInput(f"--workload {args.workload} --lab {models[0]}: the model runs no kernel "
                       "ULPs; a workload needs a lab with kernel_ulp (vm:rxe, vm:siw, "
                       "inventory:PATH)")


def column(lab: str) -> str:
    """A lab option as a folder name (scenario.py writes its results there)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", lab)


def twin(lab: str) -> str:
    device = (lab.partition(":")[2] or "rxe").split(",")[0]
    return model_twin(device) or "roce"


# ---- swarm -----------------------------------------------------------------------------------

def swarm(args) -> int:
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.seeds is None and args.minutes is None:
        args.seeds = 1000
    labs_model = [(lab, model_personalities(lab)) for lab in args.lab]
    rc = 0
    for lab, pers in labs_model:
        if args.workload:
            rc = max(rc, swarm_workload(args, lab, out))
        elif pers is None:
            rc = max(rc, swarm_device(args, lab, out))
        else:
            rc = max(rc, swarm_model(args, pers, out))
    return rc


def swarm_model(args, pers: list[str], out: pathlib.Path) -> int:
    deadline = time.monotonic() + args.minutes * 60 if args.minutes else None
    t0, counts = time.monotonic(), {}
    failures: list = []

    last = [t0]

    def seen(r) -> None:
        counts[r.personality] = counts.get(r.personality, 0) + 1
        now = time.monotonic()
        if now - last[0] >= PROGRESS_S:  # a whole line every PROGRESS_S, as progress.py does
            last[0] = now
            n = sum(counts.values())
            print(f"swarm: {n} seeds, {len(failures)} failed, "
                  f"{n / (now - t0) * 60:.0f} seeds/min", flush=True)
        if r.failed:
            failures.append(r)
            print(f"seed {r.seed} ({r.personality}) FAILED: {', '.join(r.signature)}: "
                  f"{r.problems[0] if r.problems else ''}", flush=True)

    done, _ = sw.run_seeds(pers, first=args.first_seed, count=args.seeds, deadline=deadline,
                           steps=args.steps, workers=args.workers,
                           mutations=tuple(args.mutation), stop_at_first=args.stop_at_first,
                           on_result=seen)
    wall = time.monotonic() - t0
    for r in failures[:10]:
        report_failure(args, r, out)
    summary = {"seeds": done, "wall_s": round(wall, 2),
               "seeds_per_minute": round(done / wall * 60, 1) if wall else None,
               "by_personality": counts, "failures": [f.as_dict() for f in failures],
               "mutations": args.mutation, "first_seed": args.first_seed,
               "steps": args.steps}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"swarm: {done} seeds in {wall:.1f} s ({summary['seeds_per_minute']} seeds/min, "
          f"{args.workers} workers), {len(failures)} failed; "
          + ", ".join(f"{p} {n}" for p, n in sorted(counts.items())))
    return 1 if failures else 0


def report_failure(args, r, out: pathlib.Path) -> None:
    schedule = sw.draw(r.seed, r.personality, args.steps)
    path = schedule.dump(out / f"fail-{r.personality}-{r.seed}.json")
    mut = "".join(f" --mutation {m}" for m in args.mutation)
    print(f"  replay: python3 -m rdmalab replay {path} --lab model:{r.personality}{mut}")
    if args.no_shrink:
        return
    sig = set(r.signature)

    def fails(s: Schedule) -> bool:
        got = sw.run_on_model(s, r.personality, tuple(args.mutation))
        return bool(sig & set(got.signature))

    small, runs = shrink.shrink(schedule, fails)
    spath = small.dump(out / f"fail-{r.personality}-{r.seed}.shrunk.json")
    print(f"  shrunk to {len(small.steps)} steps in {runs} runs: {spath}")
    print(f"  replay: python3 -m rdmalab replay {spath} --lab model:{r.personality}{mut}")


def swarm_device(args, lab: str, out: pathlib.Path) -> int:
    """Draws schedules for the device's twin personality, runs each on the model here and on
    the device through pytest, and writes every divergence as a candidate finding."""
    count = args.seeds or 5
    p = twin(lab)
    sched_dir = out / "schedules"
    paths = []
    for seed in range(args.first_seed, args.first_seed + count):
        s = sw.draw(seed, p, args.steps)
        s = _fit_hosts(s, args.vm_hosts)
        paths.append(s.dump(sched_dir / f"{p}-{seed}.json"))
    return compare(args, lab, paths, out)


def swarm_workload(args, lab: str, out: pathlib.Path) -> int:
    """Draws a workload campaign per seed (for the device's twin personality: its CM's
    messages) and runs each on the device, judged by the checkers alone."""
    p, kind = twin(lab), args.workload
    paths = [draw_workload(seed, kind, p).dump(out / "schedules" / f"{kind}-{p}-{seed}.json")
             for seed in range(args.first_seed, args.first_seed + (args.seeds or 5))]
    return verdicts(args, [lab], paths, out)


def has_workload(schedule: Schedule) -> bool:
    return any(st["op"] == "workload" for st in schedule.steps)


def _fit_hosts(s: Schedule, n: int) -> Schedule:
    """A device lab has n hosts: steps on hosts past them are dropped, and with them every
    step naming a connection they made."""
    keep = set(s.hosts[:n])
    steps = [st for st in s.steps
             if all(st[k] in keep for k in ("host", "client", "server") if k in st)]
    conns = {st["conn"] for st in steps if st["op"] == "connect"}

    def named_conns(st: dict) -> set:
        return {c for c in (st.get("conn"), (st.get("at") or {}).get("conn")) if c}

    steps = [st for st in steps if named_conns(st) <= conns]
    fitted = Schedule(hosts=s.hosts[:n], steps=steps, seed=s.seed, personality=s.personality,
                      settle_ns=s.settle_ns, meta=s.meta)
    fitted.validate()
    return fitted


# ---- replay and differential -----------------------------------------------------------------

def replay(args) -> int:
    schedule = args.schedule
    labs = [(lab, model_personalities(lab)) for lab in args.lab]
    out = pathlib.Path(args.out)
    devices = [lab for lab, pers in labs if pers is None]
    rc = 0
    for lab, pers in labs:
        if pers is None:
            continue
        for p in pers:
            rc = max(rc, replay_model(schedule, p, args.mutation))
    if devices and has_workload(schedule):  # the model refuses it: no twin to compare with
        rc = max(rc, verdicts(args, devices, [pathlib.Path(args.file)], out))
    elif devices:
        oracle = next((pers[0] for _, pers in labs if pers), None)
        rc = max(rc, compare(args, devices, [pathlib.Path(args.file)], out, oracle))
    return rc


def replay_model(schedule: Schedule, p: str, mutations: list[str]) -> int:
    r = sw.run_on_model(schedule, p, tuple(mutations), keep_history=True)
    print(f"model:{p}: {len(schedule.steps)} steps, {r.records} records: "
          + ("FAILED " + ", ".join(r.signature) if r.failed else "every checker valid"))
    for line in r.problems[:20]:
        print(f"  {line}")
    refused = [x for x in r.results if x["op"].startswith("workload") and
               x["result"] == "unsupported"]
    if refused:
        print(f"  {len(refused)} workload step(s) unsupported: {refused[0]['detail']}")
    return 1 if r.failed else 0


def compare(args, labs, paths: list[pathlib.Path], out: pathlib.Path,
            oracle: Optional[str] = None) -> int:
    """Each schedule on the device labs (pytest) and on the model here (the personality given
    with --lab model:P, else the device's twin); prints and writes the differences."""
    labs = [labs] if isinstance(labs, str) else labs
    results = out / "device"
    paths = [differential.paced(Schedule.load(p)).dump(results / "schedules" / p.name)
             for p in paths]
    rc = run_devices(args, labs, paths, results)
    n_div = 0
    for lab in labs:
        col = results / column(lab)
        p = oracle or twin(lab)
        for path in paths:
            s = Schedule.load(path)
            got = col / f"{path.stem}.json"
            if not got.exists():
                print(f"{lab} {path.name}: no result (see {out}/pytest.log)")
                rc = 1
                continue
            dev = json.loads(got.read_text())
            dev_out = differential.outcome(dev["history"])
            skipped = differential.unsupported_steps(dev_out)
            model = sw.run_on_model(differential.without_steps(s, skipped), p,
                                    tuple(args.mutation), keep_history=True)
            model_out = differential.outcome(model.history)
            diffs = differential.skip_steps(model_out, dev_out, skipped) + \
                differential.differences(model_out, dev_out)
            state = "FAILED " + ", ".join(dev["signature"]) if dev["signature"] else "valid"
            real = differential.candidates(diffs)
            timing = sum(d.startswith(differential.TIMING) for d in diffs)
            print(f"{lab} {path.name}: device {state}; model:{p} "
                  f"{'FAILED ' + ', '.join(model.signature) if model.failed else 'valid'}; "
                  f"{len(real)} difference(s)" + (f", {timing} timing" if timing else ""))
            for line in diffs[:15]:
                print(f"  {line}")
            if dev["signature"]:
                rc = 1
            if real:
                n_div += 1
                where = differential.write_candidate(out / "candidates", s, lab, diffs,
                                                     model.history, dev["history"])
                print(f"  candidate finding: {where}")
    print(f"differential: {len(paths)} schedule(s) x {len(labs)} lab(s), {n_div} with "
          "differences")
    return max(rc, 1 if n_div else 0)


def verdicts(args, labs: list[str], paths: list[pathlib.Path], out: pathlib.Path) -> int:
    """Each schedule on the device labs (pytest), judged by the checkers alone: prints each
    step's result and the verdict, and a failure's problems and replay command."""
    results = out / "device"
    rc = run_devices(args, labs, paths, results, timeout_s=WORKLOAD_TIMEOUT_S)
    failed = 0
    for lab in labs:
        for path in paths:
            got = results / column(lab) / f"{path.stem}.json"
            if not got.exists():
                print(f"{lab} {path.name}: no result (see {out}/pytest.log)")
                rc, failed = 1, failed + 1
                continue
            dev = json.loads(got.read_text())
            refused = [r for r in dev["results"] if r["op"] == "workload" and
                       r["result"] == "unsupported"]
            state = ("skipped: " + refused[0]["detail"] if refused else
                     "FAILED " + ", ".join(dev["signature"]) if dev["signature"] else "valid")
            print(f"{lab} {path.name}: {state}")
            for r in dev["results"]:
                print(f"  {r['i']:>2} {r['op']} {r['result']}"
                      + (f": {r['detail'][:160]}" if r.get("detail") else ""))
            if dev["signature"]:
                rc, failed = 1, failed + 1
                for line in dev["problems"][:10]:
                    print(f"  {line[:300]}")
                print(f"  replay: python3 -m rdmalab replay {path} --lab {lab}")
    print(f"workload schedules: {len(paths)} schedule(s) x {len(labs)} lab(s), {failed} failed")
    return rc


def run_devices(args, labs: list[str], paths: list[pathlib.Path], results: pathlib.Path,
                timeout_s: Optional[float] = None) -> int:
    results.mkdir(parents=True, exist_ok=True)
    listing = results / "schedules.txt"
    listing.write_text("".join(f"{p.resolve()}\n" for p in paths))
    env = dict(os.environ, RDMALAB_SCHEDULES=str(listing),
               RDMALAB_SCHEDULE_OUT=str(results.resolve()))
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO / "bindings"), str(REPO),
                                                    env.get("PYTHONPATH")) if x)
    cmd = [sys.executable, "-m", "pytest", "-p", "rdmalab.run.pytest_plugin", "-q",
           "-p", "no:cacheprovider", str(SCENARIO), "--vm-hosts", str(args.vm_hosts),
           "--history-dir", str(results.resolve() / "history"), "-rfEs",
           *[x for lab in labs for x in ("--lab", lab)]]
    if args.kernel:
        cmd += ["--kernel", args.kernel]
    if timeout_s:
        cmd += ["--rdmalab-timeout", str(timeout_s)]
    log = results.parent / "pytest.log"
    print(f"rdmalab: {len(paths)} schedule(s) on {', '.join(labs)} (log {log})", flush=True)
    with open(log, "w") as fh:
        p = subprocess.run(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL)
    lines = log.read_text(errors="replace").splitlines()
    if p.returncode in (4, 5):  # the plugin refused the lab before any schedule ran
        why = [ln for ln in lines if ln.startswith("ERROR:")] or lines[-3:]
        raise BadInput("; ".join(ln.removeprefix("ERROR: ") for ln in why) + f" (log {log})")
    print("\n".join(f"  pytest: {line}" for line in lines[-6:]))
    return 0 if p.returncode in (0, 1) else 1


def main(command: str, argv: list[str]) -> int:
    """Bad input raises (BadInput, ScheduleError): rdmalab.run.cli's guard prints it, exit 2."""
    args = parser(command).parse_args(argv)
    check_args(command, args)
    return swarm(args) if command == "swarm" else replay(args)
