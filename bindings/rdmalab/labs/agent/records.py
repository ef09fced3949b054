"""What an AgentLab reads from its hosts: each host's records, followed as they are written
(a host that stops answering is lost, keeping what it said until then), the lab's history
on one time line, and what the hosts' kernels still hold for a process."""

from __future__ import annotations

import json
import os
from typing import Callable, Optional, Union

from ...errors import HostLost
from ...faults import records as wire_records
from ...agent.remote import Agent
from ...machines import rdma_res
from .common import FOLLOW_S, FOLLOW_WAIT_S


class LabRecords:
    """The records half of AgentLab (its base class): the host followers, lost hosts, the
    history, and kernel_resources. It keeps no state of its own: it works on the attributes
    AgentLab.__init__ sets (_lock, _agents, _machines, _t0, _records, _archived, _merged,
    _followed, _sealed, _lost, _procs, _faults, _stop_follow, _shut)."""

    # -- lost hosts
    def lost_hosts(self) -> dict[str, dict]:
        """host -> what is known of its loss (machine, at_ns, error, records_kept). Asks each
        live agent once, so a loss is known as soon as the scenario's call failed."""
        if not self._shut:
            for name in list(self._agents):
                self._fetch(name)
        with self._lock:
            return {n: dict(v) for n, v in self._lost.items()}

    def _check_lost(self, name: str) -> None:
        lost = self._lost.get(name)
        if lost is not None:
            raise HostLost(name, lost)

    def _lose(self, name: str, error: BaseException) -> None:
        agent = self._agents[name]
        with self._lock:
            if name in self._lost or agent.broken:  # known, or a fault took it on purpose
                return
            m = self._machines[name]
            info = {"machine": m.name, "at_ns": self.now_ns - self._t0,
                    "error": f"{type(error).__name__}: {error}",
                    "records_kept": len(self._followed[name])}
            self._lost[name] = info
            agent.broken = f"host lost: {info['error']}"
        self.record("host_lost", object="host", host=name, **info)

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

    def _parse(self, jsonl: str) -> list[dict]:
        """An agent's records on the lab's time line: its seq kept as host_seq, t_ns from the
        lab's start (the agent's clock is offset onto ours)."""
        out = []
        for line in jsonl.splitlines():
            r = json.loads(line)
            r["host_seq"] = r.pop("seq")
            r["t_ns"] -= self._t0
            out.append(r)
        return out

    def _fetchable(self, name: str) -> tuple[Agent, Optional[list[dict]]]:
        """The host's agent and followed records; None for the records when that agent cannot
        be asked (broken, no lab, archived)."""
        with self._lock:
            agent = self._agents[name]
            if agent.broken or agent.lab is None or name in self._sealed:
                return agent, None
            return agent, self._followed[name]

    def _follow(self, name: str) -> None:
        """Follows one host: each fetch waits in its agent for the next records."""
        while not self._stop_follow.wait(FOLLOW_S):
            self._fetch(name, FOLLOW_WAIT_S)  # at once for a host it cannot ask

    # -- history
    def record(self, kind: str, object: str = "scenario", host: str = "", **data) -> int:
        with self._lock:
            seq = len(self._records)
            self._records.append({"seq": seq, "t_ns": self.now_ns - self._t0, "host": host,
                                  "object": object, "kind": kind, "data": data})
        return seq

    def history(self, since_seq: int = 0) -> list[dict]:
        """Every host's records and the controller's on the controller's time line (t_ns from
        the lab's start), ordered by time; seq renumbered, each host's own seq kept as
        host_seq."""
        merged = []
        for name in self._agents:
            merged += [dict(r) for r in self._fetch(name)]
        for proc in self._procs:
            merged += proc.records()
        for r in self._faults.switch_history():  # the switch runs on this machine's clock
            merged.append(wire_records.from_switch(r, self._t0))
        with self._lock:
            merged += [dict(r) for r in self._archived]
            merged += [dict(r) for r in self._merged]
            merged += [dict(r, host_seq=r["seq"]) for r in self._records]
        merged.sort(key=lambda r: (r["t_ns"], r["host"], r["host_seq"]))
        for i, r in enumerate(merged):
            r["seq"] = i
        return merged[since_seq:]

    @property
    def t0_ns(self) -> int:
        """The lab's start on the controller's CLOCK_MONOTONIC: t_ns 0 of its history."""
        return self._t0

    def merge_records(self, records: list[dict]) -> None:
        """Records made outside the agents (rdmalab.report.evidence: `wire` frames of the capture,
        `kernel_log` splat lines), each {t_ns (lab time), host, object, kind, data}: merged
        into the history on its time line, host_seq their order here."""
        with self._lock:
            base = len(self._merged)
            self._merged += [dict(r, seq=0, host_seq=base + i) for i, r in enumerate(records)]

    def _agent_records(self, agent: Agent) -> list[dict]:
        """All of an agent's records (a killable process's agent, not followed)."""
        return [] if agent.lab is None else self._parse(agent.lab._o.history_jsonl())

    def _archive(self, fetch: Callable[[], list[dict]], host: str, object: str) -> None:
        """Keeps fetch()'s records past their agent (a reboot, a kill, shutdown); an agent that
        cannot answer any more loses them, and the history says so."""
        try:
            records = fetch()
        except Exception as e:
            records = []
            self.record("history_lost", object=object, host=host, error=str(e))
        with self._lock:
            self._archived += records

    def _archive_host(self, name: str) -> None:
        """Moves a host's followed records to the archive (its agent is about to go)."""
        self._fetch(name)
        with self._lock:
            self._archived += self._followed[name]
            self._followed[name] = []
            self._sealed.add(name)

    def write_history(self, path: Union[str, os.PathLike]) -> None:
        os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            for r in self.history():
                f.write(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n")

    # -- evidence: what the hosts' kernels hold
    def kernel_resources(self, host: str, pids: set[int]) -> dict[str, int]:
        """What the host's kernel still holds for these pids (restrack records the creating
        thread's TID, so a process is the set of its threads), by kind (`rdma res show`,
        rdmalab.machines.rdma_res.KINDS); kinds with none are left out."""
        # One call to the host's agent (its rdma batch process) for all kinds: an SSH command
        # costs ~0.5 s on a TCG guest, and this is polled. The batch stops at the first kind
        # that fails: those after it are asked again over the machine, in one command.
        res = self.agent_for(host).call_copy("rdmalab.machines.rdma_res", "batch", "", 30.0)
        failed = [k for k in rdma_res.KINDS if isinstance(res.get(k), dict)]
        if failed[1:]:
            res.update(rdma_res.read(self._machines[host], tuple(failed[1:]), root=True,
                                     timeout=30.0))
        return rdma_res.held_by(res, pids)
