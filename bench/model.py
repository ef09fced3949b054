"""The model against rxe, both driven by the same pytest run of rdmalab's plugin.

(a) connect+disconnect cycles per second: a Python loop through rdmalab's Python API
    (test_bench_cm_cycles below: resources.CmPair, disconnect, close, one new pair of event
    channels, ids, QPs and MRs per cycle, the two processes made once) on a model lab
    (--lab model:roce) and on the two-VM rxe lab (--lab vm:rxe --vm-hosts 2: the guests'
    host agents, reached over SSH, each running a verbs lab);
(b) the CM-timer scenario tests/scenarios/test_cm.py::test_every_drep_dropped (16 DREQs 6.4 s
    apart, DISCONNECTED(ETIMEDOUT) ~102 s after rdma_disconnect, then TIMEWAIT): the virtual
    time it covers on the model (lab.now_ns over the test's call phase) per wall second, and
    its wall time beside the same scenario's wall time on rxe.

Both labs run in pytest subprocesses with this module loaded as a plugin (-p bench.model): its
hook times each test's call phase (wall clock and lab.now_ns) into a JSON-lines file, and the
cycle test is collected from this file. The rxe run boots the guests once for both tests.
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
    from rdmalab.resources import CmPair
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
    argv = [PYTHON, "-m", "pytest", "-p", "rdmalab.pytest_plugin", "-p", "bench.model", "-q",
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


def run(args) -> list[Figure]:
    quick = getattr(args, "quick", False)
    out = args.out
    t_start = time.monotonic()

    model = []
    for i in range(1 if quick else MODEL_RUNS):
        timing = out / f"model-timing-model-{i}.jsonl"
        wall = _pytest("model:roce", [], timing, "100,5" if quick else "1000,10",
                       out / f"model-pytest-model-{i}.log", MODEL_TIMEOUT_S)
        model.append(dict(_read(timing), process_wall_s=wall))
        _log(f"model run {i + 1}: scenario {model[-1]['scenario']['wall_s']:.3f} s wall for "
             f"{model[-1]['scenario']['virtual_s']:.1f} s virtual; "
             f"{model[-1]['cycles']['cycles']} cycles in {model[-1]['cycles']['wall_s']:.2f} s")

    timing = out / "model-timing-rxe.jsonl"
    _log("rxe: booting two guests and running the same two tests (about 3 minutes)")
    wall = _pytest("vm:rxe", ["--vm-hosts", "2"], timing, "5,30" if quick else "20,60",
                   out / "model-pytest-rxe.log", RXE_TIMEOUT_S)
    rxe = dict(_read(timing), process_wall_s=wall)
    _log(f"rxe: scenario {rxe['scenario']['wall_s']:.1f} s wall; {rxe['cycles']['cycles']} "
         f"cycles in {rxe['cycles']['wall_s']:.1f} s; pytest {wall:.0f} s in all")
    (out / "model.json").write_text(json.dumps({"model": model, "rxe": rxe}, indent=1) + "\n")

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
    return [
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
