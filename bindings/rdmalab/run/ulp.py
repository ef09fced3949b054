"""python3 -m rdmalab ulp: every workload against every fault kind (tests/ulp) on the VM lab's
devices, and the table of workload x fault x device with the recovery times (`make test-ulp`;
README "Kernel ULPs under faults").

    python3 -m rdmalab ulp [--device rxe --device siw] [--out out/ulp] [--readme README.md]
    python3 -m rdmalab ulp --table-only [--out out/ulp]   # the table of runs already made

Each device is one `python3 -m rdmalab run --lab vm:<device> tests/ulp` into OUT/<device>/. A
cell says the campaign's outcome and, from its `ulp_campaign` record, the seconds from the
heal to the unit working again ("stayed live": it never stopped; a CM fault at connect: the
connect's) and the teardown's (a CM fault at disconnect: that alone); a failure or skip its
reason's first words; a seed scenario without a record: its outcome. The table goes to OUT/ulp.md and, with --readme,
between <!-- ulp:begin --> and <!-- ulp:end --> of that file."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from ..paths import REPO
from ..report import junit as report
from . import inputs
from .matrix import replace_block

DEVICES = ("rxe", "siw")
BEGIN, END = "<!-- ulp:begin -->", "<!-- ulp:end -->"
REASON_CHARS = 90


def run_one(device: str, out: Path, extra: list[str]) -> int:
    cmd = [sys.executable, "-m", "rdmalab", "run", "--lab", f"vm:{device}", "--out", str(out),
           str(REPO / "tests" / "ulp"), *extra]
    print(f"rdmalab ulp: {' '.join(cmd[1:])}", flush=True)
    t0 = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    rc = subprocess.call(cmd)
    (out / "took_s").write_text(f"{time.monotonic() - t0:.0f}\n")
    return rc


def campaign_record(run_dir: Path, r: report.Result) -> dict:
    """The test's ulp_campaign record's data ({} when it wrote none: it failed before)."""
    for name in (r.properties.get("history") or "").split(","):
        path = run_dir / name
        if name and path.is_file():
            for line in path.read_text(errors="replace").splitlines():
                rec = json.loads(line)
                if rec.get("kind") == "ulp_campaign":
                    return rec["data"]
    return {}


def cell(r: report.Result, data: dict) -> str:
    times = ""
    # Records of before the moment field: the campaign's name says it ("... at connect").
    moment = data.get("moment") or data.get("campaign", "").rpartition(" at ")[2]
    if data:
        if moment == "disconnect":  # the fault was in the teardown
            times = f"teardown {data['teardown_s']:g} s"
        elif data["recovery_s"] == 0 and moment != "connect" and not data.get("io_errors"):
            times = f"stayed live, teardown {data['teardown_s']:g} s"
        else:
            times = f"live {data['recovery_s']:g} s, teardown {data['teardown_s']:g} s"
    if data.get("io_errors"):
        times += f", {data['io_errors']} I/O errors"
    if r.outcome == "passed":
        return times or "passed"
    said = (r.message or "").split("\n", 1)[0].replace("rdmalab.errors.", "")
    said = said.replace("Hung: Hung:", "Hung:")
    if said.startswith("[XPASS(strict)]"):  # the campaign passed where a finding was marked
        return "**XPASS**: passed, the marked finding did not reproduce" + \
            (f" ({times})" if times else "")
    reason = " ".join(said.split())[:REASON_CHARS]
    word = {"failed": "**FAILED**", "error": "**ERROR**", "host_lost": "**HOST-LOST**"}.get(
        r.outcome, r.outcome)
    return f"{word}: {reason}" + (f" ({times})" if times else "")


def _row(scenario: str) -> tuple[str, str]:
    """(campaign, workload) of a test: test_ulp_campaign[<campaign>-<workload>], or a seed
    scenario, test_<workload>_<what>[<params>] (test_nvme_target_torn_down_with_io_in_flight,
    test_nfs_server_reboot_hard_mount[3]: "server reboot hard mount (3)")."""
    name, _, params = scenario.rpartition("::")[2].partition("[")
    params = params.rstrip("]")
    if name == "test_ulp_campaign":
        campaign, _, workload = params.rpartition("-")
        return campaign, workload
    workload, _, what = name.removeprefix("test_").partition("_")
    return what.replace("_", " ") + (f" ({params})" if params else ""), workload


def markdown(out: Path) -> str:
    rows: dict[tuple[str, str], dict[str, str]] = {}
    cols: list[str] = []
    for junit in sorted(out.glob("*/junit.xml")):
        results = [r for r in report.read_junit(str(junit)) if not r.column.startswith("model")]
        named = {r.column for r in results} - {"", "-"}
        seen: set = set()  # cells of this run: a failed test's teardown error comes second
        for r in results:
            # A teardown error's testcase carries no column: the run's one device it is.
            column = next(iter(named)) if r.column in ("", "-") and len(named) == 1 \
                else r.column
            # A test that failed before its column was named keeps the lab's id in its own.
            campaign, workload = _row(r.scenario.replace(f"[{column.split('@')[0]}-", "["))
            data = campaign_record(junit.parent, r)
            campaign = data.get("campaign", campaign)
            if (workload, campaign, column) in seen:
                continue
            seen.add((workload, campaign, column))
            rows.setdefault((workload, campaign), {})[column] = cell(r, data)
            if column not in cols:
                cols.append(column)
    lines = ["| workload | fault | " + " | ".join(f"`{c}`" for c in cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    for (workload, campaign), by_col in rows.items():
        lines.append(f"| {workload} | {campaign} | "
                     + " | ".join(by_col.get(c, "") for c in cols) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m rdmalab ulp", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=inputs.EXIT_HELP)
    ap.add_argument("--device", action="append", default=None, choices=DEVICES,
                    help=f"repeatable (default {', '.join(DEVICES)})")
    ap.add_argument("--out", default="out/ulp")
    ap.add_argument("--readme", default=None, help="rewrite this file's ulp block")
    ap.add_argument("--table-only", action="store_true",
                    help="no runs: the table of the runs already in --out")
    ap.add_argument("extra", nargs="*", help="passed to each run (e.g. -k EXPR)")
    args = ap.parse_args(argv)
    out = Path(inputs.out_dir(args.out))
    if args.readme and not Path(args.readme).is_file():
        raise inputs.BadInput(f"--readme {args.readme}: no such file")
    rc = 0
    if not args.table_only:
        for device in args.device or DEVICES:
            rc |= run_one(device, out / device, args.extra)
    table = markdown(out)
    (out / "ulp.md").write_text(table)
    print(table, end="")
    if args.readme:
        readme = Path(args.readme)
        readme.write_text(replace_block(readme.read_text(), table, str(readme),
                                        BEGIN, END))
    return 1 if rc else 0
