"""What make test's phases spent their time on (tests/phases.py prints it after its phase table).

Device suites (a phase's junit=PATH,PATH): the JUnit files pytest wrote (--junitxml). Every
<testcase> gives a time, an outcome (passed, failed, error, skipped, xfail, xpass) and a run:
"model" or "device", from its `backend` property (the rdmalab plugin records it) or, without
one, from its id's lab parameter (`[model-roce]` is the model twin; any other run, e.g.
`[inventory-inventory-rxe]` or an unparametrized tests/vm check, is the device's). Shown: the
TOP longest testcases, labeled, and the time summed per run. A file that is missing, unreadable,
not JUnit, or older than the phase's start (left by an earlier run) is one line saying so.

Build phases (a phase's ninja=DIR): DIR/.ninja_log (v5: start_ms end_ms mtime output hash per
line). The log accumulates across runs: ninja_mark() notes its size and a digest of it when the
phase starts, compile_time() reads what was appended when it ends. A step that wrote several
outputs (one line each, same start, end and hash) counts once. Its target is the output's
`CMakeFiles/<target>.dir/` part, or, for a link step, the target its rule links in
DIR/build.ninja (`<LANG>_<TYPE>_LINKER__<target>_<config>`); anything else is "(other)". Shown:
targets by summed step seconds (per-file durations: ninja -j2 runs two steps at once, so the sum
can exceed the phase's wall time) and the SLOWEST steps. When ninja rewrote its log meanwhile
(it recompacts it now and then), the steps are those whose output's mtime is not older than the
mark. Two phases that share a build folder must not run at the same time.

Output: blocks(title, rows, notes), rendered by text() for the terminal and markdown() for
OUT/times.md; the dicts scenarios() and compile_time() return go into OUT/phases.json as is.
"""
from __future__ import annotations

import collections
import hashlib
import pathlib
import re
import time
import xml.etree.ElementTree as ET
from typing import Optional

TOP = 10
SLOWEST = 3
LOG = ".ninja_log"
MTIME_SLACK_S = 1.0  # file mtimes come from a coarser clock than time.time()

Block = tuple[str, Optional[list[tuple[str, ...]]], list[str]]  # title, rows (header first), notes
Step = collections.namedtuple("Step", "start end mtime output hash")


# ---- JUnit: the device suites' testcases

def scenarios(paths: list[str], since: Optional[float] = None) -> dict:
    """The testcases of a phase's JUnit files: the TOP longest, and the time per run."""
    files, cases = [], []
    for path in paths:
        got, problem = read_junit(pathlib.Path(path), since)
        files.append({"path": str(path), "testcases": len(got), "problem": problem})
        cases += got
    longest = sorted(cases, key=lambda c: (-c["seconds"], c["id"]))[:TOP]
    runs = {run: {"testcases": sum(1 for c in cases if c["run"] == run),
                  "seconds": sum(c["seconds"] for c in cases if c["run"] == run)}
            for run in ("device", "model")}
    return {"files": files, "testcases": len(cases), "longest": longest, **runs}


def read_junit(path: pathlib.Path, since: Optional[float]) -> tuple[list[dict], Optional[str]]:
    """One file's testcases, or none and a sentence saying why."""
    try:
        if since is not None and path.stat().st_mtime < since - MTIME_SLACK_S:
            return [], "older than the phase (left by an earlier run), not read"
        root = ET.parse(path).getroot()
    except FileNotFoundError:
        return [], "not written"
    except (OSError, ET.ParseError) as e:
        return [], f"unreadable ({e})"
    if root.tag not in ("testsuites", "testsuite"):
        return [], f"not a JUnit file (its root is <{root.tag}>)"
    cases = [testcase(el) for el in root.iter("testcase")]
    return cases, None if cases else "holds no testcases"


def testcase(el: ET.Element) -> dict:
    props = {p.get("name"): p.get("value") for p in el.iter("property")}
    name = el.get("name", "?")
    return {"seconds": seconds(el.get("time")), "outcome": outcome(el, props),
            "run": run_of(name, props), "id": test_id(el.get("classname", ""), name)}


def seconds(text: Optional[str]) -> float:
    try:
        return max(float(text or 0), 0.0)
    except ValueError:
        return 0.0


def outcome(el: ET.Element, props: dict) -> str:
    if el.find("failure") is not None:
        return "failed"
    if el.find("error") is not None:
        return "error"
    skipped = el.find("skipped")
    if skipped is not None:
        return "xfail" if skipped.get("type") == "pytest.xfail" else "skipped"
    return "xpass" if props.get("xpassed") == "true" else "passed"


