"""rdmalab.run.metrics and the plugin's metrics options, without a Prometheus server: the exposition
text of an attached lab, the pull endpoint, a push to a one-request HTTP server in the test,
device counters from a FAKE sysfs tree (a temp directory), and `rdma statistic` text."""

from __future__ import annotations

import http.server
import json
import re
import threading
import urllib.request
from pathlib import Path

import pytest

import rdmalab
from rdmalab.faults.records import from_switch
from rdmalab.run import metrics
from rdmalab import ms
from rdmalab.api.resources import CmPair

HTTP_TIMEOUT_S = 5
# The NVMe-oF campaign's history on vm:rxe (a target reboot), trimmed: the ladder's tests use it too.
NVME_HISTORY = Path(__file__).resolve().parents[1] / "python" / "nvme_history.jsonl"


def series(text: str, prefix: str) -> dict[str, float]:
    """{'name{labels}': value} of the exposition lines that start with prefix."""
    out = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


class OnePut(http.server.BaseHTTPRequestHandler):
    """Answers one PUT with 202 and keeps its path and body (a stand-in Pushgateway)."""
    got: list = []

    def do_PUT(self):
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        OnePut.got.append((self.path, body))
        self.send_response(202)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def gateway():
    OnePut.got = []
    server = http.server.HTTPServer(("127.0.0.1", 0), OnePut)
    server.timeout = HTTP_TIMEOUT_S
    thread = threading.Thread(target=server.handle_request, daemon=True)  # one request
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", OnePut.got
    thread.join(HTTP_TIMEOUT_S)
    server.server_close()


def test_an_attached_lab_counts_cm_events_latencies_and_faults():
    with rdmalab.model_lab(seed=1, hosts={"a": "ib", "b": "roce"}) as lab:
        m = metrics.attach(lab)
        pair = CmPair(lab)
        lab.faults.drop(cm="DREP")
        pair.client.conn.disconnect()
        pair.server.conn.wait("DISCONNECTED", ms(100))
        pair.server.conn.disconnect()  # its DREP is dropped
        lab.run_for(ms(1))
        text = m.text()
    cm = series(text, "rdmalab_cm_events_total")
    assert cm['rdmalab_cm_events_total{backend="model",device="ib",event="ESTABLISHED",'
              'status="OK"}'] == 1
    assert cm['rdmalab_cm_events_total{backend="model",device="roce",event="DISCONNECTED",'
              'status="OK"}'] == 1
    assert series(text, "rdmalab_cm_connect_seconds_count") == {
        'rdmalab_cm_connect_seconds_count{backend="model",device="ib"}': 1,
        'rdmalab_cm_connect_seconds_count{backend="model",device="roce"}': 0}  # declared
    assert series(text, "rdmalab_switch_frames_total") == {
        'rdmalab_switch_frames_total{action="drop",backend="model",type="DREP"}': 1}


def test_serve_picks_a_loopback_port_and_stops():
    m = metrics.Metrics()
    m.scenario_outcome("model", "ib", "passed")
    port = m.serve(port=0)
    assert port > 0 and m.port == port
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy
    with opener.open(f"http://127.0.0.1:{port}/metrics", timeout=HTTP_TIMEOUT_S) as r:
        body = r.read().decode()
    assert 'rdmalab_scenario_outcomes_total{backend="model",device="ib",outcome="passed"} 1' \
        in body
    m.stop()
    assert m.port == 0


def test_push_puts_the_text_under_job_and_grouping(gateway):
    url, got = gateway
    m = metrics.Metrics()
    m.count_frame("DREQ", "delay")
    m.push(url, grouping={"instance": "ci-1"})
    [(path, body)] = got
    assert path == "/metrics/job/rdmalab_batch/instance/ci-1"
    assert 'rdmalab_switch_frames_total{action="delay",backend="vm",type="DREQ"} 1' in body


def test_push_errors_name_the_problem():
    m = metrics.Metrics()
    with pytest.raises(rdmalab.Error) as e:
        m.push("http://127.0.0.1:1", timeout_s=2)  # nothing listens on port 1
    assert e.value.errno_name == "EIO"
    with pytest.raises(rdmalab.Error, match="EINVAL"):
        m.push("127.0.0.1:9091")


