"""The model against the C++ engine alone and against rxe, driven by pytest runs of rdmalab's
plugin.

(a) connect+disconnect cycles per second: a Python loop through rdmalab's Python API
    (test_bench_cm_cycles below: resources.CmPair, disconnect, close, one new pair of event
    channels, ids, QPs and MRs per cycle, the two processes made once) on a model lab
    (--lab model:roce), beside the same cycle through the C++ API (bench/model_bench.cc) and,
    unless model-only, on the two-VM rxe lab (--lab vm:rxe --vm-hosts 2: the guests' host
    agents, reached over SSH, each running a verbs lab);
(b) the CM-timer scenario tests/scenarios/test_cm.py::test_every_drep_dropped (16 DREQs 6.4 s
    apart, DISCONNECTED(ETIMEDOUT) ~102 s after rdma_disconnect, then TIMEWAIT): its wall time
    from Python beside the C++ engine alone running the same DREP loss, and (with rxe) the
    virtual time it covers per wall second beside the same scenario on rxe;
(c) a swarm seed's fixed cost: a model lab with 2 and with 4 hosts, a process and an event
    channel (pump started) on each, shut down; from Python and from C++.

The pytest runs load this module as a plugin (-p bench.model): its hook times each test's call
phase (wall clock and lab.now_ns) into a JSON-lines file, and the cycle test is collected from
this file. The rxe run boots the guests once for both tests. Model only (no VMs):

    PYTHONPATH=.:bindings /usr/bin/python3 -m bench.model [--quick] [--build build]
"""
from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

import pytest

from .report import Figure

REPO = pathlib.Path(__file__).resolve().parents[1]
PYTHON = "/usr/bin/python3"
SCENARIO = "tests/scenarios/test_cm.py::test_every_drep_dropped"
CYCLE_TEST = "bench/model.py::test_bench_cm_cycles"
CXX_BENCH = "rdmalab_bench_model"       # bench/model_bench.cc, in <build>/bench
DREP_GOAL_S = 0.050                      # issue 17 item 8: the Python-driven DREP loss
CYCLES_GOAL = 5000.0                     # and the Python connect+disconnect cycles per second
TIMING_ENV = "RDMALAB_BENCH_TIMING"      # the JSON-lines file the plugin appends to
CYCLES_ENV = "RDMALAB_BENCH_CM_CYCLES"   # "max cycles,max wall seconds"
MODEL_RUNS = 3                           # model runs (cheap): the median is reported
RXE_TIMEOUT_S = 900.0
MODEL_TIMEOUT_S = 300.0


class ModelBenchError(RuntimeError):
    pass


