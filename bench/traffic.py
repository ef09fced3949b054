"""The traffic engine against perftest, on one rxe pair of the VM lab.

Boots two rxe guests (bindings/rdmalab/machines/vmlab), then in rounds, per test: Debian's perftest (ib_send_bw,
ib_write_bw, ib_read_bw, ib_send_lat; server in vm1, client in vm2 pointing at 10.0.0.1)
over every size, and rdmalab_bench_traffic (bench/traffic_bench.cc: the same measurements
through stack::Traffic, its CompletionLedger and the verbs backend, History on, polling
through Traffic::poll in a busy loop as perftest polls ibv_poll_cq: rdmalab's engine as a load
generator uses it) over the same sizes,
iteration counts, queue depths, cq moderation, outstanding reads and MTU. Which of the two goes
first alternates between rounds; each figure is the median over the rounds, its note lists the
rounds and rxe's counters of retransmissions and duplicate or out-of-sequence requests (lost
frames and the resends they cause, which weigh on the rates of both tools alike).

At 64 B (SEND rate and SEND latency) diagnostics break the engine down, each beside the same
perftest runs: the engine with the paced wait scenarios use (Traffic::wait_completions: polls
1 us apart, the gap doubling to 100 us while the CQ is empty, sleeping between); without its
History; rdmalab's verbs
objects alone (no Traffic, ledger or History); and a raw baseline, the same program on
ibv_post_send/ibv_poll_cq, which tells this program's own cost from the layers'. One run times
each post and poll call; --role micro times the engine layers' CPU per WR over a stand-in
provider in the guest and natively on this host.

Fairness: perftest gets -I 0 (rdmalab's SendWr has no inline flag), -x 1 (the RoCEv2 GID of
10.0.0.x, as the bench's --gid-index 1), -m 1024, -t/-r/-Q as the bench, -o for READ, -F (TCG
guests have no cpufreq). Both run on the same two 1-vCPU TCG guests, joined by the lab's switch
process, on a host whose 2 cores are shared: absolute rates are TCG's, the ratio is the point.
"""
from __future__ import annotations

import json
import pathlib
import statistics
import threading
import time

from .report import Figure

REPO = pathlib.Path(__file__).resolve().parents[1]
SIZES = [64, 1024, 4096, 65536]
# Iterations per size: about 2-5 s each on two TCG guests (rxe moves ~2-3k packets/s there).
BW_ITERS = {64: 5000, 1024: 5000, 4096: 2000, 65536: 200}
LAT_ITERS = {64: 1000, 1024: 1000, 4096: 500, 65536: 60}
QUICK_BW_ITERS = {64: 1000, 1024: 1000, 4096: 400, 65536: 40}
QUICK_LAT_ITERS = {64: 200, 1024: 200, 4096: 100, 65536: 20}
TX_DEPTH, RX_DEPTH, CQ_MOD, OUT_READS, MTU = 128, 512, 100, 16, 1024
GID_INDEX = 1  # rxe: ::ffff:10.0.0.N (RoCEv2); bindings/rdmalab/machines/vmlab/up.py GID_INDEX
PERFTEST_PORT, BENCH_PORT = 18515, 18600
TESTS = {  # bench test -> (perftest binary, figure name)
    "send_bw": ("ib_send_bw", "SEND"),
    "write_bw": ("ib_write_bw", "RDMA WRITE"),
    "read_bw": ("ib_read_bw", "RDMA READ"),
    "send_lat": ("ib_send_lat", "SEND latency"),
}
RUN_TIMEOUT_S = 180.0
RATE_GOAL, LAT_GOAL = 0.9, 1.1


class TrafficError(RuntimeError):
    pass


