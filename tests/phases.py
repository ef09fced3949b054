"""`make test`'s runner: Make targets as phases in lanes, a time breakdown at the end.

    python3 tests/phases.py --make make --out out/test-phases \
        LANE:TARGET[:nice][:after=A,B][:done=A,B][:junit=PATH,PATH][:ninja=DIR] ...

Each lane runs its phases one after another, in the order given; lanes run side by side. A
phase also waits for the phases named in after= (and is skipped when one did not pass), or in
done= (it runs once they ended, whatever their result: a report is checked after a failed run
too). `nice` runs it at nice 19, so that what runs beside it (the VM lab's guests, whose timers the scenarios measure) gets the CPU first. Each
phase is `make PHASE=1 TARGET` (PHASE=1: the Makefile skips prerequisites, which this runner
has already run in its own order). Every phase runs even when another failed, unless one it
waits for failed; each has a deadline. Output: OUT/<target>.log per phase; the first lane's
also streams to the terminal. At the end: the failed phases' logs, the last lines of the
others', the breakdown table, OUT/phases.json. Exit status 1 when any phase did not pass.

What the time went to (tests/phase_report.py), after the table, on the terminal and in
OUT/times.md (markdown, for a README to quote): for a phase with junit=PATH,PATH (the JUnit
files its pytest runs write, e.g. junit=out/vm-rxe/junit.xml,out/vm-rxe/junit-vm.xml) its ten
longest testcases, each labeled device or model, and the time summed per run; for a phase with
ninja=DIR (its CMake build folder, e.g. ninja=build-asan) the compile and link steps ninja logged
in DIR/.ninja_log while it ran, summed per CMake target, and the three slowest. Paths are
relative to the directory make runs in and hold no ':' (the spec's separator). A missing or
unreadable file is one line of the report, never a failure of the run.

OUT/phases.json: {"total_s", "phases": [{"target", "lane", "nice", "start_s", "seconds",
"result"}, ...]}; a phase with junit= also has "scenarios": {"files": [{"path", "testcases",
"problem"}], "testcases", "longest": [{"seconds", "outcome", "run", "id"}], "device" and
"model": {"testcases", "seconds"}}, and one with ninja= "compile": {"dir", "problem", "notes",
"steps", "sum_s", "targets": [{"target", "seconds", "steps"}], "slowest": [{"seconds",
"target", "output"}]}. A phase that did not run (or whose files could not be measured) has
only "problem" there ("the phase did not run"; "compile" keeps its "dir").
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Optional

import phase_report

TAIL_LINES = 12


@dataclasses.dataclass
class Phase:
    lane: str
    target: str
    nice: bool = False
    after: list[str] = dataclasses.field(default_factory=list)
    done_after: list[str] = dataclasses.field(default_factory=list)  # ran, passed or not
    junit: list[str] = dataclasses.field(default_factory=list)  # its JUnit files
    ninja: Optional[str] = None  # its build folder
    wall_start: Optional[float] = None  # time.time() at its start: JUnit files must be newer
    compile: Optional[dict] = None  # phase_report.compile_time() at its end
    start: Optional[float] = None
    end: Optional[float] = None
    result: str = "not run"   # passed | failed (rc N) | timed out | skipped: ... | not run
    log: Optional[pathlib.Path] = None
    done: threading.Event = dataclasses.field(default_factory=threading.Event)

    @property
    def passed(self) -> bool:
        return self.result == "passed"

    @property
    def seconds(self) -> float:
        return (self.end - self.start) if self.start is not None and self.end is not None else 0.0


def parse(specs: list[str]) -> list[Phase]:
    phases: list[Phase] = []
    for spec in specs:
        fields = spec.split(":")
        if len(fields) < 2 or not fields[0] or not fields[1]:
            raise SystemExit(f"phases: {spec!r}: expected LANE:TARGET[:nice][:after=A,B]"
                             "[:done=A,B][:junit=PATH,PATH][:ninja=DIR]")
        p = Phase(fields[0], fields[1])
        for opt in fields[2:]:
            if opt == "nice":
                p.nice = True
            elif opt.startswith("after=") and opt[6:]:
                p.after = opt[6:].split(",")
            elif opt.startswith("done=") and opt[5:]:
                p.done_after = opt[5:].split(",")
            elif opt.startswith("junit=") and opt[6:]:
                p.junit = opt[6:].split(",")
            elif opt.startswith("ninja=") and opt[6:]:
                p.ninja = opt[6:]
            else:
                raise SystemExit(f"phases: {spec!r}: unknown option {opt!r} "
                                 "(nice, after=A,B, done=A,B, junit=PATH,PATH, ninja=DIR)")
        phases.append(p)
    names = [p.target for p in phases]
    for p in phases:
        if names.count(p.target) > 1:
            raise SystemExit(f"phases: {p.target} is listed twice")
        for a in p.after + p.done_after:
            if a not in names:
                raise SystemExit(f"phases: {p.target} waits for {a}, which is not a phase")
    return phases


class Runner:
    def __init__(self, phases: list[Phase], make: list[str], out: pathlib.Path,
                 deadline_s: float) -> None:
        self.phases = phases
        self.by_name = {p.target: p for p in phases}
        self.make = make
        self.out = out
        self.deadline_s = deadline_s
        self.stream_lane = phases[0].lane
        self.t0 = time.monotonic()
        self.print_lock = threading.Lock()
        self.procs: set[subprocess.Popen] = set()
        self.stopping = False
        self.timed_out: set[int] = set()

    def say(self, text: str) -> None:
        with self.print_lock:
            print(text, flush=True)

    def at(self, t: float) -> str:
        return f"{t - self.t0:7.1f} s"

    def run_lane(self, lane: str) -> None:
        for p in [p for p in self.phases if p.lane == lane]:
            for a in p.after + p.done_after:
                self.by_name[a].done.wait()
            failed = [a for a in p.after if not self.by_name[a].passed]
            if failed or self.stopping:
                p.result = "skipped: " + (f"{', '.join(failed)} did not pass" if failed
                                          else "interrupted")
                self.say(f"[{lane}] {p.target}: {p.result}")
            else:
                self.run_phase(p)
            p.done.set()

    def run_phase(self, p: Phase) -> None:
        p.log = self.out / f"{p.target}.log"
        argv = ["nice", "-n", "19"] if p.nice else []
        argv += self.make + ["--no-print-directory", "PHASE=1", p.target]
        stream = p.lane == self.stream_lane
        mark = phase_report.ninja_mark(p.ninja) if p.ninja else None
        p.wall_start = time.time()
        p.start = time.monotonic()
        self.say(f"[{p.lane}] {self.at(p.start)} {p.target}: started"
                 + (" (nice 19)" if p.nice else "") + f", log {p.log}")
        with open(p.log, "wb") as log:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            self.procs.add(proc)
            timer = threading.Timer(self.deadline_s, self.kill, (proc, True))
            timer.start()
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if stream:
                    with self.print_lock:
                        sys.stdout.buffer.write(line)
                        sys.stdout.flush()
            rc = proc.wait()
            timer.cancel()
            timed_out = proc.pid in self.timed_out
            self.procs.discard(proc)
        p.end = time.monotonic()
        if p.ninja and mark is not None:
            p.compile = measure(phase_report.compile_time, p.ninja, mark)
        p.result = ("passed" if rc == 0 else
                    f"timed out after {self.deadline_s:.0f} s" if timed_out else f"failed (rc {rc})")
        self.say(f"[{p.lane}] {self.at(p.end)} {p.target}: {p.result} in {p.seconds:.0f} s")

    def kill(self, proc: subprocess.Popen, deadline: bool = False) -> None:
        if deadline:
            self.timed_out.add(proc.pid)
            self.say(f"phases: a phase ran past its deadline ({self.deadline_s:.0f} s): "
                     f"stopping make (pid {proc.pid}) and everything it started")
        try:  # the whole make tree: builds, pytest, qemu's supervisors
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            os.killpg(proc.pid, signal.SIGKILL)  # what ignored SIGTERM, and make's orphans
        except ProcessLookupError:
            pass

    def stop(self, *_: object) -> None:
        self.stopping = True
        for proc in list(self.procs):
            threading.Thread(target=self.kill, args=(proc,), daemon=True).start()

    def run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        lanes = list(dict.fromkeys(p.lane for p in self.phases))
        threads = [threading.Thread(target=self.run_lane, args=(lane,), name=lane)
                   for lane in lanes]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.5)
        self.report()
        return 0 if all(p.passed for p in self.phases) else 1

    def report(self) -> None:
        end = time.monotonic()
        self.print_logs()
        measured = {p.target: self.measured(p) for p in self.phases}
        blocks = [self.table(end)] + [b for p in self.phases
                                      for b in phase_report.blocks(p.target, p.seconds,
                                                                   measured[p.target])]
        print(phase_report.text(blocks))
        (self.out / "times.md").write_text(phase_report.markdown(blocks) + "\n")
        (self.out / "phases.json").write_text(json.dumps({
            "total_s": end - self.t0,
            "phases": [{"target": p.target, "lane": p.lane, "nice": p.nice,
                        "start_s": None if p.start is None else p.start - self.t0,
                        "seconds": p.seconds, "result": p.result, **measured[p.target]}
                       for p in self.phases],
        }, indent=2) + "\n")

    def print_logs(self) -> None:
        for p in self.phases:
            if p.lane == self.stream_lane or p.log is None or not p.log.exists():
                continue
            lines = p.log.read_text(errors="replace").splitlines()
            shown = lines if not p.passed else lines[-TAIL_LINES:]
            what = "log" if not p.passed else f"last {len(shown)} lines of {len(lines)}"
            print(f"\n==== {p.target} ({p.lane}): {p.result}; {what} ({p.log})")
            print("\n".join(shown))

    def table(self, end: float) -> phase_report.Block:
        rows = [("phase", "lane", "start", "end", "took", "result")]
        for p in self.phases:
            rows.append((p.target, p.lane + (" nice" if p.nice else ""),
                         "" if p.start is None else f"{p.start - self.t0:.0f} s",
                         "" if p.end is None else f"{p.end - self.t0:.0f} s",
                         "" if p.start is None else f"{p.seconds:.0f} s", p.result))
        lanes = dict.fromkeys(p.lane for p in self.phases)
        notes = [f"lane {lane}: {sum(p.seconds for p in self.phases if p.lane == lane):.0f} s "
                 "of phases" for lane in lanes]
        bad = [p.target for p in self.phases if not p.passed]
        notes.append(f"total: {end - self.t0:.0f} s wall; "
                     + ("every phase passed" if not bad else f"did not pass: {', '.join(bad)}"))
        return "make test: time per phase (lanes run side by side)", rows, notes

    def measured(self, p: Phase) -> dict:
        """The phase's scenarios (junit=) and compile time (ninja=), for the report."""
        not_run = {"problem": "the phase did not run"}
        got = {}
        if p.junit:
            got["scenarios"] = (not_run if p.start is None else
                                measure(phase_report.scenarios, p.junit, p.wall_start))
        if p.ninja:
            got["compile"] = {"dir": p.ninja, **(p.compile or not_run)}
        return got


def measure(fn: Callable[..., dict], *args: object) -> dict:
    """fn(*args), or what went wrong: the report never stops the run."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001
        return {"problem": f"not measured ({type(e).__name__}: {e})"}


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--make", default="make", help="the make command (e.g. $(MAKE))")
    ap.add_argument("--out", default="out/test-phases", type=pathlib.Path)
    ap.add_argument("--deadline", type=float, default=45 * 60,
                    help="seconds one phase may take before it is killed (default 2700)")
    ap.add_argument("phases", nargs="+", metavar="LANE:TARGET[:nice][:after=A,B][:done=A,B]")
    args = ap.parse_args(argv)
    return Runner(parse(args.phases), args.make.split(), args.out, args.deadline).run()


if __name__ == "__main__":
    sys.exit(main())
