"""The pytest plugin's metrics options (rdmalab.run.pytest_plugin calls in here). Off by default.

  --metrics-listen HOST:PORT  serve /metrics while the run lasts (":0" picks a port; the header
                              names it); loopback unless a host is given
  --metrics-push URL          at the end of the session, PUT everything to the Pushgateway at
                              URL (job --metrics-job, grouping instance=<this host>)
  --metrics-job NAME          the Pushgateway job (default rdmalab_batch)
  --metrics-sysfs DIR         where the device counters are read (default /sys/class/infiniband)
  --metrics-linger S          keep serving S seconds after the session, so that Prometheus
                              scrapes the final values (default 0)

Every lab the lab/lab_factory fixtures make is attached; every scenario's outcome is counted
under its backend and personality.
"""

from __future__ import annotations

import socket
import time

import pytest

from ..errors import Error
from .metrics import DEFAULT_JOB, SYSFS_ROOT, Metrics, parse_listen

PLUGIN_NAME = "rdmalab-metrics"


def configure(config, specs) -> None:
    """Registers the exporter when --metrics-listen or --metrics-push asks for it."""
    listen, push = config.getoption("metrics_listen"), config.getoption("metrics_push")
    if not listen and not push:
        return
    try:
        address_port = parse_listen(listen) if listen else None
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    config.pluginmanager.register(MetricsPlugin(config, specs, address_port, push), PLUGIN_NAME)


def attach(config, lab) -> None:
    """Feeds a lab the fixtures made into the session's metrics: an engine lab as it runs, a
    VM lab (its records are in the guests) when it shuts down."""
    plugin = config.pluginmanager.get_plugin(PLUGIN_NAME)
    if plugin is not None:
        plugin.metrics.attach(lab)


class MetricsPlugin:
    def __init__(self, config, specs, address_port, push_url):
        self.config, self.push_url = config, push_url
        self.metrics = Metrics()
        for spec in specs:
            self.metrics.declare_device(spec.backend, spec.personality)
        self.metrics.watch_device_counters(config.getoption("metrics_sysfs") or SYSFS_ROOT)
        self.address = None
        if address_port is not None:
            address, port = address_port
            try:
                port = self.metrics.serve(port, address)
            except Error as e:
                raise pytest.UsageError(f"--metrics-listen: {e}") from None
            self.address = f"{address}:{port}"

    def pytest_report_header(self, config):
        lines = []
        if self.address:
            lines.append(f"rdmalab metrics: serving http://{self.address}/metrics")
        if self.push_url:
            lines.append(f"rdmalab metrics: pushing to {self.push_url} at the end")
        return lines

    def pytest_runtest_logreport(self, report):
        # The rdmalab plugin puts backend, personality and outcome on the teardown report.
        props = dict(report.user_properties)
        if report.when == "teardown" and {"backend", "personality", "outcome"} <= props.keys():
            self.metrics.scenario_outcome(props["backend"], props["personality"],
                                          props["outcome"])

    def pytest_terminal_summary(self, terminalreporter):
        if not self.push_url:
            return
        grouping = {"instance": socket.gethostname()}
        job = self.config.getoption("metrics_job") or DEFAULT_JOB
        try:
            self.metrics.push(self.push_url, job, grouping)
            terminalreporter.write_line(f"rdmalab metrics: pushed to {self.push_url} "
                                        f"(job {job}, instance {grouping['instance']})")
        except Error as e:
            terminalreporter.write_line(f"rdmalab metrics: push FAILED: {e}", red=True)

    def pytest_unconfigure(self, config):
        linger = config.getoption("metrics_linger")
        if self.address and linger > 0:
            time.sleep(linger)  # wall clock: Prometheus scrapes the final values meanwhile
        self.metrics.stop()
