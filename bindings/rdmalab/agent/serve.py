"""The host agent: the Python host API over the verbs backend, in the machine whose devices it
drives (a VM of the lab, later a real host). The controller starts it through execnet
(rdmalab.agent.remote.Agent.start) and drives it over RPyC on that channel; nothing listens on a
port. It lives as long as the channel: when the controller goes, the agent's labs shut down
(every verbs object released) and the process exits.
"""

from __future__ import annotations

import ctypes
import faulthandler
import importlib
import os
import pickle
import signal
import sys
import threading

from ..labs.engine import verbs_lab
from . import remote

_LABS: list = []
_LOCK = threading.Lock()


def track(lab) -> None:
    """Keeps lab until it shuts down: an agent makes one per scenario, and a lab kept after
    its shutdown kept its memory (and once kept its stall meter's thread running)."""
    with _LOCK:
        _LABS.append(lab)
    lab.on_shutdown(_untrack)


def _untrack(lab) -> None:
    with _LOCK:
        if lab in _LABS:
            _LABS.remove(lab)


AGENT_COMM = b"rdmalab-agent"  # the name `rdma res show` gives this process's objects


def _name_process() -> None:
    """Names this thread (and every thread it starts later) rdmalab-agent: restrack keeps the
    creating thread's comm, so a host's health check knows rdmalab's objects by it."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(15, AGENT_COMM, 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):  # not Linux: nothing checks it there
        pass


def stacks_path(pid: int) -> str:
    """Where the agent of process pid writes its Python stacks on SIGUSR1."""
    return f"/tmp/rdmalab-agent-{pid}.stacks"


_STACKS = None  # the open file faulthandler writes to (kept open for the process's life)


def _dump_stacks_on_sigusr1() -> None:
    """SIGUSR1 writes every thread's Python stack to stacks_path(): what a stuck agent was
    doing, read by its controller through the machine's own channel (AgentLab.shutdown)."""
    global _STACKS
    try:
        _STACKS = open(stacks_path(os.getpid()), "w")
        faulthandler.register(signal.SIGUSR1, file=_STACKS, all_threads=True)
    except (OSError, AttributeError, ValueError):  # not Linux, or no /tmp: no dump
        pass


def _drop_stacks_file() -> None:
    """The stacks file goes with the agent: a real host's /tmp is not wiped by a reboot."""
    if _STACKS is not None:
        faulthandler.unregister(signal.SIGUSR1)
        _STACKS.close()
        try:
            os.unlink(_STACKS.name)
        except OSError:
            pass


def serve(channel) -> None:
    """Serves the controller until the channel closes (execnet's remote_exec body)."""
    import rpyc  # deferred: optional (AgentService needs it); this module imports without it

    _name_process()
    _dump_stacks_on_sigusr1()
    conn = rpyc.connect_stream(remote.ExecnetStream(channel), service=remote.AgentService,
                               config=remote.RPYC_CONFIG)
    try:
        conn.serve_all()
    finally:
        shutdown_all()
        _drop_stacks_file()


def open_lab(seed: int, host: str, addresses: tuple, offset_ns: int):
    """A fresh verbs lab for one scenario, its times put on the controller's clock
    (offset_ns: controller clock - this process's): made in one round trip
    (rdmalab.agent.remote.Agent.new_lab). Tracked: it shuts down when the controller goes."""
    lab = verbs_lab(seed, host, addresses)
    lab._o.set_clock_offset(offset_ns)
    track(lab)
    return lab


def pickled(module: str, name: str, *args) -> bytes:
    """module.name(*args), pickled: a result of plain data (a dict of lists) crosses in the
    reply, where through a proxy it cost three round trips (the call, rpyc's obtain, the
    proxy's release): rdmalab.agent.remote.Agent.call_copy."""
    return pickle.dumps(getattr(importlib.import_module(module), name)(*args))


def history_after(lab, since: int, wait_s: float) -> str:
    """lab's records from seq `since` on (JSON lines), waiting up to wait_s for the first:
    the controller follows each host with one round trip per batch of records instead of a
    poll every 100 ms (each round trip costs a TCG guest ~10 ms of its one CPU). The wait
    blocks in the engine until a record comes: polling here cost an idle guest ~4% of its
    CPU."""
    return lab._o.history_wait_since_jsonl(since, max(0, int(wait_s * 1e9)))


def shutdown_all() -> None:
    with _LOCK:
        labs = list(_LABS)
        _LABS.clear()
    for lab in reversed(labs):
        try:
            lab.shutdown()
        except Exception as e:  # the process is going; say what was left behind
            print(f"rdmalab agent: shutdown of {lab!r} failed: {e}", file=sys.stderr)
