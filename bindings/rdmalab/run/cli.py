"""python3 -m rdmalab run [--lab model] [--lab vm:rxe] [--kernel sid] [--vm-hosts N] [--seed N] [--out DIR] [-k EXPR] [paths...] [-- pytest args]
python3 -m rdmalab report DIR   (or DIR/junit.xml)
python3 -m rdmalab matrix [--kernel K ...] [--device rxe|siw ...] [--out DIR] [--readme README.md]
python3 -m rdmalab ulp [--device rxe|siw ...] [--out DIR] [--readme README.md] [--table-only]
python3 -m rdmalab findings [--readme README.md] [--registry FILE]
python3 -m rdmalab swarm --lab model[:PERSONALITY] --seeds N | --minutes M   (rdmalab.run.swarm_cli)
python3 -m rdmalab replay FILE --lab model:roce [--lab vm:rxe]

run: runs the scenarios (tests/scenarios by default) with pytest in a subprocess and the
rdmalab plugin, writes DIR/junit.xml, DIR/history/<test>.jsonl, DIR/report.txt and
DIR/report.html (the result matrix and a ladder diagram per scenario, self-contained), and
prints the result table. Every option, lab and inventory is checked before pytest starts
(rdmalab.run.inputs); a relative inventory or test path is taken from the caller's directory.

report: the result table of a run's JUnit XML, and DIR/report.html rebuilt from DIR's files.

findings: checks the findings registry (bindings/rdmalab/findings/findings.toml) and prints README's
findings tables as markdown; with --readme, rewrites the block between <!-- findings:begin -->
and <!-- findings:end --> of that file in place instead. Exit status 2 if the registry is
malformed (each problem named by file, line, entry and field).

Exit status of every command: 0 passed, 1 a result failed, 2 bad input (an option, a lab or a
file refused before anything ran, named in one line on stderr)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from ..findings import registry as findings
from . import inputs, options
from . import matrix, ulp
from ..report import html as html_report, junit as report
from ..findings.agreement import twin
from .inputs import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_PASSED, BadInput
from .labkinds import DEFAULT_LAB, LAB_KINDS
from ..paths import PACKAGE, REPO
from . import swarm_cli

DEFAULT_TESTS = REPO / "tests" / "scenarios"


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(prog="python3 -m rdmalab", description=__doc__,
                                formatter_class=fmt, epilog=inputs.EXIT_HELP)
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run scenarios and print the result table",
                         epilog=inputs.EXIT_HELP, formatter_class=fmt)
    options.add_to_run(run)
    run.add_argument("paths", nargs="*", help=f"test paths (default {DEFAULT_TESTS})")
    rep = sub.add_parser("report", help="print the result table of a run and rebuild its "
                                        "report.html", epilog=inputs.EXIT_HELP,
                         formatter_class=fmt)
    rep.add_argument("junit", metavar="DIR|JUNIT",
                     help="the run's output directory, or its junit.xml")
    fnd = sub.add_parser("findings", help="check the findings registry and print README's "
                                          "findings tables (or rewrite them: --readme)",
                         epilog=inputs.EXIT_HELP, formatter_class=fmt)
    fnd.add_argument("--readme", default=None,
                     help="rewrite the findings block of this markdown file in place")
    fnd.add_argument("--registry", default=str(findings.REGISTRY),
                     help=f"the registry (default {findings.REGISTRY})")
    return p


def pytest_command(args, extra: list[str]) -> list[str]:
    out = Path(args.out)
    return [sys.executable, "-m", "pytest", "-p", "rdmalab.run.pytest_plugin",
            *(args.paths or [str(DEFAULT_TESTS)]), *options.forwarded(args),
            "--history-dir", str(out / "history"), "--junitxml", str(out / "junit.xml"),
            "-o", "junit_logging=no", "-rfEs", *extra]


def usable_labs(labs: list[str]) -> list[str]:
    """The labs asked for, each of a kind that cannot run here (the VM lab without qemu)
    replaced by the model personalities of its devices, saying why."""
    out: list[str] = []
    for lab in labs or [DEFAULT_LAB]:
        kind = LAB_KINDS[lab.partition(":")[0]]
        why = kind.unavailable()
        if why:
            devices = inputs.lab_parts(lab)[1]
            model = ",".join(p for p in map(twin, devices) if p) or "roce"
            print(f"rdmalab: --lab {lab}: the {kind.title} cannot run here ({why}); running the "
                  f"model (model:{model}) instead", file=sys.stderr)
            lab = f"model:{model}"
        if lab not in out:
            out.append(lab)
    return out


def check_run_args(args, cwd: str) -> None:
    """Every value of `run` checked before pytest starts (BadInput names the first wrong one);
    paths made absolute against the caller's directory, since pytest runs from the checkout."""
    args.lab = inputs.labs(args.lab, cwd)
    inputs.count(args.vm_hosts, "--vm-hosts", 1, 8)
    inputs.count(args.seed, "--seed", 0)
    inputs.kernel(args.kernel)
    if args.timeout is not None:
        inputs.duration(args.timeout, "--timeout", "seconds")
    inputs.host_port(args.metrics_listen, "--metrics-listen")
    args.out = inputs.out_dir(args.out, "--out", cwd)
    args.paths = [str(Path(cwd, p).resolve()) for p in args.paths]
    for given, path in zip(list(args.paths), args.paths):
        if not Path(path.split("::")[0]).exists():
            raise BadInput(f"test path {given}: no such file or directory")


