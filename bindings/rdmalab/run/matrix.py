"""python3 -m rdmalab matrix: the scenario suite on each VM lab device and each guest kernel, one
result table keyed by lab, device and kernel, and each finding of the registry per kernel as
measured (`make test-matrix`; README "Kernel matrix").

    python3 -m rdmalab matrix [--kernel bookworm --kernel trixie --kernel sid]
                              [--device rxe --device siw] [--out out/matrix] [--readme README.md]
    python3 -m rdmalab matrix --table-only [--out out/matrix]   # the table of runs already made

Each (kernel, device) is one `python3 -m rdmalab run --lab vm:<device> --kernel <kernel>` into
OUT/<kernel>-<device>/ (its junit.xml, histories, report.txt). The merged table goes to
OUT/matrix.md and, with --readme, between <!-- matrix:begin --> and <!-- matrix:end --> of that
file. A finding's cell says what the run measured: `reproduces` (the scenario diverged as the
registry says: strict xfail), `fixed` (the registry says this kernel has the fix and the scenario
passed), `passes (before vX.Y)` (the registry says the divergence came with a newer kernel, and
the scenario passed), `holds` (a provider fact asserted), `FAILED`/`XPASS` (the registry is wrong
for this kernel: fix the entry), `skipped`, or `-` (the entry is not about this device)."""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from ..findings import registry as findings
from ..kernel import release_version
from . import inputs
from ..report import junit as report
from .inputs import BadInput

KERNELS = ("bookworm", "trixie", "sid")
DEVICES = ("rxe", "siw")
BEGIN, END = "<!-- matrix:begin -->", "<!-- matrix:end -->"
CELL = {"passed": "passed", "failed": "**FAILED**", "error": "**ERROR**", "skipped": "skipped",
        "finding": "finding", "host_lost": "**HOST-LOST**"}


def run_one(kernel: str, device: str, out: Path, extra: list[str]) -> int:
    """One column: the suite on vm:<device> with guests on <kernel>."""
    cmd = [sys.executable, "-m", "rdmalab", "run", "--lab", f"vm:{device}", "--kernel", kernel,
           "--out", str(out), *extra]
    print(f"rdmalab matrix: {' '.join(cmd[1:])}", flush=True)
    t0 = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)  # took_s goes there even when the run made nothing
    rc = subprocess.call(cmd)
    (out / "took_s").write_text(f"{time.monotonic() - t0:.0f}\n")
    return rc


def load(out: Path) -> tuple[list[report.Result], dict[str, str]]:
    """Every run's results, and each column's wall time (from its took_s)."""
    results, took = [], {}
    for junit in sorted(out.glob("*/junit.xml")):
        rs = report.read_junit(str(junit))
        results += rs
        t = junit.parent / "took_s"
        if rs and t.exists():
            seconds = int(t.read_text())
            took[rs[0].column] = f"{seconds // 60} min {seconds % 60} s"
    return results, took


def _columns(results: list[report.Result]) -> list[str]:
    def key(col: str):
        release = col.partition("@")[2]
        return (release_version(release) or (0, 0), col)
    return sorted({r.column for r in results}, key=key)


def finding_cell(entry: findings.Entry, rows: list[report.Result]) -> str:
    """What the runs of one column say of one registry entry."""
    mine = [r for r in rows if entry.id in (r.properties.get("finding"),
                                            r.properties.get("provider_fact"),
                                            r.properties.get("finding_fixed"),
                                            r.properties.get("finding_before"))]
    if not mine:
        return "-"
    cells = []
    for r in mine:
        running = release_version(r.properties.get("kernel", ""))
        before = r.properties.get("finding_before") == entry.id or (
            r.properties.get("finding_fixed") == entry.id and entry.since_in is not None
            and running is not None and running < entry.since_in)
        if before:
            since = "v%d.%d" % entry.since_in
            cells.append(f"passes (before {since})" if r.outcome == "passed" else
                         f"registry says before {since}, {CELL.get(r.outcome, r.outcome)}")
        elif r.properties.get("finding_fixed") == entry.id:
            cells.append("fixed" if r.outcome == "passed" else
                         f"registry says fixed, {CELL.get(r.outcome, r.outcome)}")
        elif r.outcome == "finding":
            cells.append("reproduces")
        elif r.properties.get("xpassed"):
            cells.append("**XPASS** (no longer diverges)")
        elif r.properties.get("provider_fact") == entry.id and r.outcome == "passed":
            cells.append("holds")
        else:
            cells.append(CELL.get(r.outcome, r.outcome))
    return ", ".join(dict.fromkeys(cells))