def _log(msg: str) -> None:
    print(f"[bench traffic {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def host_devices() -> list[str]:
    root = pathlib.Path("/sys/class/infiniband")
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


# ---- perftest -------------------------------------------------------------------------------

def perftest_argv(test: str, size: int, iters: int) -> str:
    binary = TESTS[test][0]
    args = [binary, "-d", "rxe0", "-x", str(GID_INDEX), "-F", "-s", str(size), "-n", str(iters),
            "-m", str(MTU), "-p", str(PERFTEST_PORT)]
    if test == "send_lat":
        args += ["-I", "0"]  # ib_send_lat inlines up to 236 B by default; the engine cannot
    else:
        args += ["-t", str(TX_DEPTH), "-Q", str(CQ_MOD)]
        if test == "read_bw":
            args += ["-o", str(OUT_READS)]
        else:
            args += ["-I", "0"]
        if test == "send_bw":
            args += ["-r", str(RX_DEPTH)]
    return " ".join(args)


def parse_perftest(test: str, size: int, out: str) -> dict:
    """The result row under perftest's '#bytes' header: BW tests give MsgRate[Mpps] last,
    ib_send_lat t_min, t_max, t_typical, t_avg, t_stdev, 99%, 99.9% (usec)."""
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if "#bytes" not in line:
            continue
        for row in lines[i + 1:]:
            cols = row.split()
            if len(cols) >= 5 and cols[0] == str(size):
                vals = [float(c) for c in cols]
                if test == "send_lat":
                    return {"t_typical_us": vals[4], "t_avg_us": vals[5], "t_min_us": vals[2],
                            "t_p99_us": vals[7] if len(vals) > 7 else None}
                return {"msg_rate_mpps": vals[-1], "bw_avg_mb_s": vals[3]}
    raise TrafficError(f"{TESTS[test][0]} -s {size}: no result row in its output:\n{out[-1500:]}")


# ---- running a server/client pair in the guests ---------------------------------------------

def _wait_listening(vm, port: int, server: dict, deadline_s: float = 30.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if "r" in server:  # the server already exited: it failed
            return
        if f":{port} " in vm.run(f"ss -Hltn 'sport = :{port}'", 10).out:
            return
        time.sleep(0.2)
    raise TrafficError(f"{vm.spec.name}: nothing listens on TCP port {port} after {deadline_s} s")


COUNTERS = "/sys/class/infiniband/rxe0/ports/1/hw_counters"
# rxe's counters (rxe_hw_counters.c) that say a run was not clean: the requester's
# retransmissions (completer_retry_err: a timeout or a NAK made it resend), sequence NAKs it got,
# RNR NAKs, and the responder's duplicate / out-of-sequence requests (lost or resent packets).
TROUBLE = ("completer_retry_err", "rcvd_seq_err", "rcvd_rnr_err", "send_rnr_err",
           "duplicate_request", "out_of_seq_request")


def counters(vm) -> dict:
    out = {}
    for line in vm.run(f"grep -H . {COUNTERS}/*", 10).out.splitlines():
        path, _, value = line.rpartition(":")
        if value.strip().isdigit():
            out[path.rsplit("/", 1)[-1]] = int(value)
    return out


def run_pair(lab, server_cmd: str, client_cmd: str, port: int, what: str):
    """Server in vm1, client in vm2 (to 10.0.0.1); both results and the rxe counters' changes
    on both guests (summed), or TrafficError naming the side that failed with its output."""
    srv_vm, cli_vm = lab.vms[0], lab.vms[1]
    before = [counters(srv_vm), counters(cli_vm)]
    server: dict = {}

    def serve():
        try:
            server["r"] = srv_vm.run(server_cmd, RUN_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - reported below
            server["e"] = e

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    _wait_listening(srv_vm, port, server)
    client = cli_vm.run(client_cmd, RUN_TIMEOUT_S)
    t.join(RUN_TIMEOUT_S + 30)
    if "e" in server:
        raise TrafficError(f"{what}: server: {server['e']}")
    s = server.get("r")
    if s is None:
        raise TrafficError(f"{what}: the server never returned")
    if client.rc != 0 or client.timed_out or s.rc != 0 or s.timed_out:
        raise TrafficError(
            f"{what} failed: client rc {client.rc} (timed out {client.timed_out}), server rc "
            f"{s.rc} (timed out {s.timed_out})\n--- client:\n{client.out[-1500:]}"
            f"{client.err[-1500:]}\n--- server:\n{s.out[-1000:]}{s.err[-1000:]}")
    after = [counters(srv_vm), counters(cli_vm)]
    delta = {k: sum(a.get(k, 0) - b.get(k, 0) for a, b in zip(after, before))
             for k in set(after[0]) | set(after[1])}
    return client, s, delta


def run_perftest(lab, test: str, size: int, iters: int) -> dict:
    argv = perftest_argv(test, size, iters)
    client, _, delta = run_pair(lab, argv, f"{argv} {lab.vms[0].spec.ip}", PERFTEST_PORT,
                                f"{TESTS[test][0]} -s {size}")
    return dict(parse_perftest(test, size, client.out), counters=delta)


def run_engine(lab, binary: pathlib.Path, test: str, sizes: list[int], iters: dict,
               modes=("engine",), waits=("pace",), profile: bool = False) -> list[dict]:
    common = (f"--dev rxe0 --gid-index {GID_INDEX} --port {BENCH_PORT} --timeout-s "
              f"{RUN_TIMEOUT_S - 30:.0f} --max-s {RUN_TIMEOUT_S - 10:.0f}")
    n = ",".join(f"{s}:{iters[s]}" for s in sizes)
    client = (f"{binary} --role client --peer {lab.vms[0].spec.ip} {common} --tests {test} "
              f"--sizes {','.join(map(str, sizes))} --iters-for {n} --lat-iters {iters[sizes[0]]} "
              f"--modes {','.join(modes)} --waits {','.join(waits)} --tx-depth {TX_DEPTH} "
              f"--rx-depth {RX_DEPTH} --cq-mod {CQ_MOD} --out-reads {OUT_READS} --mtu {MTU}"
              f"{' --profile on' if profile else ''}")
    if test == "send_lat" and len(sizes) > 1:  # --lat-iters is one number: one call per size
        out = []
        for s in sizes:
            out += run_engine(lab, binary, test, [s], iters, modes, waits, profile)
        return out
    c, _, delta = run_pair(lab, f"{binary} --role server {common}", client, BENCH_PORT,
                           f"rdmalab_bench_traffic {test}")
    try:
        results = json.loads(c.out)["results"]
        for r in results:  # one size and mode per call: the counters are that run's
            r["counters"] = delta if len(results) == 1 else None
        return results
    except (ValueError, KeyError) as e:
        raise TrafficError(f"rdmalab_bench_traffic printed no JSON ({e}):\n{c.out[-1500:]}") \
            from None


# ---- figures ----------------------------------------------------------------------------------

def _metric(test: str) -> str:
    return "t_typical_us" if test == "send_lat" else "msg_rate_mpps"


def _spread(vals: list[float], scale: float) -> str:
    return "/".join(f"{v * scale:.3g}" for v in vals)


def _figure(test: str, size: int, name_suffix: str, ours: list[float], ref: list[float],
            goal: bool, extra: str = "") -> Figure:
    lat = test == "send_lat"
    scale = 1.0 if lat else 1000.0  # Mpps -> kmsg/s
    unit = "us" if lat else "kmsg/s"
    name = (f"SEND {size} B latency (typical)" if lat else f"{TESTS[test][1]} {size} B rate")
    note = (f"rounds: rdmalab {_spread(ours, scale)}, perftest {_spread(ref, scale)} {unit}"
            + (f"; {extra}" if extra else ""))
    return Figure(
        section="traffic", name=name + name_suffix,
        value=statistics.median(ours) * scale if ours else float("nan"), unit=unit,
        reference_name=TESTS[test][0], reference=statistics.median(ref) * scale if ref else None,
        better="lower" if lat else "higher",
        goal=(LAT_GOAL if lat else RATE_GOAL) if goal else None, note=note)


def _profile_note(r: dict) -> str:
    p = r.get("profile")
    if not p:
        return ""
    return (f"timed per call in a separate run (typical {r['t_typical_us']:.0f} us there): "
            f"post_send {p['post_send_us_avg']:.0f} us, post_recv {p['post_recv_us_avg']:.1f} us, "
            f"empty poll {p['poll_empty_us_avg']:.1f} us (a poll that finds the completion also "
            f"holds the interrupt that made it: {p['poll_hit_us_avg']:.0f} us)")


MICRO_ITERS = 20000


def micro(run_cmd, binary: pathlib.Path) -> dict:
    """rdmalab_bench_traffic --role micro: the engine layers' CPU per WR (ns), no device."""
    out = run_cmd(f"{binary} --role micro --iters {MICRO_ITERS}")
    try:
        return json.loads(out)["results"]
    except (ValueError, KeyError) as e:
        raise TrafficError(f"--role micro printed no JSON ({e}): {out[-800:]}") from None


def one_way_layers_us(m: dict) -> tuple[float, float]:
    """The engine's own CPU on the answering side of one ping-pong leg: the receive's
    completion polled, a receive re-posted, the answer posted (unsignaled), through Traffic and
    its ledger, and the verbs backend's records (History on). Returns (Traffic + ledger,
    verbs conversion + records), in us."""
    traffic = (m["traffic_history_recv_and_poll_ns"] + m["traffic_history_unsignaled_send_ns"]) / 1e3
    verbs = (2 * m["verbs_post_json_record_ns"] + 2 * m["verbs_post_convert_ns"]
             + m["verbs_poll_1wc_json_record_ns"]) / 1e3
    return traffic, verbs


def run(args) -> list[Figure]:
    from rdmalab.machines.vmlab.vm import VmGroup

    binary = (REPO / args.build / "bench" / "rdmalab_bench_traffic").resolve()
    if not binary.exists():
        raise TrafficError(f"{binary} is not built: cmake --build {args.build} "
                           "--target rdmalab_bench_traffic (make bench builds it)")
    real = host_devices()
    device_note = (f"this machine has RDMA devices ({', '.join(real)}): run "
                   f"{binary.name} --role server/--role client on two of them by hand"
                   if real else "no real device on this machine: rxe in the VM lab only")
    quick = getattr(args, "quick", False)
    sizes = [64, 4096] if quick else SIZES
    bw_iters = QUICK_BW_ITERS if quick else BW_ITERS
    lat_iters = QUICK_LAT_ITERS if quick else LAT_ITERS
    rounds = 1 if quick else 3
    tests = list(TESTS)

    ours: dict = {}   # (test, size, variant) -> [values]
    ref: dict = {}    # (test, size) -> [values]
    raw: list = []
    diag: dict = {}   # (test, variant) -> last result (for the profile note)
    t_start = time.monotonic()
    with VmGroup(2, rdma="rxe") as lab:
        lab.start_all()
        boot = lab.wait_all_ready()
        switch = "the fault switch (rdmalab-switch)" if lab.switch_control else "the Python switch"
        _log(f"two rxe guests ready in {max(boot):.1f} s; frames through {switch}")
        lab.vms[1].run(f"ping -c 1 -W 5 {lab.vms[0].spec.ip}", 15)  # ARP before the first run
        guest_micro = micro(lambda c: lab.vms[1].run(c, 120).out, binary)
        for rnd in range(rounds):
            for test in tests:
                iters = lat_iters if test == "send_lat" else bw_iters
                order = ("perftest", "rdmalab") if rnd % 2 == 0 else ("rdmalab", "perftest")
                for who in order:
                    t0 = time.monotonic()
                    if who == "perftest":
                        for size in sizes:
                            r = run_perftest(lab, test, size, iters[size])
                            ref.setdefault((test, size), []).append(r[_metric(test)])
                            raw.append({"round": rnd, "tool": "perftest", "test": test,
                                        "size": size, **r})
                    else:
                        for size in sizes:  # one call per size: the rxe counters per run
                            for r in run_engine(lab, binary, test, [size], iters,
                                                waits=("poll",)):
                                ours.setdefault((test, size, "engine"), []).append(
                                    r[_metric(test)])
                                raw.append({"round": rnd, "tool": "rdmalab", **r})
                    _log(f"round {rnd + 1}/{rounds} {test}: {who} {time.monotonic() - t0:.1f} s")
            # Diagnostics at 64 B: where the engine's time goes (same round, same guests).
            for test in ("send_bw", "send_lat"):
                iters = lat_iters if test == "send_lat" else bw_iters
                t0 = time.monotonic()
                for r in run_engine(lab, binary, test, [64], iters,
                                    modes=("nohistory", "direct", "raw"),
                                    waits=("poll",)):
                    variant = f"{r['mode']}/{r['wait']}"
                    ours.setdefault((test, 64, variant), []).append(r[_metric(test)])
                    raw.append({"round": rnd, "tool": "rdmalab", "diagnostic": True, **r})
                for r in run_engine(lab, binary, test, [64], iters, waits=("pace",)):
                    ours.setdefault((test, 64, "engine/pace"), []).append(r[_metric(test)])
                    raw.append({"round": rnd, "tool": "rdmalab", "diagnostic": True, **r})
                _log(f"round {rnd + 1}/{rounds} {test} 64 B diagnostics {time.monotonic() - t0:.1f} s")
        # Once, apart (timing each call perturbs what it times): where a ping-pong leg's time
        # goes per call, for the raw baseline, the verbs objects and the engine.
        for r in run_engine(lab, binary, "send_lat", [64], lat_iters,
                            modes=("raw", "direct", "engine"), waits=("poll",), profile=True):
            diag[r["mode"]] = r
            raw.append({"round": None, "tool": "rdmalab", "diagnostic": True, **r})
    import subprocess
    host_micro = micro(lambda c: subprocess.run(c, shell=True, capture_output=True, text=True,
                                                timeout=120).stdout, binary)
    elapsed = time.monotonic() - t_start
    (args.out / "traffic.json").write_text(json.dumps(
        {"runs": raw, "micro_guest_ns": guest_micro, "micro_host_ns": host_micro}, indent=1)
        + "\n")

    def trouble(tool: str, test: str, size: int) -> str:
        runs = [r for r in raw if r["tool"] == tool and r.get("test") == test
                and r.get("size") == size and not r.get("diagnostic") and r.get("counters")]
        if not runs:
            return "n/a"
        total = {k: sum(r["counters"].get(k, 0) for r in runs) for k in TROUBLE}
        return ", ".join(f"{k} {v}" for k, v in total.items() if v) or "none"

    figures = []
    for test in tests:
        for size in sizes:
            figures.append(_figure(
                test, size, "", ours.get((test, size, "engine"), []), ref.get((test, size), []),
                goal=True, extra=f"rxe trouble counters over the rounds: rdmalab "
                                 f"{trouble('rdmalab', test, size)}; perftest "
                                 f"{trouble('perftest', test, size)}"))
    labels = {"engine/pace": ": engine, paced wait (Traffic::wait_completions, as scenarios)",
              "nohistory/poll": ": engine without History, busy poll",
              "direct/poll": ": verbs objects alone (no Traffic/ledger/History), busy poll",
              "raw/poll": ": baseline, this program on raw ibv_post_send/ibv_poll_cq"}
    for test in ("send_bw", "send_lat"):
        for variant, label in labels.items():
            vals = ours.get((test, 64, variant))
            if vals:
                extra = ""
                if test == "send_lat" and variant.endswith("/poll"):
                    extra = _profile_note(diag.get(variant.split("/")[0], {}))
                figures.append(_figure(test, 64, label, vals, ref.get((test, 64), []),
                                       goal=False, extra=extra))
    g_t, g_v = one_way_layers_us(guest_micro)
    h_t, h_v = one_way_layers_us(host_micro)
    for f in figures:
        if f.name == "SEND 64 B latency (typical)":
            f.note += _profile_note(diag.get("engine", {}))
            f.note += (f"; the engine's own CPU per answered message (completion polled, receive "
                       f"re-posted, answer posted; --role micro over a stand-in provider): "
                       f"{g_t + g_v:.0f} us in the guest (Traffic + ledger {g_t:.0f} us, verbs "
                       f"backend's WR conversion and History records {g_v:.0f} us), "
                       f"{(h_t + h_v) * 1e3:.0f} ns natively on this host")
    figures[0].note += (f"; {device_note}; two 1-vCPU TCG guests, {switch}; {rounds} rounds, "
                        f"section {elapsed:.0f} s; raw results in {args.out / 'traffic.json'}")
    return figures
