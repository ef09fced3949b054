"""A scenario's evidence bundle (rdmalab.report.evidence) on a fake device lab whose wire is the real
fault switch (build/faults/rdmalab-switch, frames sent through its socket): the capture decoded
into `wire` records by the switch's own parser, `rdma res` before and after, the kernel log and
its splats judged against the registry, a lost host noted without a hang; and the plugin's
failure text and JUnit properties."""

import json
import pickle
import pathlib
import socket
import subprocess
import textwrap
import time
import xml.etree.ElementTree as ET

import pytest

from rdmalab.report import evidence, evidence_host, evidence_wire
from rdmalab.machines import rdma_res
from rdmalab.paths import switch_binary
from rdmalab.findings import registry as findings, kernlog
from rdmalab.errors import Hung
from rdmalab.run.outcome import final_outcome, splat_failure

from roce_frames import MAC_A, MAC_B, roce_cm_req  # tests/python/roce_frames.py
from test_py_rules import connect_control  # tests/python/test_py_rules.py

DEADLINE_S = 10.0
WARN_AT = "WARNING: CPU: 0 PID: 9 at drivers/infiniband/sw/rxe/rxe_comp.c:598 rxe_completer"


def arp_from_b() -> bytes:
    return b"\xff" * 6 + bytes.fromhex(MAC_B.replace(":", "")) + b"\x08\x06" + bytes(28)


class Facts:
    def __init__(self, mac):
        self.device, self.mac = "rxe0", mac


class Machine:
    bridge_machine, bridge = None, ""  # the Machine protocol: no bridge on the path

    def __init__(self, name, mac):
        self.name, self.facts = name, Facts(mac)

    @property
    def kernel_machine(self):
        return self


class HostSide:
    """What rdmalab.report.evidence's host functions return in a host's agent."""

    def __init__(self, splat: bool):
        self.splat = splat
        self.objects = []

    def host_res(self, device):
        # rdma's batch output: one array a command (qp, cm_id, mr, cq, pd); another device's
        # QP, which a netns host would see too, is left out.
        qp = [{"ifname": "rxe0", "lqpn": n, "state": "RTS"} for n in self.objects] + \
            [{"ifname": "rxe9", "lqpn": 99}]
        return rdma_res.parse_batch("\n".join(json.dumps(x) for x in (qp, [], [], [], [])),
                                  0, "", device)

    def host_begin(self, kmsg, device):
        return {"res": self.host_res(device),
                "kmsg": {"boot_id": "boot-1", "seq": 100, "error": ""} if kmsg else None,
                "clock": (time.time_ns(), time.monotonic_ns())}

    def host_end(self, mark_json):
        assert json.loads(mark_json)["seq"] == 100
        records = [[101, 5_000_000, 6, "rdma_rxe: an ordinary line"]]
        if self.splat:
            records += [[102, 5_100_000, 4, WARN_AT + "+0x6f1/0xaf0 [rdma_rxe]"],
                        [103, 5_100_010, 4, "Call Trace:"],
                        [104, 5_100_020, 4, "---[ end trace 0000000000000000 ]---"]]
        return {"kmsg": {"records": records, "lost": 0, "truncated": False, "rebooted": False,
                         "boot_id": "boot-1", "error": ""},
                "clock": (time.time_ns(), time.monotonic_ns())}


class Agent:
    def __init__(self, side, hang=False):
        self.side, self.hang, self.offset_ns = side, hang, 0
        self.broken = ""

    def function(self, module, name):
        assert module == evidence.HOST_MODULE
        return getattr(self.side, name)

    def call_copy(self, module, name, *args, deadline_s=None, what=""):
        fn = self.function(module, name)
        got = fn(*args) if deadline_s is None else self.call_with_deadline(fn, deadline_s,
                                                                            what, *args)
        return pickle.loads(pickle.dumps(got))  # a copy, as rdmalab.agent.remote.Agent's

    def call_with_deadline(self, fn, deadline_s, what, *args):
        if self.broken:
            raise Hung(what, f"agent is broken: {self.broken}")
        if self.hang:
            self.broken = f"{what} did not return within {deadline_s} s"
            raise Hung(what, self.broken)
        return fn(*args)