def markdown(results: list[report.Result], registry: findings.Registry,
             took: dict[str, str]) -> str:
    cols = _columns(results)
    rows = list(dict.fromkeys(r.scenario for r in results))
    cell = {(r.scenario, r.column): r for r in results}
    out = ["| scenario | " + " | ".join(f"`{c}`" for c in cols) + " |",
           "|---|" + "---|" * len(cols)]
    for row in rows:
        cells = [CELL.get(cell[(row, c)].outcome, cell[(row, c)].outcome)
                 if (row, c) in cell else "" for c in cols]
        out.append(f"| {row} | " + " | ".join(cells) + " |")
    counts = []
    for c in cols:
        mine = [r for r in results if r.column == c]
        n = {k: sum(1 for r in mine if r.outcome == k) for k in CELL}
        counts.append(", ".join(f"{v} {k}" for k, v in n.items() if v))
    out.append("| **total** | " + " | ".join(counts) + " |")
    if took:
        out.append("| wall time | " + " | ".join(took.get(c, "") for c in cols) + " |")
    by_col = {c: [r for r in results if r.column == c] for c in cols}
    entries = [e for e in registry.entries.values()
               if any(finding_cell(e, by_col[c]) != "-" for c in cols)]
    if entries:
        out += ["", "| registry entry | kind | " + " | ".join(f"`{c}`" for c in cols) + " |",
                "|---|---|" + "---|" * len(cols)]
        for e in entries:
            out.append(f"| `{e.id}` | {e.kind} | "
                       + " | ".join(finding_cell(e, by_col[c]) for c in cols) + " |")
    return "\n".join(out) + "\n"


def replace_block(text: str, block: str, where: str, begin: str = BEGIN,
                  end: str = END) -> str:
    """text with what lies between begin and end (README's markers) replaced by block."""
    if begin not in text or end not in text:
        raise BadInput(f"{where}: no {begin} ... {end} block to rewrite")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{block}{end}{tail}"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m rdmalab matrix", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=inputs.EXIT_HELP)
    ap.add_argument("--kernel", action="append", default=None,
                    help=f"repeatable (default {', '.join(KERNELS)})")
    ap.add_argument("--device", action="append", default=None, choices=DEVICES,
                    help=f"repeatable (default {', '.join(DEVICES)})")
    ap.add_argument("--out", default="out/matrix")
    ap.add_argument("--readme", default=None, help="rewrite this file's matrix block")
    ap.add_argument("--table-only", action="store_true",
                    help="no runs: the table of the runs already in --out")
    ap.add_argument("extra", nargs="*", help="passed to each run (e.g. -k EXPR)")
    args = ap.parse_args(argv)
    for kernel in args.kernel or ():
        inputs.kernel(kernel)
    out = Path(inputs.out_dir(args.out))
    if args.readme and not Path(args.readme).is_file():
        raise BadInput(f"--readme {args.readme}: no such file")
    rc = 0
    if not args.table_only:
        for kernel in args.kernel or KERNELS:
            for device in args.device or DEVICES:
                rc |= run_one(kernel, device, out / f"{kernel}-{device}", args.extra) != 0
    results, took = load(out)
    if not results:
        if args.table_only:
            raise BadInput(f"--table-only: no junit.xml under {out}")
        print(f"rdmalab matrix: no junit.xml under {out}", file=sys.stderr)
        return 1
    table = markdown(results, findings.default(), took)
    intro = out / "intro.md"  # what the table does not say itself (when, where, open cells)
    if intro.exists():
        table = intro.read_text().rstrip("\n") + "\n\n" + table
    (out / "matrix.md").write_text(table)
    print(table, end="")
    if args.readme:
        readme = Path(args.readme)
        readme.write_text(replace_block(readme.read_text(), table, str(readme)))
        print(f"{readme}: matrix block rewritten")
    return 1 if rc or report.failed(results) else 0
