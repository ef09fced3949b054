"""What the agent lab's rooms share: its constants (where the repository and the agent are,
how often hosts are followed), whether this machine can boot the VM lab, device labels, and
each_host (a call per host, side by side)."""

from __future__ import annotations

import os
import re
import shutil
import threading
from typing import Callable, Optional

HISTORY_TAIL = 50
POLL_S = 0.002
FOLLOW_WAIT_S = 1.0  # how long one fetch of a host's records waits in its agent for the next
# Between two fetches: a host writing records all the time (a drain, a burst) is fetched ten
# times a second, not once per record (each fetch costs a TCG guest ~10 ms of its one CPU).
FOLLOW_S = 0.1
STUCK_DUMP_S = 30.0  # reading a stuck agent's stacks through its machine's channel
STUCK_DUMP_CHARS = 20000  # kept of that dump (the end: the Python stacks)


def qemu_unavailable() -> Optional[str]:
    """Why this machine cannot run the VM lab, or None if it can."""
    if shutil.which("qemu-system-x86_64") is None:
        return "qemu-system-x86_64 is not installed (make vmlab-deps)"
    if shutil.which("ssh") is None or not os.path.exists("/usr/sbin/sshd"):
        return "openssh client/server are not installed (make vmlab-deps)"
    try:
        import execnet  # noqa: F401
        import rpyc  # noqa: F401
    except ImportError as e:
        return f"python3-execnet / python3-rpyc missing: {e}"
    return None


def device_label(device: str) -> str:
    """The provider a device name says ("rxe0" -> rxe, "mlx5_0" -> mlx5): metrics' label."""
    return re.sub(r"_?\d+$", "", device) or device


def each_host(fn: Callable, items: list) -> list:
    """fn(item) for every item at once, one thread each, results in items' order. The hosts
    are machines of their own (a TCG guest is a qemu process of its own): their starts and
    checks, each seconds of a guest's CPU, need not wait for one another. The first error
    (in items' order) is raised once every call has ended."""
    items = list(items)
    if len(items) < 2:
        return [fn(i) for i in items]
    out: list = [None] * len(items)
    errs: list = [None] * len(items)

    def run(k: int) -> None:
        try:
            out[k] = fn(items[k])
        except BaseException as e:  # handed to the caller's thread
            errs[k] = e

    threads = [threading.Thread(target=run, args=(k,), name=f"rdmalab-host-{k}", daemon=True)
               for k in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errs:
        if e is not None:
            raise e
    return out
