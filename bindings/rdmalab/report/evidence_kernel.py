"""The kernels in a scenario's evidence bundle (rdmalab.report.evidence), a KernelLogs: each
host's kernel log since the lab started, read after its shutdown (kmsg-<host>.txt), its splats
found (rdmalab.findings.kernlog), written (splat-<host>-<n>.txt), judged against the findings
registry (a kernel_log entry may expect a splat on a host's driver and kernel) and recorded as
`kernel_log` history records."""

from __future__ import annotations

import json
from typing import Callable

from ..findings import kernlog
from .evidence_host import MAX_KMSG_RECORDS


def kmsg_text(records: list) -> str:
    """Kernel log records as `dmesg -r` prints them (kernlog.from_dmesg reads it back)."""
    return "".join(f"<{lvl}>[{ts // 10**6:5d}.{ts % 10**6:06d}] {text}\n"
                   for _seq, ts, lvl, text in records)


class KernelLogs:
    """One bundle's kernel logs: a mark of each host's log at the lab's start (mark), the logs
    read after its shutdown (read), their splats (splats). The bundle
    (rdmalab.report.evidence.Collector) gives: lab, its hosts, the findings registry (or None),
    parallel(tasks) (its agents asked at once, each by its deadline), agent_call(host, fn,
    *args) (rdmalab.report.evidence_host.fn in that host's agent), write(name, text, what) (a
    file of the bundle), and its errors and caps, which this adds to."""

    def __init__(self, lab, hosts: list[str], *, registry,
                 parallel: Callable[[list], dict], agent_call: Callable[..., Callable[[], object]],
                 write: Callable[[str, str, str], None], errors: list[str], caps: dict[str, str]):
        self._lab, self._hosts, self._registry = lab, hosts, registry
        self._parallel, self._agent_call, self._write = parallel, agent_call, write
        self._errors, self._caps = errors, caps
        self.splats: list[dict] = []
        self._marks: dict[str, dict] = {}  # host -> its kernel-log mark from host_begin
        kernels = {lab.machine_of(h).kernel_machine.name for h in hosts}
        # The netns lab's hosts are namespaces on one kernel: its log is read once.
        self.shared_kernel = len(hosts) > 1 and len(kernels) == 1

    def mark_hosts(self) -> list[str]:
        """The hosts whose log is marked at the lab's start (one for a shared kernel)."""
        return self._hosts[:1] if self.shared_kernel else self._hosts

    def mark(self, host: str, mark: dict) -> None:
        """host_begin's mark of host's kernel log: read from there after the shutdown."""
        self._marks[host] = mark

    def read(self) -> list[dict]:
        """Every host's kernel log read (one for the netns lab's shared kernel), written, its
        splats judged: their `kernel_log` records."""
        if self.shared_kernel:
            reader = next((h for h in self._hosts if h in self._marks), None)
            readers = [reader] if reader else []
        else:
            readers = [h for h in self._hosts if h in self._marks]
        for h in self._hosts:
            if h not in self._marks and not self.shared_kernel:
                self._errors.append(f"{h}: no kernel-log mark at the start: its log is not "
                                    "judged")
        got = self._parallel([(h, "kernel log", self._agent_call(h, "host_end",
                                                              json.dumps(self._marks[h])))
                              for h in readers])
        records: list[dict] = []
        for (reader, _), r in sorted(got.items()):
            records += self._kernel_log(reader, r["kmsg"])
        return records

    def _kernel_log(self, reader: str, k: dict) -> list[dict]:
        """One host's answer to host_end: its log written for the hosts it is the kernel of,
        its splats judged."""
        if k.get("error"):
            self._errors.append(f"{reader}: kernel log: {k['error']}")
        if k.get("truncated"):
            self._caps[f"kmsg-{reader}"] = (f"kernel log capped at {MAX_KMSG_RECORDS} "
                                            "records (or its read deadline)")
        if k.get("lost"):
            self._caps[f"kmsg-{reader}-lost"] = (f"{k['lost']} records overwritten before "
                                                 "they were read")
        lines = [kernlog.Line(*rec) for rec in k["records"]]
        owners = self._hosts if self.shared_kernel else [reader]
        text = kmsg_text(k["records"])
        offset = self._lab.agent_for(reader).offset_ns
        for host in owners:
            self._write(f"kmsg-{host}.txt", text,
                        f"{host}'s kernel log since the lab started, through its shutdown"
                        + (" (one kernel: every host of the netns lab)"
                           if self.shared_kernel else "")
                        + (" (the host rebooted: all of its new boot)"
                           if k.get("rebooted") else ""))
        records: list[dict] = []
        for n, splat in enumerate(kernlog.find_splats(lines), 1):
            records += self._judge(splat, n, owners, offset)
        return records

    def _judge(self, splat, n: int, owners: list[str], offset_ns: int) -> list[dict]:
        records = []
        for host in owners:
            name = f"splat-{host}-{n}.txt"
            self._write(name, splat.dmesg(), f"kernel {splat.kind} splat on {host}: "
                                             f"{splat.first_line}")
            key = self._lab.devices_by_host()[host]
            kernel = self._lab.kernels_by_host().get(host, "")
            expected = (self._registry.expected_splat(key, kernel, splat.text)
                        if self._registry is not None else None)
            self.splats.append({"host": host, "kind": splat.kind,
                                "first_line": splat.first_line, "file": name,
                                "lines": len(splat.lines), "ended": splat.ended,
                                "kernel": kernel,
                                "expected_by": expected.id if expected else None})
            for line in splat.lines:
                records.append({"t_ns": line.ts_us * 1000 + offset_ns - self._lab.t0_ns,
                                "host": host, "object": "kmsg", "kind": "kernel_log",
                                "data": {"level": line.level_name, "text": line.text,
                                         "splat": True, "seq": line.seq,
                                         "splat_kind": splat.kind, "file": name,
                                         **({"expected_by": expected.id} if expected
                                            else {})}})
        return records
