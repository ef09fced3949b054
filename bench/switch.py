"""The fault switch (faults/, rdmalab-switch): frames per second through it with no rules and
with 100 rules that match none of the frames, and the one-way latency it adds per frame, each
beside a direct link between the same two unix datagram sockets measured in the same run.

bench/switch_bench.cc does the measuring (it starts two switches of its own, one per rule count)
and prints one JSON object; this section runs it, keeps that JSON and its log under args.out
(switch.json, switch.log) and turns it into figures.

The sender, the receiver and the switches share one CPU (the last this process may use;
RDMALAB_BENCH_SWITCH_CPU=N picks another, =all lets the scheduler place them): the figures then
count the work per frame and per hop. Left to the scheduler in a VM, a thread woken on an idle
vCPU waits 20-30 us more at random, and a receiver left without a CPU for a moment loses frames
in the switch, which swamps what is measured."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
from typing import Optional

from .report import Figure

SECTION = "switch"
# The binary's own deadline (--deadline-s); the subprocess gets a little more on top.
DEADLINE_S = {False: 300, True: 60}


def binaries(build) -> tuple[pathlib.Path, pathlib.Path]:
    """(the benchmark, the switch) in the CMake build folder."""
    build = pathlib.Path(build)
    return build / "bench" / "rdmalab_bench_switch", build / "faults" / "rdmalab-switch"


def pinned_cpu() -> Optional[int]:
    """The CPU the benchmark runs on (RDMALAB_BENCH_SWITCH_CPU), None: wherever it is put."""
    want = os.environ.get("RDMALAB_BENCH_SWITCH_CPU", "").strip()
    if want == "all":
        return None
    if want:
        return int(want)
    return max(os.sched_getaffinity(0))


def measure(build, quick: bool = False, out: Optional[pathlib.Path] = None,
            cpu: Optional[int] = -1) -> dict:
    """Runs rdmalab_bench_switch and returns its JSON; raises with the log's tail if it fails.
    cpu: the CPU to pin it to (-1: pinned_cpu(); None: not pinned)."""
    bench, switch = binaries(build)
    for exe, target in ((bench, "rdmalab_bench_switch"), (switch, "rdmalab-switch")):
        if not exe.exists():
            raise FileNotFoundError(
                f"{exe} is not built: cmake --build {build} --target {target} "
                "(make bench builds every bench tool)")
    deadline = DEADLINE_S[bool(quick)]
    cmd = [str(bench), "--switch", str(switch), "--deadline-s", str(deadline)]
    if quick:
        cmd.append("--quick")
    if cpu == -1:
        cpu = pinned_cpu()
    if cpu is not None:
        cmd += ["--cpu", str(cpu)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=deadline + 30)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"{bench.name} did not end within {deadline + 30} s "
                           f"(its own deadline is {deadline} s)") from e
    if out is not None:
        out = pathlib.Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "switch.json").write_text(proc.stdout)
        (out / "switch.log").write_text(proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"{bench.name} exited with status {proc.returncode}: {tail}")
    return json.loads(proc.stdout)


def _result(data: dict, path: str, payload: int) -> dict:
    for r in data["results"]:
        if r["path"] == path and r["payload"] == payload:
            return r
    raise KeyError(f"no result for {path}, {payload} B")


def figures(data: dict) -> list[Figure]:
    """Per payload size: delivered frames/s through the switch with 0 and with N rules against
    the direct link's, then the median one-way latency (round trip / 2) with 0 and N rules
    against the direct link's. The first figure's note says what the frames and runs were."""
    n_rules = data["rules"]
    paths = [("switch_0_rules", "0 rules"), (f"switch_{n_rules}_rules", f"{n_rules} rules")]
    about = (f"RoCEv2 RC SEND_ONLY frames (Ethernet/IPv4/UDP 4791/BTH/payload/ICRC), one per "
             f"unix datagram as qemu's -netdev dgram carries them, A -> B directly or through "
             f"rdmalab-switch; {data['rounds']} round(s) of {data['duration_ms_per_round']} ms "
             f"sending and {data['iterations_per_round']} ping-pong round trips per path and "
             f"size, the paths interleaved; {_where(data)}; {n_rules} rules: none matches these frames (each "
             f"frame is checked against all {n_rules}, then forwarded; frames they matched: "
             f"{data['rules_matched']}); ")
    out: list[Figure] = []
    for size in data["sizes"]:
        payload, frame = size["payload"], size["frame_bytes"]
        direct = _result(data, "direct", payload)
        base = _result(data, "switch_0_rules", payload)
        rates, latencies = [], []
        for path, label in paths:
            r = _result(data, path, payload)
            against_0 = ""
            if path != "switch_0_rules":
                against_0 = (f"; against 0 rules: delivered "
                             f"{_ratio(r['delivered_per_s'], base['delivered_per_s'])}x, taken "
                             f"in {_ratio(r['sent_per_s'], base['sent_per_s'])}x")
            rates.append(Figure(
                section=SECTION,
                name=f"frames/s via switch, {label}, {payload} B",
                value=r["delivered_per_s"], unit="frames/s",
                reference_name="direct link", reference=direct["delivered_per_s"],
                better="higher",
                note=(f"{frame} B frames ({payload} B payload), A sending as fast as its next "
                      f"hop takes them: sent {r['sent']} ({r['sent_per_s']:.0f}/s taken in), "
                      f"delivered {r['delivered']}, loss {100 * r['loss']:.1f}% (the switch "
                      f"dropped {r.get('switch_dropped', 0)}: no room in B's queue, "
                      f"max_dgram_qlen {data['max_dgram_qlen']}); direct link loss "
                      f"{100 * direct['loss']:.1f}%{against_0}")))
            lat, dlat = r["latency"], direct["latency"]
            lost = f"; round trips without an echo: {lat['timeouts']}" if lat["timeouts"] else ""
            latencies.append(Figure(
                section=SECTION,
                name=f"one-way latency via switch, {label}, {payload} B",
                value=lat["one_way_median_us"], unit="us",
                reference_name="direct link", reference=dlat["one_way_median_us"],
                better="lower",
                note=(f"{frame} B frames, B echoing each: median of {lat['round_trips']} round "
                      f"trips / 2, the switch adds "
                      f"{lat['one_way_median_us'] - dlat['one_way_median_us']:.1f} us; p99 "
                      f"{lat['one_way_p99_us']:.1f} us (direct link "
                      f"{dlat['one_way_p99_us']:.1f} us){lost}")))
        out += rates + latencies
    if out:
        out[0].note = about + out[0].note
    return out


def _where(data: dict) -> str:
    if data.get("cpu") is None:
        return f"threads and switches placed by the scheduler on {data['cpus']} CPUs"
    return f"sender, receiver and switches pinned to CPU {data['cpu']} of {data['cpus']}"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def run(args) -> list[Figure]:
    data = measure(args.build, quick=getattr(args, "quick", False), out=args.out)
    return figures(data)
