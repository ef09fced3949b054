"""The host side of a scenario's evidence bundle (rdmalab.report.evidence): what the controller
asks each host's agent for, by name (Agent.call_copy). It runs in the agent, shipped with the
package: `rdma res` (through the agent's rdma batch process, rdmalab.machines.rdma_res), the
kernel log (rdmalab.findings.kernlog) and its clocks, and the netns lab's bridge capture as
seen through the outer machine's file system, which a netns host's agent shares."""

from __future__ import annotations

import json
import os
import time

from ..findings import kernlog
from ..machines import rdma_res

MAX_KMSG_RECORDS = kernlog.MAX_RECORDS


def host_begin(kmsg: bool = True, device: str = "") -> dict:
    """At a lab's start: the RDMA objects, where the kernel log is, and the clocks."""
    return {"res": rdma_res.batch(device), "kmsg": kernlog.kmsg_mark() if kmsg else None,
            "clock": kernlog.clock_pair()}


def host_res(device: str = "") -> dict:
    """At a scenario's end: the RDMA objects."""
    return rdma_res.batch(device)


def host_end(mark_json: str) -> dict:
    """After the lab's shutdown: the kernel log since the mark host_begin gave (as JSON: a
    dict would go by reference, each of its reads a call back to the controller)."""
    mark = json.loads(mark_json) if mark_json else None
    return {"kmsg": kernlog.kmsg_since(mark, max_records=MAX_KMSG_RECORDS),
            "clock": kernlog.clock_pair()}


# -- the netns lab's bridge capture (rdmalab.machines.netns.BridgeCapture) -----------------------

def capture_state(path: str, pid: int) -> tuple[bool, int]:
    """(whether pid runs, the size of path): the netns lab's bridge capture seen from a host's
    agent, which shares the outer machine's file system."""
    alive = False
    try:
        with open(f"/proc/{pid}/status") as f:
            alive = not any(l.startswith("State:") and "Z" in l.split()[1:2] for l in f)
    except OSError:
        pass
    return alive, _size(path)


def capture_drained(path: str, pid: int, deadline_s: float = 2.0) -> int:
    """Waits until tcpdump (pid) has written every frame the kernel handed it; the file's size
    then. The kernel wakes tcpdump as it queues a frame (immediate mode), so tcpdump asleep
    (State S: in poll) with the size unchanged around that look means its queue is empty and
    its writes done (-U). A tcpdump gone, or still busy at the deadline, leaves the size as it
    is (the part may miss its last frames)."""
    end = time.monotonic() + deadline_s
    size = _size(path)
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return _size(path)
        now = _size(path)
        if state == "S" and now == size:
            return now
        size = now
        time.sleep(0.005)
    return size


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def file_part(path: str, offset: int, max_bytes: int,
              pid: int = 0) -> tuple[bytes, bytes, int]:
    """(the first 24 bytes, at most max_bytes from offset, the size) of a file: a scenario's
    part of the bridge capture, read once its tcpdump (pid) has written what it was given."""
    if pid:
        capture_drained(path, pid)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        header = f.read(24)
        f.seek(offset)
        return header, f.read(max_bytes), size
