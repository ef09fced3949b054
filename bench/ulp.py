"""Kernel ULPs under faults on the VM lab (issue 29): fault campaigns per hour.

One `python3 -m rdmalab run --lab vm:rxe tests/ulp -k ...` of the NVMe-oF campaigns in
SELECTED: the workload alone (set up, verified I/O, teardown, no fault) and one fault of each
shape (a partition healed, the target's reboot and re-export, a CM message at connect). Each
campaign's time is its `ulp_campaign` record's took_s (set-up to teardown, the fault's waits
included); the run's wall clock adds the guests' boot and each campaign's fresh devices.

The reference measured in the same run is the workload alone: a fault campaign's rate beside
it says what the fault and the recovery cost, and the run's rate beside the campaigns' own says
what booting the lab costs. No goal: the issue asks for the figure."""
from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

from .report import Figure

REPO = pathlib.Path(__file__).resolve().parents[1]
DEVICE = "rxe"
NO_FAULT = "none (the workload alone)"  # tests/ulp/test_ulp.py's reference row
SELECTED = [NO_FAULT, "partition 10 s", "target reboot", "REQ (iWARP: SYN) dropped once at connect"]
QUICK = [NO_FAULT, "partition 10 s"]
WORKLOAD = "nvme"
RUN_DEADLINE_S = 3600.0


def _log(msg: str) -> None:
    print(f"[bench ulp {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def selection(campaigns: list[str]) -> str:
    """The pytest -k expression naming these campaigns of WORKLOAD (their test ids hold the
    campaign's name; -k matches words, so each name's words are joined with `and`)."""
    def words(name: str) -> str:
        kept = [w for w in name.replace("(", " ").replace(")", " ").replace(":", " ").split()
                if w.isalnum()]
        return "(" + " and ".join(kept) + ")"
    return f"test_ulp_campaign and {WORKLOAD} and (" + " or ".join(map(words, campaigns)) + ")"


def campaign_records(history_dir: pathlib.Path) -> list[dict]:
    """The ulp_campaign records' data of a run's history files."""
    got = []
    for path in sorted(history_dir.glob("*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            rec = json.loads(line)
            if rec.get("kind") == "ulp_campaign":
                got.append(rec["data"])
    return got


def figures(records: list[dict], wall_s: float, column: str) -> list[Figure]:
    """The section's figures from the run's ulp_campaign records and its wall time."""
    alone = [r["took_s"] for r in records if r["campaign"] == NO_FAULT]
    faults = [r for r in records if r["campaign"] != NO_FAULT]
    if not alone or not faults:
        raise RuntimeError(f"bench ulp: {len(alone)} unfaulted and {len(faults)} fault campaign "
                           "records: the run failed before its campaigns ended (see its log)")
    ref = 3600.0 / statistics.mean(alone)
    out = [Figure("ulp", f"{WORKLOAD} {r['campaign']}: campaigns per hour", 3600.0 / r["took_s"],
                  "/h", "the workload alone", ref, note=f"{column}; took {r['took_s']:g} s, "
                  f"live again {r['recovery_s']:g} s after the heal")
           for r in faults]
    mean_fault = statistics.mean(r["took_s"] for r in faults)
    out.append(Figure("ulp", f"{WORKLOAD} fault campaigns per hour, the run's wall clock",
                      len(records) / wall_s * 3600.0, "/h", "the campaigns' own time",
                      len(records) / sum(r["took_s"] for r in records) * 3600.0,
                      note=f"{column}; {len(records)} campaigns in {wall_s:.0f} s, the guests' "
                      f"boot included; a fault campaign {mean_fault:.0f} s on average"))
    return out


def run(args) -> list[Figure]:
    out = pathlib.Path(args.out) / "ulp"
    names = QUICK if args.quick else SELECTED
    cmd = [sys.executable, "-m", "rdmalab", "run", "--lab", f"vm:{DEVICE}", "--out", str(out),
           str(REPO / "tests" / "ulp"), "-k", selection(names)]
    _log(" ".join(cmd[1:]))
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'bindings'}:{REPO}")
    t0 = time.monotonic()
    rc = subprocess.call(cmd, env=env, timeout=RUN_DEADLINE_S)
    wall = time.monotonic() - t0
    records = campaign_records(out / "history")
    if rc != 0:
        _log(f"the run exited {rc}: the figures are of the campaigns that wrote a record")
    return figures(records, wall, f"vm:{DEVICE}")
