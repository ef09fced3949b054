"""A scenario's evidence bundle on a device lab (vm:*, netns:*, inventory:*): what the wire,
the kernels and the RDMA stacks of its hosts did while it ran, kept beside its history.

    OUT/evidence/<stem>/
      manifest.json            scenario, column, kernels, files (name -> what it is), splats,
                               caps hit, errors, what the bundle cost
      wire.pcap                the fault switch's capture for the scenario's time (the netns
                               lab: tcpdump on the bridge in the outer machine)
      res-<host>-before.json   `rdma -j res show KIND` (rdmalab.machines.rdma_res.KINDS) at the
                               lab's start
      res-<host>-after.json    the same at the scenario's end, before the lab shut down
      kmsg-<host>.txt          the host's kernel log since the lab started ("<level>[time] text",
                               as `dmesg -r`), through the lab's shutdown
      switch.jsonl             the switch's rule records (switch_* in the history)
      history.jsonl            a copy of the scenario's history, with `wire` and `kernel_log`
      splat-<host>-<n>.txt     each kernel-log splat found (rdmalab.findings.kernlog)

Collector(lab, dir, ...).begin() at the lab's start, .scenario_end() before its shutdown,
.finish() after it. Every host is asked through its agent with a deadline: a host lost mid-run
gets a note in the manifest, never a hang. The bundle's rooms: this module (the Collector: the
three points, the agents asked at once, the manifest), rdmalab.report.evidence_host (what the
agents run), evidence_wire (the capture and its `wire` records: a WireCapture), evidence_kernel
(the kernel logs and their splats: a KernelLogs).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import threading
import time
from typing import Callable, Optional

from ..errors import Hung
from ..machines import rdma_res
from .evidence_kernel import KernelLogs
from .evidence_wire import WireCapture

HOST_DEADLINE_S = 10.0     # one agent call (rdma res and kmsg on a TCG guest take ~0.1 s)
# The kernel log is what the oracle judges: its read gets longer. A fresh clone under load 6
# lost host a's log at 10 s (the agent's call queued behind the scenario's last calls on a
# stalled TCG guest), so a WARNING splat went unseen and the scenario passed.
KMSG_DEADLINE_S = 60.0
_DEADLINE_S = {"host_end": KMSG_DEADLINE_S}
HOST_MODULE = "rdmalab.report.evidence_host"  # what the agents run, by name


class Collector:
    """One lab's evidence (see the module's doc). registry: rdmalab.findings.registry.Registry whose
    kernel_log entries may expect a splat on a host's driver and kernel."""

    def __init__(self, lab, directory, *, scenario: str, column: str, registry=None,
                 log: Callable[[str], None] = lambda m: None):
        self.lab, self.dir = lab, pathlib.Path(directory)
        self.scenario, self.column, self.log = scenario, column, log
        self.hosts = list(lab.addresses)
        self.files: dict[str, str] = {}
        self.errors: list[str] = []
        self.caps: dict[str, str] = {}
        self._clock: Optional[tuple[int, int, int]] = None  # (realtime, monotonic, offset)
        self._capture = WireCapture(lab, self.hosts, lambda: self.dir, self._agent_call,
                                    self.caps, self.files)
        self._kernels = KernelLogs(lab, self.hosts, registry=registry, parallel=self._parallel,
                                   agent_call=self._agent_call, write=self._write,
                                   errors=self.errors, caps=self.caps)
        self._cost_s = 0.0

    # -- helpers
    def _device(self, host: str) -> str:
        return self.lab.machine_of(host).facts.device

    def _parallel(self, tasks: list[tuple[str, str, Callable[[], object]]]) -> dict:
        """(host, what, fn) each in a thread of its own, at once: {(host, what): result}. A
        host that is lost, or fails or does not answer by its deadline, is left out with an
        error noted: an outcome of the scenario, never a hang."""
        results: dict = {}
        lost = self.lab.lost_hosts()

        def one(host: str, what: str, fn) -> None:
            if host in lost:
                self.errors.append(f"{host}: {what}: the host was lost")
                return
            try:
                results[(host, what)] = fn()
            except Exception as e:  # a lost or broken host: kept in the manifest
                self.errors.append(f"{host}: {what}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=one, args=t, daemon=True) for t in tasks]
        for t in threads:
            t.start()
        wait_s = KMSG_DEADLINE_S if any(w == "kernel log" for _, w, _ in tasks) \
            else HOST_DEADLINE_S
        end = time.monotonic() + wait_s + 5.0
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))
        for (host, what, _), t in zip(tasks, threads):
            if t.is_alive():
                self.errors.append(f"{host}: {what}: no answer within {wait_s} s")
        return dict(results)

    def _agent_call(self, host: str, fn: str, *args) -> Callable[[], object]:
        def call():
            agent = self.lab.agent_for(host)
            broken_before = agent.broken
            try:
                return agent.call_copy(HOST_MODULE, fn, *args, what=f"evidence {fn}",
                                       deadline_s=_DEADLINE_S.get(fn, HOST_DEADLINE_S))
            except Hung:
                if not broken_before:  # stuck in this call, not refused as broken already
                    self.lab.record_stuck(host, agent)
                raise
        return call

    def _write(self, name: str, text: str, what: str) -> None:
        (self.dir / name).write_text(text, encoding="utf-8")
        self.files[name] = what

    def _json(self, name: str, value, what: str) -> None:
        self._write(name, json.dumps(value, indent=1, sort_keys=True) + "\n", what)

    # -- the three points of a scenario
    def begin(self) -> None:
        """At the lab's start: kernel-log marks, `rdma res` before, the capture started."""
        t = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        kmsg_hosts = self._kernels.mark_hosts()
        got = self._parallel([(h, "begin", self._agent_call(h, "host_begin", h in kmsg_hosts,
                                                            self._device(h)))
                              for h in self.hosts])
        for host in self.hosts:
            r = got.get((host, "begin"))
            if r is None:
                continue
            self._json(f"res-{host}-before.json", r["res"],
                       f"`rdma -j res show` ({', '.join(rdma_res.KINDS)}) on {host} at the "
                       "lab's start")
            if r.get("kmsg") is not None:
                self._kernels.mark(host, r["kmsg"])
            if self._clock is None:
                rt, mono = r["clock"]
                self._clock = (rt, mono, self.lab.agent_for(host).offset_ns)
        try:
            self._capture.start()
        except Exception as e:  # the scenario runs all the same; the bundle says why
            self.errors.append(f"capture: {type(e).__name__}: {e}")
        self._cost_s += time.monotonic() - t

    def scenario_end(self) -> None:
        """Before the lab shuts down: `rdma res` after (the objects the scenario left)."""
        t = time.monotonic()
        got = self._parallel([(h, "rdma res", self._agent_call(h, "host_res", self._device(h)))
                              for h in self.hosts])
        for (host, _), res in sorted(got.items()):
            self._json(f"res-{host}-after.json", res,
                       f"`rdma -j res show` ({', '.join(rdma_res.KINDS)}) on {host} at the "
                       "scenario's end, before the lab's shutdown")
        self._cost_s += time.monotonic() - t

    def finish(self) -> list[dict]:
        """After the lab's shutdown: the capture stopped and decoded into `wire` records, each
        host's kernel log read and its splats judged (`kernel_log` records), the switch's
        records; the manifest. Returns the splats ({host, kind, first_line, file,
        expected_by})."""
        t = time.monotonic()
        records: list[dict] = []
        try:
            records += self._capture.stop(self._clock)
        except Exception as e:
            self.errors.append(f"capture: {type(e).__name__}: {e}")
        records += self._kernels.read()
        self.lab.merge_records(records)
        switch = self.lab.faults.switch_history()
        if switch:
            self._write("switch.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n"
                                                for r in switch),
                        "the fault switch's rule records (switch_* in the history)")
        self._cost_s += time.monotonic() - t
        self.write_manifest()
        return self._kernels.splats

    def write_history(self, source: Optional[str] = None) -> None:
        """history.jsonl: a copy of the file the run wrote (source), else the lab's own."""
        dest = self.dir / "history.jsonl"
        if source and os.path.exists(source):
            shutil.copyfile(source, dest)
        else:
            self.lab.write_history(dest)
        self.files["history.jsonl"] = "the scenario's history (with wire and kernel_log)"
        self.write_manifest()

    def write_manifest(self) -> None:
        kernels = {h: self.lab.pool.kernels.get(self.lab.machine_of(h).name, "")
                   for h in self.hosts}
        manifest = {"scenario": self.scenario, "column": self.column, "lab":
                    self.lab.description, "kernel": kernels,
                    "shared_kernel": self._kernels.shared_kernel,
                    "files": dict(sorted(self.files.items())), "splats": self._kernels.splats,
                    "capped": self.caps, "errors": self.errors,
                    "cost_s": round(self._cost_s, 3)}
        (self.dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n",
                                                encoding="utf-8")
