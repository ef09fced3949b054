"""Prometheus metrics of the engine (core/metrics, prometheus-cpp).

    m = rdmalab.run.metrics.attach(lab)          # a new Metrics fed by the lab's history
    port = m.serve(port=0)                   # pull endpoint on 127.0.0.1 (long runs)
    m.push("http://127.0.0.1:9091")          # or to a Pushgateway (batch runs)
    print(m.text())                          # the exposition text a scrape returns

What is exported (labels are bounded: no QPN, id or time is ever a label):
  rdmalab_cm_events_total{backend,device,event,status}
  rdmalab_async_events_total{backend,device,event}
  rdmalab_work_completions_total{backend,device,status}
  rdmalab_faults_total{backend,device,kind}
  rdmalab_switch_frames_total{backend,type,action}
  rdmalab_scenario_outcomes_total{backend,device,outcome}
  rdmalab_cm_connect_seconds, rdmalab_cm_disconnect_seconds{until}, rdmalab_drain_seconds{method}
  rdmalab_device_counter{host,device,port,source,counter}
and a workload's (rdmalab.workloads: a kernel ULP across two hosts), per workload and host:
  rdmalab_workload_steps_total{backend,device,workload,host,step,outcome}
  rdmalab_ulp_state_changes_total{backend,device,workload,host,state}
  rdmalab_workload_io_total{backend,device,workload,host,op,result}
  rdmalab_workload_verify_blocks_total{backend,device,workload,host,result}
  rdmalab_ulp_recovery_seconds{backend,device,workload,host}
device is the device's personality or provider ("ib", "iwarp-siw", "rxe"). core/metrics/
classifier.h says which history record feeds which metric and how latencies are paired;
core/metrics/workload.h the same of a workload's records.

Device counters: device_counters() reads sysfs (hw_counters and counters), rdma_statistic()
runs or parses `rdma statistic show`; both return {device: {port: {source: {counter: value}}}},
which Metrics.set_device_counters(host, ...) exports (the VM lab reads them in each guest).
"""

from __future__ import annotations

import json

import re
import shutil
import socket
import subprocess
from typing import Mapping, Optional

from .. import _core
from ..faults.records import SWITCH, wire_action
from ..names import sec

SYSFS_ROOT = "/sys/class/infiniband"
OUTCOMES = ("passed", "failed", "error", "skipped")
DEFAULT_JOB = "rdmalab_batch"  # the Pushgateway job; the pull endpoint's scrape job is "rdmalab"
RDMA_STATISTIC_TIMEOUT_S = 10.0

Counters = dict  # {device: {port: {source: {counter: value}}}}


# Switch records that are faults on a frame (watch and release are not).
SWITCH_ACTIONS = ("drop", "delay", "duplicate", "reorder", "corrupt")


