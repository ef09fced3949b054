"""An agent lab's history (LabHistory): the controller's records, each host's records followed
as they are written (a host that stops answering is lost, keeping what it said until then),
records kept past their agents and records merged from outside, on one time line; and what a
host's kernel still holds for a process (kernel_holds)."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Callable, Optional, Union

from ...errors import HostLost
from ...agent.remote import Agent
from ...machines import rdma_res
from .common import FOLLOW_S, FOLLOW_WAIT_S


class LabHistory:
    """An agent lab's history, kept for its lab (AgentLab), which gives it: machines (host ->
    its Machine: the hosts, and the machine a loss names), agent_for(host) (the host's agent
    now: a reboot or a renewal replaces it), t0_ns (t_ns 0: the lab's start on the
    controller's CLOCK_MONOTONIC) and others() (records no follower fetches, already on the
    lab's time line: the killable processes', the fault switch's). A host whose agent is about
    to go is archived (archive_host); once its new agent is in place, follow_new_agent."""

    def __init__(self, machines: dict, agent_for: Callable[[str], Agent], t0_ns: int,
                 others: Callable[[], list[dict]]):
        self._machines, self._agent_for, self.t0_ns = machines, agent_for, t0_ns
        self._others = others
        self._lock = threading.RLock()
        self._records: list[dict] = []  # the controller's own
        self._archived: list[dict] = []  # records of agents gone (a reboot, a kill, a loss)
        self._merged: list[dict] = []  # records from outside the agents (evidence: wire, kmsg)
        self._followed: dict[str, list[dict]] = {n: [] for n in machines}  # each host's records
        # Hosts whose agent's records were moved to the archive (a reboot under way, shutdown):
        # not fetched again, or the follower would take them all a second time from seq 0.
        self._sealed: set[str] = set()
        self._lost: dict[str, dict] = {}
        self._stop = threading.Event()
        self._followers: list[threading.Thread] = []

    # -- following the hosts
    def follow(self) -> None:
        """Starts one follower a host: each fetch waits in its agent for the next records."""
        self._followers = [threading.Thread(target=self._follow, args=(n,), daemon=True,
                                            name=f"follow-{n}") for n in self._followed]
        for t in self._followers:
            t.start()

    def stop(self) -> None:
        """Stops the followers (the lab's shutdown, once its agents' records are archived)."""
        self._stop.set()
        for t in self._followers:
            t.join(FOLLOW_WAIT_S + 5.0)

    def _follow(self, name: str) -> None:
        while not self._stop.wait(FOLLOW_S):
            self._fetch(name, FOLLOW_WAIT_S)  # at once for a host it cannot ask

    def fetch_all(self) -> None:
        """Asks each live agent once, so a loss is known as soon as the scenario's call failed."""
        for name in list(self._machines):
            self._fetch(name)

    def _fetch(self, name: str, wait_s: float = 0.0) -> list[dict]:
        """The host's records so far: what was followed, plus anything new from its agent
        (waiting there up to wait_s for the next)."""
        agent, known = self._fetchable(name)
        if known is None:
            return self._followed[name]
        try:
            text = agent.history_after(len(known), wait_s)
        except Exception as e:
            if name in self._sealed:  # archived meanwhile: its agent may be going on purpose
                return self._followed[name]
            if isinstance(e, (EOFError, OSError)) or agent.conn.closed:
                self._lose(name, e)
            return self._followed[name]
        with self._lock:
            if self._followed[name] is not known:  # archived meanwhile: taken there
                return self._followed[name]
            # A record fetched meanwhile by another thread is not taken twice.
            known += [r for r in self._parse(text) if r["host_seq"] >= len(known)]
            return known

    def _fetchable(self, name: str) -> tuple[Agent, Optional[list[dict]]]:
        """The host's agent and followed records; None for the records when that agent cannot
        be asked (broken, no lab, archived)."""
        with self._lock:
            agent = self._agent_for(name)
            if agent.broken or agent.lab is None or name in self._sealed:
                return agent, None
            return agent, self._followed[name]

    def _parse(self, jsonl: str) -> list[dict]:
        """An agent's records on the lab's time line: its seq kept as host_seq, t_ns from the
        lab's start (the agent's clock is offset onto ours)."""
        out = []
        for line in jsonl.splitlines():
            r = json.loads(line)
            r["host_seq"] = r.pop("seq")
            r["t_ns"] -= self.t0_ns
            out.append(r)
        return out

    def agent_records(self, agent: Agent) -> list[dict]:
        """All of an agent's records (a killable process's agent, not followed)."""
        return [] if agent.lab is None else self._parse(agent.lab._o.history_jsonl())

    # -- lost hosts
    def lost(self) -> dict[str, dict]:
        """host -> what is known of its loss (machine, at_ns, error, records_kept), so far."""
        with self._lock:
            return {n: dict(v) for n, v in self._lost.items()}

    def check_lost(self, name: Optional[str] = None) -> None:
        """HostLost if the host (by default: any host) was lost."""
        if name is None:
            if self._lost:
                raise HostLost(*next(iter(self._lost.items())))
            return
        lost = self._lost.get(name)
        if lost is not None:
            raise HostLost(name, lost)

    def _lose(self, name: str, error: BaseException) -> None:
        agent = self._agent_for(name)
        with self._lock:
            if name in self._lost or agent.broken:  # known, or a fault took it on purpose
                return
            info = {"machine": self._machines[name].name,
                    "at_ns": time.monotonic_ns() - self.t0_ns,
                    "error": f"{type(error).__name__}: {error}",
                    "records_kept": len(self._followed[name])}
            self._lost[name] = info
            agent.broken = f"host lost: {info['error']}"
        self.record("host_lost", object="host", host=name, **info)

    # -- agents that go
    def archive(self, fetch: Callable[[], list[dict]], host: str, object: str) -> None:
        """Keeps fetch()'s records past their agent (a reboot, a kill, shutdown); an agent that
        cannot answer any more loses them, and the history says so."""
        try:
            records = fetch()
        except Exception as e:
            records = []
            self.record("history_lost", object=object, host=host, error=str(e))
        with self._lock:
            self._archived += records

    def archive_host(self, name: str) -> None:
        """Moves a host's followed records to the archive (its agent is about to go)."""
        self._fetch(name)
        with self._lock:
            self._archived += self._followed[name]
            self._followed[name] = []
            self._sealed.add(name)

    def follow_new_agent(self, name: str) -> None:
        """The host's new agent is in place (agent_for answers it): followed from its seq 0."""
        with self._lock:
            self._sealed.discard(name)

    # -- the history
    def record(self, kind: str, object: str = "scenario", host: str = "", **data) -> int:
        with self._lock:
            seq = len(self._records)
            self._records.append({"seq": seq, "t_ns": time.monotonic_ns() - self.t0_ns,
                                  "host": host, "object": object, "kind": kind, "data": data})
        return seq

    def merge(self, records: list[dict]) -> None:
        """Records made outside the agents, each {t_ns (lab time), host, object, kind, data}:
        merged into the history on its time line, host_seq their order here."""
        with self._lock:
            base = len(self._merged)
            self._merged += [dict(r, seq=0, host_seq=base + i) for i, r in enumerate(records)]

    def history(self, since_seq: int = 0) -> list[dict]:
        """Every host's records and the controller's on the controller's time line (t_ns from
        the lab's start), ordered by time; seq renumbered, each host's own seq kept as
        host_seq."""
        merged = []
        for name in self._machines:
            merged += [dict(r) for r in self._fetch(name)]
        merged += self._others()
        with self._lock:
            merged += [dict(r) for r in self._archived]
            merged += [dict(r) for r in self._merged]
            merged += [dict(r, host_seq=r["seq"]) for r in self._records]
        merged.sort(key=lambda r: (r["t_ns"], r["host"], r["host_seq"]))
        for i, r in enumerate(merged):
            r["seq"] = i
        return merged[since_seq:]

    def write(self, path: Union[str, os.PathLike]) -> None:
        """The history as JSON lines."""
        os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            for r in self.history():
                f.write(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n")


def kernel_holds(agent: Agent, machine, pids: set[int]) -> dict[str, int]:
    """What the kernel of agent's host (machine) still holds for these pids (restrack records
    the creating thread's TID, so a process is the set of its threads), by kind (`rdma res
    show`, rdmalab.machines.rdma_res.KINDS); kinds with none are left out."""
    # One call to the host's agent (its rdma batch process) for all kinds: an SSH command
    # costs ~0.5 s on a TCG guest, and this is polled. The batch stops at the first kind
    # that fails: those after it are asked again over the machine, in one command.
    res = agent.call_copy("rdmalab.machines.rdma_res", "batch", "", 30.0)
    failed = [k for k in rdma_res.KINDS if isinstance(res.get(k), dict)]
    if failed[1:]:
        res.update(rdma_res.read(machine, tuple(failed[1:]), root=True, timeout=30.0))
    return rdma_res.held_by(res, pids)