def run_of(name: str, props: dict) -> str:
    if props.get("backend"):
        return "model" if props["backend"] == "model" else "device"
    params = name.partition("[")[2].rstrip("]")
    return "model" if re.search(r"(^|-)model-", params) else "device"


def test_id(classname: str, name: str) -> str:
    """("tests.scenarios.test_cm", "test_x[model-roce]") -> "test_cm.py::test_x[model-roce]"."""
    parts = classname.split(".") if classname else []
    if len(parts) >= 2 and parts[-1][:1].isupper():  # a test class
        return f"{parts[-2]}.py::{parts[-1]}::{name}"
    return f"{parts[-1]}.py::{name}" if parts else name


# ---- ninja: the build phases' steps

def ninja_mark(build_dir: str) -> dict:
    """Where DIR/.ninja_log ends now, taken when a build phase starts."""
    try:
        data = (pathlib.Path(build_dir) / LOG).read_bytes()
    except OSError:
        data = b""
    return {"size": len(data), "digest": hashlib.sha256(data).hexdigest(),
            "wall_ns": time.time_ns()}


def compile_time(build_dir: str, mark: dict) -> dict:
    """The steps ninja logged in DIR since mark, summed by target (taken at the phase's end)."""
    folder = pathlib.Path(build_dir)
    steps, problem, notes = new_steps(folder / LOG, mark)
    links = link_targets(folder)
    done = [(secs,) + target_of(outs, links) for secs, outs in edges(steps)]
    totals: dict[str, list] = {}
    for secs, target, _ in done:
        totals.setdefault(target, [0.0, 0])
        totals[target][0] += secs
        totals[target][1] += 1
    targets = [{"target": t, "seconds": s, "steps": n} for t, (s, n) in totals.items()]
    slowest = sorted(done, key=lambda d: (-d[0], d[2]))[:SLOWEST]
    return {"dir": str(build_dir), "problem": problem, "notes": notes, "steps": len(done),
            "sum_s": sum(d[0] for d in done),
            "targets": sorted(targets, key=lambda t: (-t["seconds"], t["target"])),
            "slowest": [{"seconds": s, "target": t, "output": o} for s, t, o in slowest]}


def new_steps(log: pathlib.Path, mark: dict) -> tuple[list[Step], Optional[str], list[str]]:
    try:
        data = log.read_bytes()
    except FileNotFoundError:
        return [], f"no {log}: ninja did not build there", []
    except OSError as e:
        return [], f"{log}: unreadable ({e})", []
    notes = []
    size = mark["size"]
    if len(data) >= size and hashlib.sha256(data[:size]).hexdigest() == mark["digest"]:
        steps, bad = parse_steps(data[size:])
    else:
        steps, bad = parse_steps(data)
        steps = [s for s in steps if s.mtime >= mark["wall_ns"]]
        notes.append("ninja rewrote its log during the phase: steps chosen by their "
                     "outputs' mtime")
    if bad:
        notes.append(f"{bad} unreadable line(s) of {log} skipped")
    return steps, None, notes


def parse_steps(data: bytes) -> tuple[list[Step], int]:
    steps, bad = [], 0
    for line in data.decode(errors="replace").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        f = line.split("\t")
        try:
            step = Step(int(f[0]), int(f[1]), int(f[2]), f[3], f[4])
        except (ValueError, IndexError):
            bad += 1
            continue
        if len(f) != 5 or step.end < step.start or not step.output:
            bad += 1
        else:
            steps.append(step)
    return steps, bad


def edges(steps: list[Step]) -> list[tuple[float, list[str]]]:
    """(seconds, outputs) per ninja step: its outputs' lines share start, end and hash."""
    outputs: dict[tuple, list[str]] = {}
    for s in steps:
        outputs.setdefault((s.start, s.end, s.hash), []).append(s.output)
    return [((end - start) / 1000, outs) for (start, end, _), outs in outputs.items()]


CMAKE_DIR = re.compile(r"(?:^|/)CMakeFiles/([^/]+)\.dir/")
LINK_EDGE = re.compile(r"^build ((?:[^:$\n]|\$.)+): \S+?_LINKER__(\S+)_[A-Za-z]*(?=\s|$)", re.M)


def target_of(outputs: list[str], links: dict[str, str]) -> tuple[str, str]:
    """(target, the output that names it) of one step."""
    for out in outputs:
        m = CMAKE_DIR.search(out)
        if m:
            return m.group(1), out
    linked = sorted((out for out in outputs if out in links), key=len)  # not its byproducts
    return (links[linked[0]], linked[0]) if linked else ("(other)", outputs[0])