def test_device_counters_from_a_fake_sysfs_tree(tmp_path):
    # FAKE: a temp directory laid out as /sys/class/infiniband.
    hw = tmp_path / "siw0" / "ports" / "1" / "hw_counters"
    hw.mkdir(parents=True)
    (hw / "rcvd_pkts").write_text("17\n")
    (tmp_path / "siw0" / "ports" / "1" / "counters").mkdir()
    (tmp_path / "siw0" / "ports" / "1" / "counters" / "port_rcv_data").write_text("2048\n")
    counters = metrics.device_counters(str(tmp_path))
    assert counters == {"siw0": {1: {"hw_counters": {"rcvd_pkts": 17},
                                     "counters": {"port_rcv_data": 2048}}}}
    assert metrics.device_counters(str(tmp_path / "absent")) == {}
    m = metrics.Metrics()
    m.set_device_counters("guest-a", counters)  # a snapshot, as the VM lab hands them over
    assert series(m.text(), "rdmalab_device_counter{") == {
        'rdmalab_device_counter{counter="port_rcv_data",device="siw0",host="guest-a",port="1",'
        'source="counters"}': 2048,
        'rdmalab_device_counter{counter="rcvd_pkts",device="siw0",host="guest-a",port="1",'
        'source="hw_counters"}': 17}


def test_rdma_statistic_text():
    text = "link rxe0/1 sent_pkts 5 rcvd_pkts 6\nlink rxe1/1 sent_pkts 7\n"
    assert metrics.rdma_statistic(text) == {
        "rxe0": {1: {"rdma_statistic": {"sent_pkts": 5, "rcvd_pkts": 6}}},
        "rxe1": {1: {"rdma_statistic": {"sent_pkts": 7}}}}


def test_parse_listen():
    assert metrics.parse_listen(":0") == ("127.0.0.1", 0)
    assert metrics.parse_listen("9470") == ("127.0.0.1", 9470)
    assert metrics.parse_listen("0.0.0.0:9470") == ("0.0.0.0", 9470)
    assert metrics.parse_listen("[::1]:9470") == ("::1", 9470)
    for bad in ("host", "1:2:3", "127.0.0.1:99999"):
        with pytest.raises(ValueError):
            metrics.parse_listen(bad)


PLUGIN = ("-p", "rdmalab.run.pytest_plugin")
SCENARIOS = """
    def test_passes(lab):
        pass

    def test_fails(lab):
        assert False, "on purpose"
"""


def test_plugin_pushes_each_scenario_outcome(pytester, gateway):
    url, got = gateway
    pytester.makepyfile(test_gen=SCENARIOS)
    result = pytester.runpytest(*PLUGIN, "--lab", "model:ib,roce", "--metrics-push", url,
                                "--metrics-job", "ci")
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines([f"rdmalab metrics: pushing to {url} at the end",
                                 f"rdmalab metrics: pushed to {url} (job ci, instance *)"])
    [(path, body)] = got
    assert path.startswith("/metrics/job/ci/instance/")
    outcomes = series(body, "rdmalab_scenario_outcomes_total")
    for device in ("ib", "roce"):
        for outcome, n in (("passed", 1), ("failed", 1), ("error", 0), ("skipped", 0)):
            key = (f'rdmalab_scenario_outcomes_total{{backend="model",device="{device}",'
                   f'outcome="{outcome}"}}')
            assert outcomes[key] == n


def test_plugin_serves_and_names_the_port(pytester):
    pytester.makepyfile(test_gen=SCENARIOS)
    result = pytester.runpytest(*PLUGIN, "--lab", "model:ib", "--metrics-listen", ":0")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["rdmalab metrics: serving http://127.0.0.1:*/metrics"])


def test_plugin_rejects_a_bad_listen_address_and_is_off_by_default(pytester):
    pytester.makepyfile(test_gen=SCENARIOS)
    result = pytester.runpytest(*PLUGIN, "--lab", "model:ib", "--metrics-listen", "nowhere")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--metrics-listen 'nowhere': expected HOST:PORT*"])
    result = pytester.runpytest(*PLUGIN, "--lab", "model:ib")
    result.assert_outcomes(passed=1, failed=1)
    assert "rdmalab metrics" not in result.stdout.str()


class FinishedVmLab:
    """What Metrics.attach needs of an agent lab (rdmalab.labs.agent.AgentLab): attach_metrics
    through a shutdown hook, the merged history, the device per host. The records are shaped
    as an agent lab merges them."""

    def __init__(self, records, device="siw"):
        self.records, self.hooks, self.device = records, [], device

    def attach_metrics(self, m):
        self.on_shutdown(m.ingest_lab)

    def on_shutdown(self, fn):
        self.hooks.append(fn)

    def history(self):
        return self.records

    def devices_by_host(self):
        return {"a": self.device, "b": self.device}

    def shutdown(self):
        for fn in self.hooks:
            fn(self)


