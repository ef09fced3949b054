"""AgentProcess: a killable process of an agent host, an OS process (an agent) of its own."""

from __future__ import annotations

import errno
import time
from typing import TYPE_CHECKING, Optional

from ...errors import Hung
from ...errors import make_error as _make_error
from ...agent.remote import Agent

if TYPE_CHECKING:
    from .lab import AgentLab
    from .records import LabHistory


class AgentProcess:
    """A process of an agent host that is an OS process of its own: a second agent on the
    machine (python over its own SSH session), whose verbs lab has just this process. Its
    objects live there, so kill() is a real SIGKILL: the host's kernel releases them (uverbs,
    ucma) as it does for any process that dies. history is the lab's LabHistory: it reads
    this process's records and keeps them past a kill."""

    def __init__(self, lab: "AgentLab", host: str, name: str, history: "LabHistory"):
        self._lab, self.name, self._host_name = lab, name, host
        self._history = history
        self._agent = lab.pool.start_agent(lab.machine_of(host))
        try:
            self._agent.new_lab(lab.seed, host, lab.addresses)
            self.host = self._agent.lab.host(host)
            self._proc = self.host.process(name)
            self.pid = self._agent.pid
        except BaseException:
            self._agent.close(deadline_s=5.0)
            raise
        self._killed = False
        self._tids = {self.pid}

    @property
    def alive(self) -> bool:
        return not self._killed

    @property
    def agent(self) -> Optional[Agent]:
        return None if self._killed else self._agent

    def _live(self, verb: str):
        if self._killed:
            raise _make_error(verb, errno.ESRCH, f"proc:{self.name} (pid {self.pid}) was killed")
        return self._proc

    def open_device(self, device_name: str = ""):
        return self._live("ibv_open_device").open_device(device_name)

    def event_channel(self, workers: int = 2):
        return self._live("rdma_create_event_channel").event_channel(workers)

    def kernel_objects(self) -> dict[str, int]:
        """`rdma res show` in the guest for this process (it works after the kill too).
        restrack names the thread that made each object (its TID, not the process's PID), so
        the threads seen while the process lived count as its own."""
        self._note_threads()
        return self._lab.kernel_resources(self._host_name, self._tids)

    def _note_threads(self) -> None:
        if self._killed:
            return
        try:
            tids = self._lab.agent_for(self._host_name).module("os").listdir(
                f"/proc/{self.pid}/task")
        except Exception:  # gone
            return
        self._tids |= {int(t) for t in tids}

    def records(self) -> list[dict]:
        return [] if self._killed else self._history.agent_records(self._agent)

    def kill(self) -> None:
        """SIGKILL from the host's main agent; returns once the process is gone (its pid no
        longer in /proc). Its history so far is kept; nothing it would have recorded after."""
        if self._killed:
            return
        self._history.archive(self.records, self._host_name, f"proc:{self.name}")
        self._lab.record("fault", object=f"proc:{self.name}", host=self._host_name,
                         fault="kill", pid=self.pid)
        self._note_threads()
        main = self._lab.agent_for(self._host_name)
        os_mod = main.module("os")
        os_mod.kill(self.pid, 9)
        self._killed = True
        self._agent.broken = "SIGKILLed by a kill fault"
        self._agent.lab = None
        end = time.monotonic() + 10.0
        while not _proc_exited(main, self.pid):
            if time.monotonic() > end:
                raise Hung(f"kill {self.name}", f"pid {self.pid} on {self._host_name} still "
                           "runs 10 s after SIGKILL")
            time.sleep(0.01)
        self._agent.close(deadline_s=5.0)

    def close(self) -> None:
        """Lab shutdown: a live process closes its lab (objects released in order)."""
        if self._killed:
            return
        self._killed = True
        try:
            self._agent.close_lab()
        finally:
            self._agent.close(deadline_s=5.0)

    def __repr__(self) -> str:
        state = "killed" if self._killed else "alive"
        return f"<AgentProcess {self.name} pid {self.pid} on {self._host_name} ({state})>"


def _proc_exited(agent: Agent, pid: int) -> bool:
    """pid's threads have all gone through do_exit, so its files are closed (uverbs and ucma
    released everything). A zombie leader is not enough: the leader of a multi-threaded
    process turns zombie while its other threads may still be exiting, and the files close
    with the last of them; a thread leaves the count (Threads:) only once released."""
    try:
        with agent.module("builtins").open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    except Exception:  # no /proc entry: gone (reaped)
        return True
    threads = fields.get("Threads")  # absent once the signal struct is gone
    return "zombie" in fields.get("State", "") and (threads is None or threads.strip() == "1")