def link_targets(folder: pathlib.Path) -> dict[str, str]:
    """{output: target} of the link steps in DIR/build.ninja ({} without one)."""
    try:
        text = (folder / "build.ninja").read_text(errors="replace")
    except OSError:
        return {}
    workdir = str(folder.resolve()) + "/"
    links = {}
    for m in LINK_EDGE.finditer(text):
        for out in re.split(r"(?<!\$) ", m.group(1).replace("${cmake_ninja_workdir}", workdir)):
            if out and out not in ("|", "||"):
                links[re.sub(r"\$(.)", r"\1", out)] = m.group(2)
    return links


# ---- rendering: blocks for the terminal and for times.md

def blocks(phase: str, took: float, measured: dict) -> list[Block]:
    got = []
    if "scenarios" in measured:
        got.append(scenario_block(phase, took, measured["scenarios"]))
    if "compile" in measured:
        got.append(compile_block(phase, took, measured["compile"]))
    return got


def scenario_block(phase: str, took: float, s: dict) -> Block:
    if "files" not in s:
        return f"{phase}: scenarios: {s.get('problem', 'none read')}", None, []
    notes = [f"{f['path']}: {f['problem']}" for f in s["files"] if f["problem"]]
    if not s["longest"]:
        return f"{phase}: scenarios: no testcases read", None, notes
    notes.append(f"device runs {s['device']['seconds']:.0f} s in {s['device']['testcases']} "
                 f"testcases, model runs {s['model']['seconds']:.0f} s in "
                 f"{s['model']['testcases']}; the phase took {took:.0f} s")
    rows = [("seconds", "outcome", "run", "test")] + [
        (f"{c['seconds']:.1f}", c["outcome"], c["run"], c["id"]) for c in s["longest"]]
    return f"{phase}: the {len(s['longest'])} longest of {s['testcases']} testcases", rows, notes


def compile_block(phase: str, took: float, c: dict) -> Block:
    title = f"{phase}: compile time by target ({c.get('dir', '?')}/{LOG})"
    if c.get("problem") or not c.get("steps"):
        return title, None, [c.get("problem") or "nothing built: no step logged during the "
                             "phase"] + c.get("notes", [])
    rows = [("seconds", "steps", "target")] + [
        (f"{t['seconds']:.1f}", str(t["steps"]), t["target"]) for t in c["targets"]]
    notes = c["notes"] + [
        f"{c['steps']} steps, {c['sum_s']:.0f} s summed, in a {took:.0f} s phase (ninja -j "
        "runs steps side by side: the sum can exceed the wall time)",
        "slowest: " + "; ".join(f"{s['seconds']:.1f} s {s['output']}" for s in c["slowest"])]
    return title, rows, notes


def text_table(rows: list[tuple[str, ...]]) -> list[str]:
    """Columns aligned; those of numbers ("12.5", "30 s") to the right."""
    columns = range(len(rows[0]))
    widths = [max(len(r[i]) for r in rows) for i in columns]
    right = [all(re.fullmatch(r"[\d.]+( s)?", r[i]) for r in rows[1:] if r[i]) for i in columns]
    lines = ["  ".join(c.rjust(w) if n else c.ljust(w) for c, w, n in zip(r, widths, right))
             .rstrip() for r in rows]
    return lines[:1] + ["  ".join("-" * w for w in widths)] + lines[1:]


def md_table(rows: list[tuple[str, ...]]) -> list[str]:
    cell = [[c.replace("|", "\\|") for c in r] for r in rows]
    lines = ["| " + " | ".join(r) + " |" for r in cell]
    return lines[:1] + ["|" + "---|" * len(rows[0])] + lines[1:]


def text(blocks_: list[Block]) -> str:
    lines: list[str] = []
    for title, rows, notes in blocks_:
        lines += ["", f"==== {title}"] + (text_table(rows) if rows else []) + notes
    return "\n".join(lines)


def markdown(blocks_: list[Block]) -> str:
    lines = ["# make test: where the time went", "",
             f"Written by tests/phases.py at the end of `make test`, "
             f"{time.strftime('%Y-%m-%d %H:%M %Z')}.", ""]
    for title, rows, notes in blocks_:
        lines += [f"## {title}", ""] + (md_table(rows) + [""] if rows else [])
        lines += [f"- {n}" for n in notes] + ([""] if notes else [])
    return "\n".join(lines)