class Faults:
    def switch_history(self):
        return [{"seq": 1, "t_ns": 5, "rule": 1, "action": "drop", "frame": {"cm": "REQ"}}]


class Pool:
    kernels = {"vm1": "6.1.0-56-amd64", "vm2": "6.1.0-56-amd64"}


class FakeLab:
    description = "vm:rxe"

    def __init__(self, control, splat=False, lost=(), hang=()):
        self.control = control
        self.addresses = {"a": "10.0.0.1", "b": "10.0.0.2"}
        self.machines = {"a": Machine("vm1", MAC_A), "b": Machine("vm2", MAC_B)}
        self.agents = {h: Agent(HostSide(splat), hang=h in hang) for h in self.addresses}
        self.lost = {h: {"machine": self.machines[h].name} for h in lost}
        self.stuck = []
        self.t0_ns = time.monotonic_ns()
        self.merged = []
        self.faults = Faults()
        self.pool = Pool()

    def machine_of(self, h):
        return self.machines[h]

    def devices_by_host(self):
        return {h: "rxe" for h in self.machines}

    def kernels_by_host(self):
        return {h: self.pool.kernels.get(m.name, "") for h, m in self.machines.items()}

    def record_stuck(self, h, agent):
        self.stuck.append(h)

    def agent_for(self, h):
        return self.agents[h]

    def lost_hosts(self):
        return self.lost

    def switch_path(self):
        return None if self.control.startswith("!") else self.control

    def merge_records(self, records):
        self.merged += records

    def history(self):
        return sorted(self.merged, key=lambda r: r["t_ns"])

    def write_history(self, path):
        pathlib.Path(path).write_text("".join(json.dumps(r) + "\n" for r in self.history()))


