"""BridgeCapture: tcpdump on the netns lab's bridge, one per bridge for as long as the lab runs;
each scenario takes its part of the file as a pcap (rdmalab.report.evidence)."""
from __future__ import annotations

import atexit
import base64
import os
import re
import shlex
import time
from typing import Optional

from ..machine import Machine, MachineError
from .common import CMD_TIMEOUT_S, SBIN_PATH


class BridgeCapture:
    """tcpdump on the netns lab's bridge in the outer machine, for the scenarios' evidence
    (rdmalab.report.evidence): every frame between the hosts, as the fault switch's capture is
    in the VM lab. One tcpdump per bridge runs as long as the lab (starting one costs ~0.5 s on
    a TCG guest); each scenario takes its part of the file:

        cap = BridgeCapture.shared(outer, "rlbr")
        offset = cap.mark()                     # starts tcpdump when none runs
        ...                                     # the scenario
        stats = cap.take(offset, "wire.pcap")   # what was captured since, as a pcap file

    Each is one outer.run() (a guest's command agent: ~0.05 s). A scenario's part is capped at
    max_bytes; the file is started afresh once it outgrows max_file. NetnsHosts.close() (and
    the interpreter's exit) stops it and removes the file.
    """

    _live: dict = {}  # (machine name, bridge) -> BridgeCapture

    def __init__(self, machine: Machine, bridge: str, max_bytes: int = 8 << 20,
                 max_file: int = 64 << 20):
        self.machine, self.bridge = machine, bridge
        self.max_bytes, self.max_file = max_bytes, max_file
        base = f"/tmp/rdmalab-bridge-{bridge}-{os.getpid()}-{time.monotonic_ns()}"
        self.path, self.log = base + ".pcap", base + ".log"
        self.pid: Optional[int] = None

    @classmethod
    def shared(cls, machine: Machine, bridge: str, **kw) -> "BridgeCapture":
        """The capture of this bridge on this machine, made on first use."""
        key = (machine.name, bridge)
        cap = cls._live.get(key)
        if cap is None or cap.machine is not machine:
            if cap is not None:
                cap.close()
            cap = cls._live[key] = cls(machine, bridge, **kw)
        return cap

    @classmethod
    def close_all(cls, machine: Optional[Machine] = None, bridge: Optional[str] = None) -> None:
        for key, cap in list(cls._live.items()):
            if (machine is None or cap.machine is machine) and (bridge is None
                                                                 or cap.bridge == bridge):
                del cls._live[key]
                cap.close()

    def mark(self, deadline_s: float = 10.0, probe=None) -> int:
        """The capture file's size now (where a scenario's part starts); tcpdump is started
        first when none runs (or it died, or its file outgrew max_file). probe(path, pid) ->
        (alive, size): a cheaper look than a command where the caller has one (a process on
        the outer's file system: rdmalab.report.evidence asks a host's agent)."""
        if probe is not None and self.pid is not None:
            alive, size = probe(self.path, self.pid)
            if alive and size < self.max_file:
                return size
        q = shlex.quote
        tries = max(1, int(deadline_s / 0.02))
        alive = ("[ -n \"$old\" ] && [ -e /proc/$old ] && ! grep -q '^State:.*Z' "
                 "/proc/$old/status 2>/dev/null")
        gone = f"rm -f {q(self.path)} {q(self.log)}"
        # -U and --immediate-mode: each packet in the file as it is captured; -Z root: no
        # switch to the tcpdump user, whose rights may not reach the file.
        script = (f"{SBIN_PATH}old={self.pid or ''}; size=$(stat -c %s {q(self.path)} 2>/dev/null "
                  f"|| echo 0); if {alive} && [ $size -lt {int(self.max_file)} ]; then "
                  f"echo \"$old $size\"; exit 0; fi; "
                  f"[ -n \"$old\" ] && kill -9 $old 2>/dev/null; rm -f {q(self.path)}; "
                  f"setsid tcpdump -i {q(self.bridge)} -U --immediate-mode -n -Z root "
                  f"-w {q(self.path)} >{q(self.log)} 2>&1 </dev/null & pid=$!; i=0; "
                  f"until grep -q 'listening on' {q(self.log)} 2>/dev/null; do "
                  f"kill -0 $pid 2>/dev/null || {{ cat {q(self.log)} >&2; {gone}; exit 2; }}; "
                  f"i=$((i+1)); [ $i -ge {tries} ] && {{ kill -9 $pid; cat {q(self.log)} >&2; "
                  f"{gone}; exit 3; }}; sleep 0.02; done; "
                  f"echo \"$pid $(stat -c %s {q(self.path)})\"")
        r = self.machine.run(script, deadline_s + CMD_TIMEOUT_S, root=True)
        words = r.out.split()
        if r.rc != 0 or len(words) != 2 or not all(w.isdigit() for w in words):
            self.pid = None
            why = {2: "exited", 3: f"did not listen within {deadline_s} s"}.get(
                r.rc, f"rc {r.rc}: {r.out.strip()[-200:]}")
            raise MachineError(f"{self.machine.name}: tcpdump on {self.bridge} {why} (tcpdump "
                               f"is Debian's tcpdump package): {r.err.strip()[-500:]}")
        self.pid = int(words[0])
        return int(words[1])

    def take(self, offset: int, local: str, read=None) -> dict:
        """What the capture holds past offset, as a pcap file at `local` (the file's own header
        first; at most max_bytes of records, the last possibly cut), read once tcpdump has
        written every frame the kernel handed it (asleep in poll, its file's size unchanged:
        at most 2 s). {"bytes": n, "capped": why} when the part was larger. read(path, offset,
        max_bytes, pid) -> (header, part, size): a cheaper read than a command where the caller
        has one (rdmalab.report.evidence.file_part, which waits the same way)."""
        if read is not None:
            header, data, size = read(self.path, offset, self.max_bytes, self.pid or 0)
            return self._write(local, header, data, size - int(offset))
        q = shlex.quote
        # The drain wait of rdmalab.report.evidence.capture_drained, in sh: State S (field 3 of
        # stat) with the size unchanged around it, looked at until 2 s have passed (a deadline,
        # not a count: each look forks, which costs a TCG guest far more than its 5 ms sleep).
        drain = ("" if not self.pid else
                 f"pid={int(self.pid)}; end=$(( $(date +%s%N) + 2000000000 )); "
                 f"last=$(stat -c %s {q(self.path)}); "
                 f"while [ $(date +%s%N) -lt $end ]; do st=$(cut -d')' -f2 /proc/$pid/stat "
                 f"2>/dev/null | cut -d' ' -f2) || break; [ -n \"$st\" ] || break; "
                 f"now=$(stat -c %s {q(self.path)}); [ \"$st\" = S ] && [ $now = $last ] "
                 f"&& break; last=$now; sleep 0.005; done; ")
        script = (f"{drain}size=$(stat -c %s {q(self.path)}) || exit 1; echo \"size $size\" >&2; "
                  f"head -c 24 {q(self.path)} | base64 -w0; echo; "
                  f"tail -c +{int(offset) + 1} {q(self.path)} | head -c {int(self.max_bytes)} "
                  f"| base64 -w0; echo")
        r = self.machine.run(script, CMD_TIMEOUT_S, root=True)
        lines = r.out.split("\n")
        if r.rc != 0 or len(lines) < 2:
            raise MachineError(f"{self.machine.name}: reading the capture of {self.bridge} "
                               f"({self.path}): rc {r.rc}: {r.err.strip()[-500:]}")
        header, data = base64.b64decode(lines[0]), base64.b64decode(lines[1])
        m = re.search(r"size (\d+)", r.err)
        return self._write(local, header, data, int(m.group(1)) - int(offset) if m
                           else len(data))

    def _write(self, local: str, header: bytes, data: bytes, part: int) -> dict:
        if len(header) != 24:
            raise MachineError(f"{self.machine.name}: the capture of {self.bridge} has no pcap "
                               f"header ({len(header)} bytes)")
        with open(local, "wb") as f:
            f.write(header + data)
        stats: dict = {"bytes": part}
        if part > self.max_bytes:
            stats["capped"] = f"{self.max_bytes} of {part} bytes"
        return stats

    def close(self) -> None:
        """Stops tcpdump and removes its files (a machine already gone is fine)."""
        pid, self.pid = self.pid, None
        try:
            self.machine.run(f"{'kill -9 %d 2>/dev/null; ' % pid if pid else ''}"
                             f"rm -f {shlex.quote(self.path)} {shlex.quote(self.log)}",
                             CMD_TIMEOUT_S, root=True)
        except (MachineError, OSError):
            pass


atexit.register(BridgeCapture.close_all)