# pytest's exit statuses (pytest.ExitCode) as rdmalab's: a usage error, a collection error
# (interrupted) or nothing selected is bad input; an internal error is a failed run.
_PYTEST_STATUS = {0: EXIT_PASSED, 1: EXIT_FAILED, 2: EXIT_BAD_INPUT, 3: EXIT_FAILED,
                  4: EXIT_BAD_INPUT, 5: EXIT_BAD_INPUT}


def run(args, extra: list[str]) -> int:
    check_run_args(args, os.getcwd())
    args.lab = usable_labs(args.lab)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    junit = out / "junit.xml"
    if junit.exists():
        junit.unlink()  # never report a previous run's results
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE.parent), env.get("PYTHONPATH"))
                                        if p)
    rc = subprocess.call(pytest_command(args, extra), env=env, cwd=REPO,
                         stdin=subprocess.DEVNULL)
    status = _PYTEST_STATUS.get(rc, EXIT_FAILED)
    if rc == 5:
        print("rdmalab run: no scenario selected (check the paths and -k)", file=sys.stderr)
    if not junit.exists() or rc in (4, 5):
        if rc not in (4, 5):
            print(f"rdmalab run: pytest ended with status {rc} and wrote no {junit}",
                  file=sys.stderr)
        return status if status != EXIT_PASSED else EXIT_FAILED
    results = report.read_junit(str(junit))
    table = report.format_table(results)
    (out / "report.txt").write_text(table)
    print("\n" + table, end="")
    if report.failed(results) and status == EXIT_PASSED:
        status = EXIT_FAILED
    write_html(out, junit)
    return status


def write_html(out: Path, junit: Path) -> bool:
    """Writes out/report.html and prints its path; False (having said why) when an input could
    not be read."""
    try:
        path, problems = html_report.write(out, junit)
    except html_report.ReportError as e:
        print(f"rdmalab report: {e}", file=sys.stderr)
        return False
    except ImportError as e:  # jinja2, which report.html imports when it renders
        print(f"rdmalab report: no report.html: {e} (apt-get install python3-jinja2)",
              file=sys.stderr)
        return False
    for problem in problems:
        print(f"rdmalab report: {problem}", file=sys.stderr)
    print(f"report: {path}")
    return not problems


def report_command(args) -> int:
    given = Path(args.junit)
    out, junit = (given, given / "junit.xml") if given.is_dir() else (given.parent, given)
    try:
        results = html_report.read_results(junit)
    except html_report.ReportError as e:
        raise BadInput(str(e)) from None
    print(report.format_table(results), end="")
    if not write_html(out, junit):
        return EXIT_BAD_INPUT
    return EXIT_FAILED if report.failed(results) else EXIT_PASSED


def findings_command(args) -> int:
    try:
        registry = findings.load(args.registry)
    except findings.FindingsError as e:
        raise BadInput(f"the registry is malformed:\n{e}") from None
    problems = findings.check_files(registry, REPO)
    for problem in problems:
        print(f"rdmalab findings: {problem}", file=sys.stderr)
    block = findings.markdown_tables(registry)
    if args.readme is None:
        print(block, end="")
        return 2 if problems else 0
    readme = Path(args.readme)
    try:
        text = readme.read_text()
        new = findings.replace_block(text, block, str(readme))
    except OSError as e:
        raise BadInput(f"--readme {readme}: cannot read: {e.strerror}") from None
    if new != text:
        readme.write_text(new)
    print(f"{readme}: findings tables {'rewritten' if new != text else 'already current'} "
          f"({len(registry.entries)} entries)")
    return 2 if problems else 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["matrix"]:  # its own parser (rdmalab.run.matrix)
        return inputs.guard("matrix", lambda: matrix.main(argv[1:]))
    if argv[:1] == ["ulp"]:  # its own parser (rdmalab.run.ulp)
        return inputs.guard("ulp", lambda: ulp.main(argv[1:]))
    if argv[:1] in (["swarm"], ["replay"]):  # rdmalab.run.swarm_cli
        return inputs.guard(argv[0], lambda: swarm_cli.main(argv[0], argv[1:]))
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    args = build_parser().parse_args(argv)
    commands = {"run": lambda: run(args, extra), "findings": lambda: findings_command(args),
                "report": lambda: report_command(args)}
    return inputs.guard(args.command, commands[args.command])
