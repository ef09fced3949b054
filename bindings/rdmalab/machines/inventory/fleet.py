"""The inventory's fleet function (--lab inventory:PATH): hosts of the file, the first free and
healthy ones behind one fault switch, each locked for the run; _SwitchLock (a switch for one
run) and _Locks (the locks the pool holds)."""
from __future__ import annotations

import fcntl
import os
from typing import Callable

from .. import hostcheck, sshmachine
from ..machine import Fleet, MachineError, each_host
from .schema import load


def inventory_fleet(name: str, hosts: int, log: Callable[[str], None] = lambda m: None) -> Fleet:
    """`hosts` machines of the inventory at path `name` (rdmalab.machines.inventory), the first
    in file order that are free and healthy: each locked for this run (another run, or another
    pytest-xdist worker, takes the next ones), health-checked before use and after each lab,
    each running the controller's own agent version."""
    path = name
    inv = load(path)
    # Hosts behind one fault switch are one fabric: a lab's hosts come from one of them.
    fabrics: dict[str, list] = {}
    for m in sshmachine.inventory_machines(inv):
        fabrics.setdefault(m.facts.wire_switch, []).append(m)
    # pytest-xdist workers start at different fabrics, so two starting at once do not split
    # one fabric's hosts between them (each then too few) and both give up.
    groups = list(fabrics.values())
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    start = int(worker[2:]) % len(groups) if worker[2:].isdigit() and groups else 0
    groups = groups[start:] + groups[:start]
    chosen, locks, passed = [], [], []
    try:
        for group in groups:
            switch = group[0].facts.wire_switch
            if switch:  # its rule table serves one run: hosts behind a switch another holds
                lock = _SwitchLock(inv.switches[switch].control)  # are passed over
                if not lock.acquire():
                    passed.append(f"switch {switch!r} is used by another rdmalab run")
                    continue
                locks.append(lock)
            left = list(group)
            while left and len(chosen) < hosts:
                batch = []  # as many as still wanted, locked, then checked side by side
                while left and len(chosen) + len(batch) < hosts:
                    m = left.pop(0)
                    lock = hostcheck.HostLock(m)
                    try:
                        lock.acquire(30.0)
                    except MachineError as e:
                        passed.append(str(e))
                        continue
                    batch.append((m, lock))
                for (m, lock), problems in zip(
                        batch, each_host(lambda b: hostcheck.health_check(b[0]), batch)):
                    if problems:
                        lock.release()
                        passed.append(f"{m.name}: not healthy: {'; '.join(problems)}")
                        continue
                    chosen.append(m)
                    locks.append(lock)
            if len(chosen) == hosts:
                break
            if chosen:  # too few free on this fabric: leave them to others, try the next
                passed.append(f"only {', '.join(m.name for m in chosen)} free behind switch "
                              f"{chosen[0].facts.wire_switch!r}")
            _Locks(locks).close()
            chosen, locks = [], []
        if len(chosen) < hosts:
            raise RuntimeError(f"inventory {path}: {hosts} hosts wanted on one fabric, "
                               f"{len(chosen)} free and healthy; passed over: "
                               + " | ".join(passed))
        switches = {m.facts.wire_switch for m in chosen if m.facts.wire_switch}
        control = inv.switches[switches.pop()].control if len(switches) == 1 else None
        return Fleet(chosen, description=f"inventory:{os.path.basename(str(path))}",
                     switch_control=control, owner=_Locks(locks), health_check=True,
                     agent_dir=inv.agent_dir or None)
    except BaseException:
        _Locks(locks).close()
        raise


class _SwitchLock:
    """A fault switch for one run: its rules and its host table are switch-wide, so two runs
    (or two pytest-xdist workers) on one switch would drop each other's frames. The switch's
    control socket is on the controller: flock beside it."""

    def __init__(self, control: str):
        self.path = f"{control}.rdmalab-lock"
        self._f = None

    def acquire(self) -> bool:
        f = open(self.path, "a")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            return False
        self._f = f
        return True

    def release(self) -> None:
        if self._f is not None:
            self._f.close()  # closing the file frees the lock
            self._f = None


class _Locks:
    """The inventory hosts' locks, held while the pool lives."""

    def __init__(self, locks):
        self.locks = locks

    def close(self) -> None:
        for lock in self.locks:
            try:
                lock.release()
            except Exception:  # the host may be gone; its lock goes with the ssh session
                pass