def _log(msg: str) -> None:
    print(f"[bench model {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- the pytest side (in the subprocess) ---------------------------------------------------

def _append(record: dict) -> None:
    path = os.environ.get(TIMING_ENV)
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps(record) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """Times the call phase of every test that has a lab: wall clock and the lab's clock."""
    lab = getattr(item, "funcargs", {}).get("lab")
    if lab is None or not os.environ.get(TIMING_ENV):
        yield
        return
    v0, w0 = lab.now_ns, time.monotonic_ns()
    outcome = yield
    w1, v1 = time.monotonic_ns(), lab.now_ns
    _append({"test": item.name, "nodeid": item.nodeid, "wall_s": (w1 - w0) / 1e9,
             "virtual_s": (v1 - v0) / 1e9, "passed": outcome.excinfo is None,
             "error": None if outcome.excinfo is None else repr(outcome.excinfo[1])[:500]})


def test_bench_cm_cycles(lab):
    """Connect and disconnect through rdma_cm, again and again (collected only when this file
    is named on pytest's command line, as run() does)."""
    from rdmalab.api.resources import CmPair
    max_cycles, max_s = (float(x) for x in os.environ.get(CYCLES_ENV, "200,10").split(","))
    server = lab.host("b").process("bench-cm-server")
    client = lab.host("a").process("bench-cm-client")
    n, w0, v0 = 0, time.monotonic_ns(), lab.now_ns
    while n < max_cycles and (time.monotonic_ns() - w0) / 1e9 < max_s:
        pair = CmPair(lab, process_server=server, process_client=client, port=20000 + n)
        pair.disconnect()
        pair.close()
        n += 1
    _append({"test": "cm_cycles", "cycles": n, "wall_s": (time.monotonic_ns() - w0) / 1e9,
             "virtual_s": (lab.now_ns - v0) / 1e9})
    assert n > 0


# ---- the driver (bench/__main__) -----------------------------------------------------------

def _pytest(lab: str, extra: list[str], timing: pathlib.Path, cycles: str, log: pathlib.Path,
            timeout_s: float) -> float:
    timing.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{REPO / 'bindings'}", **{TIMING_ENV: str(timing),
                                                                      CYCLES_ENV: cycles})
    argv = [PYTHON, "-m", "pytest", "-p", "rdmalab.run.pytest_plugin", "-p", "bench.model", "-q",
            "-p", "no:cacheprovider", "--lab", lab, *extra, SCENARIO, CYCLE_TEST]
    t0 = time.monotonic()
    with open(log, "w") as fh:
        try:
            p = subprocess.run(argv, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise ModelBenchError(f"pytest --lab {lab} ran past {timeout_s:.0f} s (log {log})") \
                from None
    wall = time.monotonic() - t0
    if p.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise ModelBenchError(f"pytest --lab {lab} failed (rc {p.returncode}, log {log}):\n{tail}")
    return wall


def _read(timing: pathlib.Path) -> dict:
    recs = [json.loads(line) for line in timing.read_text().splitlines() if line.strip()]
    out = {}
    for r in recs:
        if r["test"] == "cm_cycles":
            out["cycles"] = r
        elif r["test"] == "test_every_drep_dropped" or r["test"].startswith("test_every_drep"):
            out["scenario"] = r
    for r in recs:
        if r["test"].startswith("test_bench_cm_cycles") and "cycles" in out:
            out["cycles"]["call_wall_s"] = r["wall_s"]
    if "scenario" not in out or "cycles" not in out:
        raise ModelBenchError(f"{timing}: the timings of both tests are missing: {recs}")
    if not out["scenario"]["passed"]:
        raise ModelBenchError(f"the DREP-dropped scenario failed: {out['scenario']['error']}")
    return out


def _cxx(build: str, quick: bool, out: pathlib.Path) -> dict:
    """The C++ reference: the same DREP loss, cycle and lab figures through the C++ API."""
    exe = (REPO / build / "bench" / CXX_BENCH).resolve()
    if not exe.exists():
        raise ModelBenchError(f"{exe} is not built: cmake --build {build} --target {CXX_BENCH} "
                              "(make bench builds it)")
    argv = [str(exe), "--drep-runs", "3" if quick else "5", "--cycles", "500" if quick else "5000",
            "--cycle-seconds", "2" if quick else "5", "--labs", "100" if quick else "500"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=MODEL_TIMEOUT_S)
    (out / "model-cxx.json").write_text(p.stdout)
    if p.returncode != 0:
        raise ModelBenchError(f"{' '.join(argv)} failed (rc {p.returncode}): {p.stderr[-2000:]}")
    return json.loads(p.stdout)


def measure_labs(n: int) -> dict:
    """Python: make a model lab (roce) with 2 and with 4 hosts, a process and an event channel
    with its pump on each host, shut it down; ms per lab (the median of 3 batches of n)."""
    import rdmalab

    def one(hosts: tuple, seed: int) -> None:
        lab = rdmalab.model_lab(seed=seed, hosts=hosts, personality="roce")
        for h in hosts:
            lab.host(h).process("p").event_channel()
        lab.shutdown()

    out = {}
    for k in (2, 4):
        hosts = tuple("abcd"[:k])
        for i in range(5):
            one(hosts, 1000 + i)
        batches = []
        for b in range(3):
            t0 = time.perf_counter()
            for i in range(n):
                one(hosts, 1 + b * n + i)
            batches.append((time.perf_counter() - t0) / n * 1e3)
        out[f"{k}_hosts_ms"] = statistics.median(batches)
    return out


def _py_labs(quick: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{REPO / 'bindings'}")
    argv = [PYTHON, "-m", "bench.model", "--labs-only", "100" if quick else "300"]
    p = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=MODEL_TIMEOUT_S)
    if p.returncode != 0:
        raise ModelBenchError(f"{' '.join(argv)} failed (rc {p.returncode}): {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _model_figures(model: list, cxx: dict, py_labs: dict) -> list[Figure]:
    runs = f"median of {len(model)} pytest runs" if len(model) > 1 else "1 pytest run"
    sc_wall = statistics.median(r["scenario"]["wall_s"] for r in model)
    sc_virt = statistics.median(r["scenario"]["virtual_s"] for r in model)
    rate = statistics.median(r["cycles"]["cycles"] / r["cycles"]["wall_s"] for r in model)
    drep, cyc, labs = cxx["drep"], cxx["cycles"], cxx["labs"]
    figs = [
        Figure("model", "DREP-loss scenario wall time, Python-driven", sc_wall, "s",
               "C++ engine alone, same DREP loss", drep["median_wall_s"], better="lower",
               note=f"{SCENARIO} call phase on model:roce ({runs}), {sc_virt:.1f} s virtual; "
                    f"goal < {DREP_GOAL_S * 1e3:.0f} ms: "
                    f"{'met' if sc_wall < DREP_GOAL_S else 'MISSED'}; C++: median of "
                    f"{drep['runs']} runs, {drep['virtual_s']:.1f} s virtual"),
        Figure("model", "connect+disconnect cycles/s, Python loop (CmPair)", rate, "cycles/s",
               "C++ engine alone, same cycle", cyc["per_s"], better="higher",
               note=f"model:roce ({runs}; cycles per run: "
                    f"{'/'.join(str(r['cycles']['cycles']) for r in model)}); goal > "
                    f"{CYCLES_GOAL:.0f}/s: {'met' if rate > CYCLES_GOAL else 'MISSED'}; C++: "
                    f"{cyc['cycles']} cycles in {cyc['wall_s']:.2f} s"),
    ]
    for k in (2, 4):
        key = f"{k}_hosts_ms"
        figs.append(Figure("model", f"model lab of {k} hosts: make, a pump per host, shut down",
                           py_labs[key], "ms", "C++ engine alone, same lab", labs[key],
                           better="lower",
                           note="a swarm seed's fixed cost; Python: rdmalab.model_lab, "
                                "host.process, process.event_channel, lab.shutdown"))
    return figs


def run(args) -> list[Figure]:
    quick = getattr(args, "quick", False)
    model_only = getattr(args, "model_only", False)
    out = args.out
    t_start = time.monotonic()

    model = []
    for i in range(1 if quick else MODEL_RUNS):
        timing = out / f"model-timing-model-{i}.jsonl"
        wall = _pytest("model:roce", [], timing, "500,3" if quick else "3000,10",
                       out / f"model-pytest-model-{i}.log", MODEL_TIMEOUT_S)
        model.append(dict(_read(timing), process_wall_s=wall))
        _log(f"model run {i + 1}: scenario {model[-1]['scenario']['wall_s']:.3f} s wall for "
             f"{model[-1]['scenario']['virtual_s']:.1f} s virtual; "
             f"{model[-1]['cycles']['cycles']} cycles in {model[-1]['cycles']['wall_s']:.2f} s")
    cxx = _cxx(getattr(args, "build", "build"), quick, out)
    _log(f"C++ engine alone: DREP loss {cxx['drep']['median_wall_s'] * 1e3:.2f} ms, "
         f"{cxx['cycles']['per_s']:.0f} cycles/s")
    py_labs = _py_labs(quick)
    figures = _model_figures(model, cxx, py_labs)
    if model_only:
        (out / "model.json").write_text(json.dumps({"model": model, "cxx": cxx,
                                                    "py_labs": py_labs}, indent=1) + "\n")
        return figures

    timing = out / "model-timing-rxe.jsonl"
    _log("rxe: booting two guests and running the same two tests (about 3 minutes)")
    wall = _pytest("vm:rxe", ["--vm-hosts", "2"], timing, "5,30" if quick else "20,60",
                   out / "model-pytest-rxe.log", RXE_TIMEOUT_S)
    rxe = dict(_read(timing), process_wall_s=wall)
    _log(f"rxe: scenario {rxe['scenario']['wall_s']:.1f} s wall; {rxe['cycles']['cycles']} "
         f"cycles in {rxe['cycles']['wall_s']:.1f} s; pytest {wall:.0f} s in all")
    (out / "model.json").write_text(json.dumps({"model": model, "cxx": cxx, "py_labs": py_labs,
                                                "rxe": rxe}, indent=1) + "\n")

    def med(key: str, sub: str) -> float:
        return statistics.median(r[sub][key] for r in model)

    m_rate = statistics.median(r["cycles"]["cycles"] / r["cycles"]["wall_s"] for r in model)
    r_rate = rxe["cycles"]["cycles"] / rxe["cycles"]["wall_s"]
    m_virt_per_cycle = statistics.median(r["cycles"]["virtual_s"] / r["cycles"]["cycles"]
                                         for r in model)
    m_sc_wall, m_sc_virt = med("wall_s", "scenario"), med("virtual_s", "scenario")
    r_sc_wall, r_sc_virt = rxe["scenario"]["wall_s"], rxe["scenario"]["virtual_s"]
    elapsed = time.monotonic() - t_start
    runs = f"median of {len(model)} model runs" if len(model) > 1 else "1 model run"
    return figures + [
        Figure("model", "connect+disconnect cycles/s (Python loop, CmPair)", m_rate, "cycles/s",
               "rxe VM pair (AgentLab)", r_rate, better="higher",
               note=f"model:roce {runs} (cycles per run: "
                    f"{'/'.join(str(r['cycles']['cycles']) for r in model)}), "
                    f"{m_virt_per_cycle * 1e3:.1f} ms virtual per cycle; rxe: "
                    f"{rxe['cycles']['cycles']} cycles in {rxe['cycles']['wall_s']:.1f} s "
                    f"({rxe['cycles']['wall_s'] / rxe['cycles']['cycles']:.2f} s per cycle) "
                    "through the guests' host agents"),
        Figure("model", "DREP-dropped scenario: virtual s per wall s", m_sc_virt / m_sc_wall,
               "x", "rxe (real time)", r_sc_virt / r_sc_wall, better="higher",
               note=f"{SCENARIO}: model covers {m_sc_virt:.1f} s of virtual time in "
                    f"{m_sc_wall:.3f} s wall ({runs}); on rxe the same test's clock is the "
                    f"controller's, {r_sc_virt:.1f} s in {r_sc_wall:.1f} s"),
        Figure("model", "DREP-dropped scenario wall time", m_sc_wall, "s", "rxe wall time",
               r_sc_wall, better="lower",
               note=f"the test's call phase only; whole pytest processes: model "
                    f"{statistics.median(r['process_wall_s'] for r in model):.1f} s, rxe "
                    f"{rxe['process_wall_s']:.0f} s (guest boot, agents, both tests); "
                    f"section {elapsed:.0f} s; logs and timings in {out}"),
    ]


def main(argv=None) -> int:
    """The model-only figures (no VMs), printed as `make bench` prints them."""
    import argparse

    from .report import table, write_json
    p = argparse.ArgumentParser(prog="python3 -m bench.model", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out/bench", help="folder for model.json and logs")
    p.add_argument("--build", default="build", help="the CMake build folder")
    p.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    p.add_argument("--labs-only", type=int, metavar="N", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.labs_only:  # the Python lab figures, in a process of their own (see _py_labs)
        print(json.dumps(measure_labs(args.labs_only)))
        return 0
    args.out = pathlib.Path(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    args.model_only = True
    figures = run(args)
    write_json(figures, args.out / "bench-model.json")
    print(table(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