def test_a_vm_lab_is_counted_when_it_shuts_down():
    frame = {"proto": "tcp", "tcp_flags": "FIN"}
    lab = FinishedVmLab([
        {"seq": 0, "host_seq": 3, "t_ns": 5, "host": "a", "object": "cm_id:1",
         "kind": "cm_event", "data": {"event": "DISCONNECTED", "status": 0}},
        dict(from_switch({"seq": 0, "t_ns": 6, "action": "drop", "rule": 1, "frame": frame}, 0),
             seq=1),
        dict(from_switch({"seq": 1, "t_ns": 7, "action": "watch", "rule": 2, "frame": frame}, 0),
             seq=2),
    ])
    m = metrics.Metrics().attach(lab)
    assert not series(m.text(), "rdmalab_cm_events_total{")  # nothing before the end
    lab.shutdown()
    text = m.text()
    assert series(text, "rdmalab_cm_events_total{") == {
        'rdmalab_cm_events_total{backend="vm",device="siw",event="DISCONNECTED",status="OK"}': 1}
    frames = series(text, "rdmalab_switch_frames_total{")
    assert frames == {'rdmalab_switch_frames_total{action="drop",backend="vm",type="tcp"}': 1}


def by_label(text: str, name: str, label: str, **where) -> dict[str, float]:
    """{value of label: summed samples} of metric name's series whose labels include where."""
    out: dict[str, float] = {}
    for key, value in series(text, name + "{").items():
        labels = dict(re.findall(r'(\w+)="([^"]*)"', key))
        if all(labels.get(k) == v for k, v in where.items()):
            out[labels[label]] = out.get(labels[label], 0) + value
    return out


def test_a_workloads_steps_states_io_and_recovery_are_counted_per_workload_and_host():
    lab = FinishedVmLab([json.loads(line) for line in NVME_HISTORY.read_text().splitlines()],
                        device="rxe")
    m = metrics.Metrics().attach(lab)
    lab.shutdown()
    text = m.text()
    nvme = {"backend": "vm", "device": "rxe", "workload": "nvme"}
    assert by_label(text, "rdmalab_workload_steps_total", "step", host="a", outcome="ok",
                    **nvme) == {"target_up": 2, "target_down": 1}
    assert by_label(text, "rdmalab_workload_steps_total", "step", host="b", outcome="ok",
                    **nvme) == {"connect": 1, "io_start": 1, "io_stop": 1, "disconnect": 1}
    assert by_label(text, "rdmalab_workload_steps_total", "outcome", **nvme) == \
        {"ok": 7, "failed": 0}
    assert by_label(text, "rdmalab_ulp_state_changes_total", "state", host="b", **nvme) == {
        "live": 2, "resetting": 1, "connecting": 1, "deleting_no_IO": 1, "gone": 1}
    assert by_label(text, "rdmalab_workload_io_total", "result", host="b", op="write",
                    **nvme) == {"ok": 148 + 142 + 16 + 181 + 160, "error": 0}
    assert by_label(text, "rdmalab_workload_verify_blocks_total", "result", host="b",
                    **nvme) == {"matched": 381, "pending": 0, "lost": 0, "corrupt": 0}
    # nvme0 left live at the target's reboot (15.60 s) and was live again at 44.49 s.
    assert by_label(text, "rdmalab_ulp_recovery_seconds_count", "host", **nvme) == {"b": 1}
    [recovered] = by_label(text, "rdmalab_ulp_recovery_seconds_sum", "host", **nvme).values()
    assert abs(recovered - (44_494_566_771 - 15_599_593_138) / 1e9) < 1e-6


def test_a_workload_recording_into_an_engine_lab_is_counted_as_it_writes():
    with rdmalab.model_lab(seed=1, hosts={"a": "ib", "b": "roce"}) as lab:
        m = metrics.attach(lab)
        lab.record("workload", object="nvme", host="b", step="connect", ok=False,
                   took_ns=5, error="nvme connect: Connection refused", errno=111)
        lab.record("io", object="nvme", host="b", op="write", phase="errors", ok=3, errors=1,
                   error="EIO: Input/output error")
        text = m.text()
    assert series(text, "rdmalab_workload_steps_total{") == {
        'rdmalab_workload_steps_total{backend="model",device="roce",host="b",outcome="failed",'
        'step="connect",workload="nvme"}': 1,
        'rdmalab_workload_steps_total{backend="model",device="roce",host="b",outcome="ok",'
        'step="connect",workload="nvme"}': 0}
    assert series(text, "rdmalab_workload_io_total{") == {
        'rdmalab_workload_io_total{backend="model",device="roce",host="b",op="write",'
        'result="error",workload="nvme"}': 1,
        'rdmalab_workload_io_total{backend="model",device="roce",host="b",op="write",'
        'result="ok",workload="nvme"}': 3}


def test_attach_refuses_what_is_not_a_lab():
    with pytest.raises(TypeError, match="not a lab"):
        metrics.Metrics().attach(object())