@pytest.fixture
def switch(tmp_path):
    """The real fault switch with two fake VM sockets: (control path, send(frame, from))."""
    binary = switch_binary()
    if not binary.exists():
        pytest.skip(f"{binary} is not built (cmake --build build --target rdmalab-switch)")
    sock, ctl = tmp_path / "sw.sock", tmp_path / "sw.ctl"
    vms = {h: tmp_path / f"{h}.sock" for h in "ab"}
    ends = {}
    for h, p in vms.items():
        ends[h] = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        ends[h].bind(str(p))
        ends[h].settimeout(DEADLINE_S)
    argv = [str(binary), "--sock", str(sock), "--control", str(ctl), "--keep"]
    for p in vms.values():
        argv += ["--peer", str(p)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        connect_control(ctl, proc, DEADLINE_S).close()  # listening, not only bound

        def send(frame, host):
            ends[host].sendto(frame, str(sock))
            ends["b" if host == "a" else "a"].recv(65536)  # forwarded: the switch has it
        yield str(ctl), send
    finally:
        proc.terminate()
        proc.wait(timeout=DEADLINE_S)
        for s in ends.values():
            s.close()


def test_bundle_holds_the_wire_the_stacks_and_a_clean_kernel_log(tmp_path, switch):
    control, send = switch
    lab = FakeLab(control)
    c = evidence.Collector(lab, tmp_path / "ev", scenario="tests/x.py::test_y[vm-rxe]",
                           column="vm-rxe")
    c.begin()
    send(roce_cm_req(), "a")
    send(arp_from_b(), "b")
    lab.agents["a"].side.objects = [17]
    c.scenario_end()
    assert c.finish() == []
    c.write_history()
    d = tmp_path / "ev"
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["scenario"] == "tests/x.py::test_y[vm-rxe]"
    assert manifest["kernel"] == {"a": "6.1.0-56-amd64", "b": "6.1.0-56-amd64"}
    for name in ("wire.pcap", "res-a-before.json", "res-b-after.json", "kmsg-a.txt",
                 "kmsg-b.txt", "switch.jsonl", "history.jsonl"):
        assert (d / name).is_file() and name in manifest["files"], name
    assert manifest["splats"] == [] and manifest["errors"] == [] and manifest["capped"] == {}
    assert json.loads((d / "res-a-before.json").read_text())["qp"] == []
    assert [q["lqpn"] for q in json.loads((d / "res-a-after.json").read_text())["qp"]] == [17]
    wire = [r for r in lab.merged if r["kind"] == "wire"]
    assert [(r["data"]["src_host"], r["data"]["dst_host"]) for r in wire] == [("a", "b"),
                                                                             ("b", "")]
    assert wire[0]["host"] == "switch" and wire[0]["object"] == "frame"
    assert wire[0]["data"]["frame"]["cm"] == "REQ"           # the switch's own parser
    assert wire[1]["data"]["frame"]["why"] == "ARP"
    now = time.monotonic_ns() - lab.t0_ns
    assert 0 <= wire[0]["t_ns"] <= wire[1]["t_ns"] <= now  # on the lab's time line
    assert kernlog.from_dmesg((d / "kmsg-a.txt").read_text())[0].text == \
        "rdma_rxe: an ordinary line"
    assert len((d / "history.jsonl").read_text().splitlines()) == 2
    assert manifest["cost_s"] < 0.5  # the bundle is cheap where the hosts answer at once


def test_a_splat_is_written_recorded_and_judged_against_the_registry(tmp_path):
    lab = FakeLab("!no switch", splat=True)
    lab.machines["a"].bridge = None
    reg = findings.parse(textwrap.dedent("""
        ["rxe-warns"]
        kind = "provider-fact"
        provider = "rxe"
        summary = "rxe WARNs in its completer"
        scenario = "tests/scenarios/test_x.py::test_y"
        kernel_log = ["rxe_comp\\\\.c:598"]
        kernels = { fixed = "v6.12: x" }
        """), "reg.toml")
    c = evidence.Collector(lab, tmp_path / "ev", scenario="s", column="vm-rxe", registry=reg)
    c.begin()
    c.scenario_end()
    splats = c.finish()
    assert [(s["host"], s["kind"], s["file"], s["expected_by"]) for s in splats] == [
        ("a", "warning", "splat-a-1.txt", "rxe-warns"), ("b", "warning", "splat-b-1.txt",
                                                         "rxe-warns")]
    assert splats[0]["first_line"].startswith(WARN_AT)
    text = (tmp_path / "ev" / "splat-a-1.txt").read_text()
    assert "Call Trace:" in text and "end trace" in text and "ordinary" not in text
    logs = [r for r in lab.merged if r["kind"] == "kernel_log"]
    assert len(logs) == 6 and logs[0]["host"] == "a" and logs[0]["object"] == "kmsg"
    assert logs[0]["data"]["splat"] is True and logs[0]["data"]["level"] == "warning"
    assert splat_failure([dict(s, evidence="ev") for s in splats]) == ""  # expected: no fail
    # On a kernel where the entry is fixed, the same splat fails the scenario.
    Pool.kernels = {"vm1": "6.12.117+deb13-amd64", "vm2": "6.12.117+deb13-amd64"}
    try:
        c2 = evidence.Collector(FakeLab("!no switch", splat=True), tmp_path / "ev2",
                                scenario="s", column="vm-rxe", registry=reg)
        c2.begin()
        bad = c2.finish()
    finally:
        Pool.kernels = {"vm1": "6.1.0-56-amd64", "vm2": "6.1.0-56-amd64"}
    assert [s["expected_by"] for s in bad] == [None, None]
    text = splat_failure([dict(s, evidence="ev2") for s in bad])
    assert text.startswith("KernelSplat: 2 kernel-log splat(s) on host(s) a, b")
    assert f"first on host a (6.12.117+deb13-amd64): {WARN_AT}" in text
    assert "ev2/splat-a-1.txt" in text
    manifest = json.loads((tmp_path / "ev2" / "manifest.json").read_text())
    assert manifest["capped"]["wire"].startswith("no capture")


def test_a_lost_or_hung_host_is_noted_not_waited_for(tmp_path):
    lab = FakeLab("!no switch", lost=("b",), hang=("a",))
    c = evidence.Collector(lab, tmp_path / "ev", scenario="s", column="vm-rxe")
    t = time.monotonic()
    c.begin()
    c.scenario_end()
    assert c.finish() == []
    assert time.monotonic() - t < 5.0
    errors = json.loads((tmp_path / "ev" / "manifest.json").read_text())["errors"]
    assert any(e.startswith("a: begin: Hung") for e in errors), errors
    assert lab.stuck == ["a"]  # its stacks recorded before anyone restarts it
    assert any(e.startswith("b: begin: the host was lost") for e in errors), errors
    assert any("no kernel-log mark" in e for e in errors), errors


def test_res_batch_output_maps_to_kinds_and_a_failed_kind_says_so():
    out = '[{"lqpn":1,"ifname":"rxe0"},{"lqpn":2,"ifname":"rxe1"}]\n[]\n'
    res = rdma_res.parse_batch(out, 1, "Unknown command mr", device="rxe0")
    assert res["qp"] == [{"lqpn": 1, "ifname": "rxe0"}] and res["cm_id"] == []
    assert res["mr"]["error"].startswith("rdma -j res show mr: rc 1: Unknown command mr")
    assert set(res) == set(rdma_res.KINDS)


def test_rdma_batch_process_answers_or_says_why(monkeypatch, tmp_path):
    """The agent's rdma batch process, with a stand-in rdma that answers two kinds and fails
    the third as rdma does (stops); the next query starts a new process."""
    fake = tmp_path / "rdma"
    fake.write_text("#!/bin/sh\nread a; echo '[{\"lqpn\":1,\"ifname\":\"rxe0\"}]'\n"
                    "read b; echo '[]'\nread c; echo \"Unknown: $c\" >&2; exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    rdma_res._RDMA.clear()
    res = rdma_res.batch("rxe0", deadline_s=5.0)
    assert res["qp"] == [{"lqpn": 1, "ifname": "rxe0"}] and res["cm_id"] == []
    assert "rdma exited" in res["mr"]["error"] and "Unknown: res show mr" in res["mr"]["error"]
    assert rdma_res._RDMA == {}  # stopped: the next query starts afresh
    assert rdma_res.batch("rxe0", deadline_s=5.0)["qp"] == [{"lqpn": 1, "ifname": "rxe0"}]
    assert rdma_res._RDMA == {}


def test_outcome_of_a_kernel_splat_is_failed():
    assert final_outcome({"call": "passed", "teardown": "failed",
                          "kernel_splat": "KernelSplat: ..."}) == "failed"
    assert final_outcome({"call": "passed", "teardown": "failed", "host_lost": "x",
                          "kernel_splat": "KernelSplat: ..."}) == "host_lost"


def test_model_runs_get_a_history_property_and_no_evidence(pytester, tmp_path):
    pytester.makepyfile(test_gen="""
        def test_one(lab):
            lab.run_for(1000)
        """)
    junit = tmp_path / "junit.xml"
    result = pytester.runpytest("-p", "rdmalab.run.pytest_plugin", "--lab", "model:roce",
                                "--history-dir", str(tmp_path / "out" / "history"),
                                "--junitxml", str(junit))
    result.assert_outcomes(passed=1)
    props = {p.get("name"): p.get("value") for p in ET.parse(junit).iter("property")}
    assert props["history"] == "history/test_gen.test_one-model-roce.jsonl"
    assert "evidence" not in props and "kernel_splat" not in props
    assert (tmp_path / "out" / props["history"]).is_file()
    assert not (tmp_path / "out" / "evidence").exists()


def test_a_second_lab_on_the_same_switch_leaves_the_capture_to_the_first(tmp_path, switch):
    control, send = switch
    first, second = FakeLab(control), FakeLab(control)
    c1 = evidence.Collector(first, tmp_path / "s.1", scenario="s", column="vm-rxe")
    c2 = evidence.Collector(second, tmp_path / "s.2", scenario="s", column="vm-rxe")
    c1.begin()
    c2.begin()
    send(roce_cm_req(), "a")
    c2.finish()
    c1.finish()
    assert [r["data"]["frame"]["cm"] for r in first.merged if r["kind"] == "wire"] == ["REQ"]
    assert second.merged == []
    assert "s.1's bundle" in json.loads((tmp_path / "s.2" / "manifest.json").read_text()
                                        )["capped"]["wire"]
    c3 = evidence.Collector(FakeLab(control), tmp_path / "s.3", scenario="s", column="vm-rxe")
    c3.begin()  # the first's capture has ended: the next lab captures again
    assert "wire" not in c3.caps
    c3.finish()


def test_bridge_capture_on_this_machine_brings_each_scenario_its_frames(tmp_path):
    """rdmalab.machines.netns.BridgeCapture on a bridge made here (root and tcpdump needed): one tcpdump
    serves successive scenarios, each taking the frames sent out of the bridge since its
    mark, decoded, including those tcpdump had not yet written when take() began (it is
    stopped then, and continued 0.3 s later); the byte cap cuts a part; close() stops it and
    removes its files; a missing bridge is an error naming it."""
    import os
    import signal
    import threading
    import shutil as sh
    from rdmalab.machines import netns
    from rdmalab.machines.localmachine import LocalMachine
    if os.geteuid() != 0 or not sh.which("tcpdump") or not sh.which("ip"):
        pytest.skip("needs root, ip and tcpdump (Debian's tcpdump) to capture on a bridge")
    br = f"rlev{os.getpid() % 10000}"
    local = LocalMachine("local")
    # A bridge with a port (a veth pair) is up with carrier, without IPv6: its own neighbour
    # and router solicitations would land in the parts the test counts.
    no6 = "; ".join(f"echo 1 >/proc/sys/net/ipv6/conf/{d}/disable_ipv6"
                    for d in (br, f"{br}p", f"{br}q"))
    assert local.run(f"ip link add {br} type bridge && ip link add {br}p type veth peer name "
                     f"{br}q && {{ {no6}; }} 2>/dev/null; ip link set {br}p master {br} up && "
                     f"ip link set {br}q up && ip link set {br} up", 30, root=True).rc == 0

    def send(n):
        with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as raw:
            raw.bind((br, 0))
            for _ in range(n):  # CM REQs sent out of the bridge: its capture sees them leave
                raw.send(roce_cm_req())

    def reqs(path):
        frames, _ = evidence_wire.decode_pcap(path)
        return [f["frame"]["cm"] for f in frames if "cm" in f["frame"]]

    def send_behind(pid, n):  # frames queued to a stopped tcpdump, which goes on 0.3 s later
        os.kill(pid, signal.SIGSTOP)
        send(n)
        threading.Timer(0.3, os.kill, (pid, signal.SIGCONT)).start()
    try:
        cap = netns.BridgeCapture.shared(local, br, max_bytes=1000)
        assert netns.BridgeCapture.shared(local, br) is cap
        first = cap.mark()
        pid = cap.pid
        send_behind(pid, 2)
        s1 = cap.take(first, str(tmp_path / "1.pcap"))
        # The second scenario looks through a host agent's file functions (no command).
        second = cap.mark(probe=evidence_host.capture_state)
        assert cap.pid == pid and second > first  # the same tcpdump
        send_behind(pid, 5)  # 5 x 338 bytes: past max_bytes
        s2 = cap.take(second, str(tmp_path / "2.pcap"), read=evidence_host.file_part)
        files = list(pathlib.Path("/tmp").glob(f"rdmalab-bridge-{br}-*"))
        netns.BridgeCapture.close_all(local, br)
    finally:
        local.run(f"ip link del {br}p; ip link del {br}", 30, root=True)
    assert reqs(tmp_path / "1.pcap") == ["REQ", "REQ"] and "capped" not in s1
    assert reqs(tmp_path / "2.pcap") == ["REQ", "REQ"]  # 2 whole records in 1000 bytes
    assert s2["capped"] == f"1000 of {s2['bytes']} bytes" and s2["bytes"] >= 5 * 338
    assert files and not any(f.exists() for f in files)  # close() removed them
    with pytest.raises(Exception, match=f"tcpdump on {br}x exited"):
        netns.BridgeCapture(local, br + "x").mark()
    assert not list(pathlib.Path("/tmp").glob(f"rdmalab-bridge-{br}x-*"))
