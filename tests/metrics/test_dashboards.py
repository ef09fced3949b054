"""Every query of every dashboard and every rule returns data from a real Prometheus.

A real Prometheus (Debian's prometheus) and Pushgateway run on loopback with temp storage. The
scenario suite runs through the CLI on every model personality with the exporter on both ways
(--metrics-listen and --metrics-push) and with the device counters read from a FAKE sysfs tree
(a temp directory laid out like /sys/class/infiniband: there is no RDMA device here), and a
test of its own writes a workload's records into its model labs. Prometheus
scrapes both, evaluates dashboards/prometheus/rules.yml, and then every PromQL expression of
every Grafana panel and every rule is evaluated through the HTTP API and must return data.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import sys
from pathlib import Path

import pytest
import yaml

from prom_stack import PROMTOOL, Prometheus, Pushgateway, Server, free_port, missing, wait_for
from rdmalab.report import junit as report

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "dashboards"
PROM_DIR = DASHBOARDS / "prometheus"
GRAFANA_DIR = DASHBOARDS / "grafana"
DATASOURCE_UID = "rdmalab-prometheus"
# What Grafana substitutes before a query reaches Prometheus: its interval macros (values for
# this test's 0.5 s scrape interval) and the dashboards' variables at "All".
GRAFANA_MACROS = {"$__rate_interval": "1m", "$__interval": "1s", "$__range": "1h"}
VARIABLE_ALL = ".*"
SCRAPE_INTERVAL = "500ms"
PULL_JOB, PUSH_JOB = "rdmalab", "rdmalab_batch"
RUN_TIMEOUT_S = 240  # the run: ~10 s on an idle 2-core machine
SETTLE_TIMEOUT_S = 60  # scrapes, pushes and rule evaluations after it

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))


# -- what the dashboards and rules ask

def dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text())
            for p in sorted((GRAFANA_DIR / "dashboards").glob("*.json"))}


def panels(dashboard: dict) -> list[dict]:
    out = []
    for p in dashboard["panels"]:
        out += [p] + p.get("panels", [])  # rows may nest panels
    return out


def panel_queries() -> list[tuple[str, str]]:
    """(where, expr) for every target of every panel of every dashboard."""
    return [(f"{name} / {p['title']} / {t['refId']}", t["expr"])
            for name, d in dashboards().items() for p in panels(d) for t in p.get("targets", [])]


def rule_queries() -> list[tuple[str, str]]:
    rules = yaml.safe_load((PROM_DIR / "rules.yml").read_text())
    return [(f"rules.yml / {g['name']} / {r.get('record') or r.get('alert')}", r["expr"])
            for g in rules["groups"] for r in g["rules"]]


def grafana_expr(expr: str) -> str:
    """The query Grafana sends: macros replaced, variables at "All"."""
    for macro, value in GRAFANA_MACROS.items():
        expr = expr.replace(macro, value)
    return re.sub(r"\$\{?(\w+)\}?", VARIABLE_ALL, expr)


# -- the stack: Pushgateway, Prometheus, and a scenario run exporting to both

FIRST_SCRAPE_TEST = '''
"""Waits until Prometheus has scraped the run's exporter once, so the series the plugin
declared at 0 are in Prometheus before any scenario counts (their rates then show)."""
import json, os, time, urllib.request

def test_prometheus_scraped_the_exporter_once():
    url = os.environ["RDMALAB_TEST_PROMETHEUS"] + '/api/v1/query?query=up%7Bjob%3D%22rdmalab%22%7D'
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with opener.open(url, timeout=5) as r:
            result = json.load(r)["data"]["result"]
        if result and result[0]["value"][1] == "1":
            return
        time.sleep(0.1)
    raise AssertionError("Prometheus never scraped the exporter")
'''

WORKLOAD_RECORDS_TEST = '''
"""A workload's records as an agent lab's hosts write them (the model refuses to run workloads,
so this writes them itself): the workload panels have data."""
from rdmalab import ms


def test_a_workloads_records(lab):
    def state(previous, to):
        lab.record("ulp_state", object="nvme", host="b", unit="nvme0", previous=previous,
                   state=to)
    lab.record("workload", object="nvme", host="a", step="target_up", ok=True, took_ns=10)
    lab.record("workload", object="nvme", host="b", step="connect", ok=True, took_ns=20)
    state("", "live")
    lab.record("io", object="nvme", host="b", op="write", phase="progress", ok=100, errors=0)
    state("live", "resetting")
    lab.record("io", object="nvme", host="b", op="write", phase="errors", ok=5, errors=1,
               error="EIO: Input/output error")
    lab.run_for(ms(20))
    state("resetting", "live")
    lab.record("io_verify", object="nvme", host="b", blocks=512, acked=100, matched=100,
               pending=0, lost=[], lost_count=0, corrupt=[], corrupt_count=0)
'''

DELIBERATE_FAILURE_TEST = '''
"""Fails on purpose on every device: the RdmalabScenarioFailures alert must fire."""

def test_deliberate_failure(lab):
    assert lab.host("a").caps().name == "no such device", "fails on purpose (metrics test)"
'''


def fake_sysfs(root: Path) -> Path:
    """A FAKE /sys/class/infiniband: one rxe device, port 1, a few counters."""
    for rel, value in (("rxe0/ports/1/hw_counters/sent_pkts", 100),
                       ("rxe0/ports/1/hw_counters/retry_exceeded_err", 0),
                       ("rxe0/ports/1/counters/port_xmit_data", 4096),
                       ("rxe0/ports/1/counters/symbol_error", 0)):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"{value}\n")
    return root


def prometheus_config(pull_port: int, pushgateway_port: int) -> dict:
    """dashboards/prometheus/prometheus.yml with this test's targets and intervals: its jobs,
    honor_labels and rule file are what the test checks."""
    cfg = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    cfg["global"].update(scrape_interval=SCRAPE_INTERVAL, evaluation_interval=SCRAPE_INTERVAL)
    cfg["rule_files"] = [str(PROM_DIR / f) for f in cfg["rule_files"]]
    targets = {PULL_JOB: pull_port, "pushgateway": pushgateway_port}
    assert {j["job_name"] for j in cfg["scrape_configs"]} == set(targets)
    for job in cfg["scrape_configs"]:
        job["static_configs"] = [{"targets": [f"127.0.0.1:{targets[job['job_name']]}"]}]
    return cfg


class Stack:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.servers: list[Server] = []  # stop() stops each, however far start() got
        self.sysfs = fake_sysfs(tmp / "fake-sysfs")
        self.pull_port = free_port()
        self.results: list = []

    def start(self) -> None:
        self.pushgateway = self._start(Pushgateway(self.tmp))
        self.prom = self._start(Prometheus(
            self.tmp, prometheus_config(self.pull_port, self.pushgateway.port)))

    def _start(self, server: Server) -> Server:
        self.servers.append(server)
        server.wait_ready()
        return server

    def run_scenarios(self) -> None:
        """The suite on every model personality through the CLI, exporting both ways; the run
        lingers after its session so the last values get scraped (the fixture ends it)."""
        (self.tmp / "test_00_first_scrape.py").write_text(FIRST_SCRAPE_TEST)
        (self.tmp / "test_zz_deliberate_failure.py").write_text(DELIBERATE_FAILURE_TEST)
        (self.tmp / "test_01_workload_records.py").write_text(WORKLOAD_RECORDS_TEST)
        out = self.tmp / "out"
        argv = [sys.executable, "-m", "rdmalab", "run", "--lab", "model", "--out", str(out),
                "--metrics-listen", f"127.0.0.1:{self.pull_port}",
                "--metrics-push", self.pushgateway.url,
                str(self.tmp / "test_00_first_scrape.py"),
                str(self.tmp / "test_01_workload_records.py"), str(REPO / "tests" / "scenarios"),
                str(self.tmp / "test_zz_deliberate_failure.py"),
                "--", "--metrics-sysfs", str(self.sysfs), "--metrics-linger", "600",
                "-p", "no:cacheprovider"]
        env = dict(os.environ, RDMALAB_TEST_PROMETHEUS=self.prom.url,
                   PYTHONPATH=str(REPO / "bindings"))
        run = self._start(Server("rdmalab run", argv, self.tmp / "run.log", env=env, cwd=REPO))
        junit = out / "junit.xml"
        wait_for("the run's session to end (its junit.xml)", lambda: junit.exists() or
                 not run.alive(), RUN_TIMEOUT_S, interval_s=0.2, detail=run.tail)
        assert run.alive(), f"the run ended instead of lingering\n{run.tail()}"
        wait_for("junit.xml to be complete", lambda: _parses(junit), 10)
        self.results = [r for r in report.read_junit(str(junit)) if "outcome" in r.properties]
        # A device error counter goes up after Prometheus has seen it at 0.
        (self.sysfs / "rxe0/ports/1/hw_counters/retry_exceeded_err").write_text("3\n")

    def expected_outcomes(self) -> dict[tuple[str, str], int]:
        return dict(collections.Counter((r.properties["personality"], r.properties["outcome"])
                                        for r in self.results))

    def outcomes(self, job: str) -> dict[tuple[str, str], int]:
        got = self.prom.query(f'sum by (device, outcome) '
                              f'(rdmalab_scenario_outcomes_total{{job="{job}"}}) > 0')
        return {(s["metric"]["device"], s["metric"]["outcome"]): int(float(s["value"][1]))
                for s in got}

    def stop(self) -> None:
        for server in reversed(self.servers):
            server.stop()


def _parses(path: Path) -> bool:
    try:
        report.read_junit(str(path))
        return True
    except Exception:  # still being written
        return False


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("prometheus"))
    try:
        s.start()
        s.run_scenarios()
        want = s.expected_outcomes()
        for job in (PULL_JOB, PUSH_JOB):
            wait_for(f"job {job}'s outcomes in Prometheus to match junit.xml",
                     lambda: s.outcomes(job) == want, SETTLE_TIMEOUT_S,
                     detail=lambda: f"want {want}, got {s.outcomes(job)}")
        total = sum(want.values())
        wait_for("the recording rules to see the final outcomes",
                 lambda: s.prom.value("sum(rdmalab:scenario_outcomes:sum)") == 2 * total,
                 SETTLE_TIMEOUT_S)
        wait_for("both alerts to fire", lambda: len(s.prom.query(
            'count by (alertname) (ALERTS{alertstate="firing"})')) == 2, SETTLE_TIMEOUT_S,
            detail=lambda: str(s.prom.query("ALERTS")))
        yield s
    finally:
        s.stop()


# -- the checks that need no server

@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")
def test_promtool_accepts_config_rules_and_rule_tests():
    import subprocess
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", "rules.yml"],
                 ["test", "rules", "rules_test.yml"]):
        done = subprocess.run([PROMTOOL, *args], cwd=PROM_DIR, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}{done.stderr}"


def test_dashboards_use_the_provisioned_datasource():
    ds = yaml.safe_load((GRAFANA_DIR / "provisioning/datasources/rdmalab.yml").read_text())
    assert [d["uid"] for d in ds["datasources"]] == [DATASOURCE_UID]
    provider = yaml.safe_load((GRAFANA_DIR / "provisioning/dashboards/rdmalab.yml").read_text())
    assert provider["providers"][0]["type"] == "file"
    uids = [d["uid"] for d in dashboards().values()]
    assert len(uids) == 2 and len(set(uids)) == len(uids)
    for name, d in dashboards().items():
        for p in panels(d):
            assert p["datasource"]["uid"] == DATASOURCE_UID, f"{name} / {p['title']}"
            assert p["targets"], f"{name} / {p['title']} has no query"
            for t in p["targets"]:
                assert t.get("datasource", p["datasource"])["uid"] == DATASOURCE_UID
        for v in d["templating"]["list"]:
            assert v["datasource"]["uid"] == DATASOURCE_UID


def test_the_dashboards_show_what_the_issue_asks_for():
    titles = " | ".join(p["title"] for d in dashboards().values() for p in panels(d)).lower()
    for wanted in ("scenario outcomes per device", "fault timeline", "cm event rate",
                   "connect latency", "disconnect latency", "drain latency", "switch drops",
                   "workload steps", "ulp unit states", "workload i/o", "ulp recovery time",
                   "read-back blocks"):
        assert wanted in titles
    exprs = " ".join(e for _, e in panel_queries())
    assert "histogram_quantile" in exprs


# -- the checks against the running Prometheus

def test_the_run_reached_prometheus_by_pull_and_by_push(stack):
    want = stack.expected_outcomes()
    assert {o for _, o in want} >= {"passed", "skipped", "failed"}
    assert stack.outcomes(PULL_JOB) == want
    assert stack.outcomes(PUSH_JOB) == want


def test_every_dashboard_query_returns_data(stack):
    empty = [f"{where}: {grafana_expr(expr)}" for where, expr in panel_queries()
             if not stack.prom.query(grafana_expr(expr))]
    assert not empty, "queries without data:\n" + "\n".join(empty)


def test_every_rule_returns_data_and_evaluates_cleanly(stack):
    queries = rule_queries()
    assert len(queries) >= 9
    empty = [f"{where}: {expr}" for where, expr in queries if not stack.prom.query(expr)]
    assert not empty, "rules without data:\n" + "\n".join(empty)
    rules = [r for g in stack.prom.api("rules")["groups"] for r in g["rules"]]
    assert len(rules) == len(queries)
    unhealthy = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not unhealthy
    firing = {r["name"] for r in rules if r["type"] == "alerting" and r["state"] == "firing"}
    assert firing == {"RdmalabScenarioFailures", "RdmalabDeviceErrorCounters"}


def test_dashboard_variables_have_values(stack):
    for name, d in dashboards().items():
        for v in d["templating"]["list"]:
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", v["query"]["query"])
            assert m, f"{name} ${v['name']}: not a label_values() query"
            values = stack.prom.api(f"label/{m.group(2)}/values",
                                    **{"match[]": grafana_expr(m.group(1))})
            assert values, f"{name} ${v['name']}: no values"


def test_latencies_flowed_as_rates(stack):
    """The series declared at 0 were scraped before the scenarios: the quantiles are numbers,
    on the model's virtual clock: most connects take microseconds (a few wait for a CM
    retransmission), a TIMEWAIT lasts seconds."""
    def quantile(q, metric, sel=""):
        v = stack.prom.value(f'histogram_quantile({q}, sum by (le) (rate({metric}_bucket'
                             f'{{job="{PULL_JOB}"{sel}}}[1m])))')
        assert v is not None and math.isfinite(v), f"{metric}{sel}: {v}"
        return v
    assert 0 < quantile(0.5, "rdmalab_cm_connect_seconds") < 1e-3
    assert quantile(0.5, "rdmalab_cm_disconnect_seconds", ',until="TIMEWAIT_EXIT"') > 1
    assert 0 < quantile(0.9, "rdmalab_drain_seconds") < 1
    assert stack.prom.value(f'sum(rdmalab_switch_frames_total{{job="{PULL_JOB}",'
                            f'type="DREP",action="drop"}})') > 0