class Metrics:
    """One registry of engine metrics; attach any number of labs to it."""

    def __init__(self):
        self._o = _core.Metrics()

    def attach(self, lab) -> "Metrics":
        """Feeds lab's history into these metrics from now on (attach a lab once). The lab
        decides how (Lab.attach_metrics): an engine lab as its history is written; a
        lab whose records live on other machines when it shuts down, from its merged
        history (ingest_lab)."""
        try:
            attach = lab.attach_metrics
        except AttributeError:
            raise TypeError(f"cannot attach {lab!r}: not a lab (rdmalab.protocol.Lab)") from None
        attach(self)
        return self

    def ingest_lab(self, lab, backend: str = "vm") -> None:
        """Counts a finished agent lab: its hosts' records through the classifier, the fault
        switch's actions as frames."""
        records = lab.history()
        hosts = [r for r in records if r["host"] != SWITCH]
        self._o.ingest(backend, lab.devices_by_host(),
                       "\n".join(json.dumps(r, sort_keys=True) for r in hosts))
        for r in records:
            action = wire_action(r)
            if r["host"] == SWITCH and action in SWITCH_ACTIONS:
                f = r["data"].get("frame", {})
                kind = f.get("cm") or f.get("opcode") or f.get("rdmap_opcode") or \
                    f.get("proto") or "other"
                self.count_frame(str(kind), action, backend=backend)

    # -- exposure
    def serve(self, port: int = 0, address: str = "127.0.0.1") -> int:
        """Starts the pull endpoint (http://address:port/metrics; port 0 picks a free one) and
        returns the port. Loopback unless another address is asked for."""
        return self._o.serve(address, port)

    def stop(self) -> None:
        """Stops the pull endpoint (takes up to 2 s: civetweb joins its threads)."""
        self._o.stop_serving()

    @property
    def port(self) -> int:
        """The pull endpoint's port; 0 when not serving."""
        return self._o.port

    def push(self, url: str, job: str = DEFAULT_JOB, grouping: Optional[Mapping[str, str]] = None,
             timeout_s: float = 10.0) -> None:
        """PUTs every metric to the Pushgateway at url ("http://host:port") under job and
        grouping labels, replacing that group's last push. rdmalab.Error (EIO, ETIMEDOUT,
        EINVAL) when it cannot."""
        self._o.push(url, job, dict(grouping or {}), sec(timeout_s))

    def text(self) -> str:
        """The exposition text (what a scrape returns)."""
        return self._o.text()

    # -- samples from the controller
    def scenario_outcome(self, backend: str, device: str, outcome: str) -> None:
        self._o.scenario_outcome(backend, device, outcome)

    def declare_device(self, backend: str, device: str) -> None:
        """Creates the series every device has (outcomes, latency histograms) at 0, so that
        a first sample shows as an increase."""
        self._o.declare_device(backend, device)

    def count_frame(self, type: str, action: str, backend: str = "vm") -> None:
        """A frame the fabric switch acted on: type ("DREP", "SEND_ONLY"), action ("forward",
        "drop", "delay", "duplicate")."""
        self._o.count_frame(backend, type, action)

    # -- device counters
    def watch_device_counters(self, root: str = SYSFS_ROOT, host: Optional[str] = None) -> None:
        """Exports the counters under root, read at every scrape or push (none where root is
        missing, as on the model)."""
        self._o.watch_device_counters(str(root), host or socket.gethostname())

    def set_device_counters(self, host: str, counters: Counters) -> None:
        """Exports a snapshot read elsewhere (a VM guest), replacing host's previous one."""
        self._o.set_device_counters(host, _to_core(counters))


def attach(lab, metrics: Optional[Metrics] = None) -> Metrics:
    """metrics (a new Metrics if None), fed by lab's history from now on."""
    return (metrics or Metrics()).attach(lab)


def device_counters(root: str = SYSFS_ROOT) -> Counters:
    """Every counter under root/<dev>/ports/<port>/{counters,hw_counters}; {} without devices."""
    return _from_core(_core.read_sysfs_counters(str(root)))


def rdma_statistic(text: Optional[str] = None,
                   timeout_s: float = RDMA_STATISTIC_TIMEOUT_S) -> Counters:
    """The counters of `rdma statistic show` (iproute2): parses text, or runs the command
    (with a deadline) when text is None. {} where the tool or the devices are missing."""
    if text is None:
        rdma = shutil.which("rdma")
        if rdma is None:
            return {}
        try:
            done = subprocess.run([rdma, "statistic", "show"], capture_output=True, text=True,
                                  timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return {}
        text = done.stdout if done.returncode == 0 else ""
    return _from_core(_core.parse_rdma_statistic(text))


def parse_listen(text: str) -> tuple[str, int]:
    """"HOST:PORT", "[v6]:PORT", ":PORT" or "PORT" -> (address, port); loopback by default."""
    m = re.fullmatch(r"(?:\[([0-9a-fA-F:.]+)\]|([^:\[\]]*)):(\d+)|(\d+)", text.strip())
    if m is None:
        raise ValueError(f"--metrics-listen {text!r}: expected HOST:PORT, :PORT or PORT")
    address = m.group(1) or m.group(2) or "127.0.0.1"
    port = int(m.group(3) or m.group(4))
    if port > 65535:
        raise ValueError(f"--metrics-listen {text!r}: port {port} out of range")
    return address, port


def _from_core(counters) -> Counters:
    out: Counters = {}
    for c in counters:
        out.setdefault(c.device, {}).setdefault(c.port, {}).setdefault(c.source, {})[c.name] = \
            c.value
    return out


def _to_core(counters: Counters) -> list:
    return [_core.DeviceCounter(device, int(port), source, name, int(value))
            for device, ports in counters.items()
            for port, sources in ports.items()
            for source, values in sources.items()
            for name, value in values.items()]


__all__ = ["Metrics", "attach", "device_counters", "rdma_statistic", "parse_listen", "OUTCOMES",
           "SYSFS_ROOT"]
