"""Host locking and health checks, over rdmalab.machines.machine's protocol (any kind of machine).

A run locks each host's device port for its whole life (two runs never share a host) with
flock(1) on the host, held by a command that ends when its stdin closes: a controller that
dies releases its locks without anybody cleaning up.

The health check is two round trips (`rdma res show` through rdmalab.machines.rdma_res, then a
Python snippet on the host that prints JSON): the device and port exist, the port is ACTIVE,
the GID at gid_index is set, the netdev exists, and nothing from rdmalab is left in `rdma res
show`. An entry is rdmalab's when its process's comm (the name `rdma res` prints, kept by the
kernel even after the process exited) or its command line mentions "rdmalab"; objects of other
processes, and of the kernel, are not ours to judge.
"""
from __future__ import annotations

import dataclasses
import getpass
import json
import os
import select
import shlex
import socket
import subprocess
import time
from typing import Optional

from . import rdma_res
from .machine import Machine, MachineError, MachineUnreachable, end_session

LOCK_DIR = "/run/lock"
HELD_RC = 75                     # flock -E: the lock is held by someone else (EX_TEMPFAIL)


def lock_path(machine: Machine) -> str:
    return f"{LOCK_DIR}/rdmalab-{machine.facts.device}-{machine.facts.port}.lock"


class HostLock:
    """An exclusive lock on a machine's device port, on the machine, for one run.

        with HostLock(machine).acquire(30):
            ...
    """

    def __init__(self, machine: Machine):
        self.machine = machine
        self.path = lock_path(machine)
        self.owner = (f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()} "
                      f"since {time.strftime('%Y-%m-%d %H:%M:%S')}")
        self._proc: Optional[subprocess.Popen] = None

    def command(self) -> str:
        # The owner line is written while holding the lock, read back only by a loser.
        inner = ('{ echo "$RDMALAB_OWNER" > "$RDMALAB_LOCK.owner"; } 2>/dev/null; '
                 'echo LOCKED; exec cat')
        # /run/lock may be missing on a minimal host (a fresh tmpfs /run, as in the VM lab).
        return (f"mkdir -p {LOCK_DIR} 2>/dev/null; export RDMALAB_LOCK={shlex.quote(self.path)} "
                f"RDMALAB_OWNER={shlex.quote(self.owner)}; "
                f'flock -n -E {HELD_RC} "$RDMALAB_LOCK" -c {shlex.quote(inner)}; rc=$?; '
                f'[ $rc = {HELD_RC} ] && echo "HELD $(cat "$RDMALAB_LOCK.owner" 2>/dev/null)"; '
                f"exit $rc")

    @property
    def held(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def acquire(self, deadline_s: float = 30.0) -> "HostLock":
        """Takes the lock or raises MachineError naming the host (and the holder)."""
        if self.held:
            return self
        p = self.machine.popen(self.command(), stdin=True)   # stdin open: cat blocks
        out, start = b"", time.monotonic()
        fd = p.stdout.fileno()
        while b"LOCKED\n" not in out:
            left = deadline_s - (time.monotonic() - start)
            if left <= 0:
                p.kill()
                p.wait()
                raise MachineError(f"{self.machine.name}: no answer taking the lock "
                                   f"{self.path} within {deadline_s} s: {_text(out)}")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 4096)
            if not chunk:                    # the command ended: refused or failed
                rc = p.wait()
                text = _text(out)
                if rc == HELD_RC:
                    holder = text.split("HELD", 1)[-1].strip() or "unknown"
                    raise MachineError(f"{self.machine.name}: {self.machine.facts.device} port "
                                       f"{self.machine.facts.port} is held by another rdmalab "
                                       f"run ({holder}; lock {self.path})")
                cls = MachineUnreachable if rc == 255 else MachineError   # ssh's own status
                raise cls(f"{self.machine.name}: cannot take the lock {self.path} "
                          f"(rc {rc}): {text}")
            out += chunk
        self._proc = p
        return self

    def release(self) -> None:
        """Closes the command's stdin: cat, flock and the session end, the lock is free."""
        p, self._proc = self._proc, None
        if p is not None:
            end_session(p, 15.0)

    def __enter__(self) -> "HostLock":
        return self.acquire() if not self.held else self

    def __exit__(self, *exc) -> None:
        self.release()


def _text(out: bytes | str) -> str:
    return (out.decode(errors="replace") if isinstance(out, bytes) else out).strip()[-2000:]


# ---------------------------------------------------------------------------------------------
# Health.

# Runs on the host (any python3 >= 3.6): reads sysfs and the command lines of the processes
# holding objects on the device, prints one JSON object. Kept to the standard library.
_PROBE = r'''
import json, os, sys
P = json.loads(sys.argv[1])
out = {"devices": [], "state": None, "gid": None, "netdev": None, "cmdlines": {}}
base = P["sysfs"] + "/class/infiniband"
def rd(p):
    try:
        with open(p) as f:
            return f.read().strip()
    except OSError as e:
        return "!" + (e.strerror or str(e))
try:
    out["devices"] = sorted(os.listdir(base))
except OSError:
    pass
if P["device"] in out["devices"]:
    port = "%s/%s/ports/%d" % (base, P["device"], P["port"])
    out["state"] = rd(port + "/state")
    out["gid"] = rd("%s/gids/%d" % (port, P["gid_index"]))
    if P["netdev"]:
        out["netdev"] = os.path.isdir(P["sysfs"] + "/class/net/" + P["netdev"])
for pid in P["pids"]:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        continue
    out["cmdlines"][str(pid)] = cmd
print(json.dumps(out))
'''


@dataclasses.dataclass
class HostState:
    """What one probe of a host found."""
    name: str
    device: str
    checks: list[str]                # device, port, GID, netdev problems
    leftovers: list[dict]            # rdmalab's entries in `rdma res`: kind, id, pid, comm, cmdline
    sysfs: str = "/sys"

    @property
    def problems(self) -> list[str]:
        """Everything wrong, one line each; empty = healthy. Leftovers grouped by process."""
        by_pid: dict = {}
        for e in self.leftovers:
            by_pid.setdefault((e["pid"], e["comm"], e["cmdline"]), []).append(
                f"{e['kind']} {e['id']}")
        return self.checks + [
            f"{self.name}: left over from rdmalab on {self.device}: {', '.join(objs)} "
            f"(pid {pid} {comm}{': ' + cmd if cmd else ''})"
            for (pid, comm, cmd), objs in by_pid.items()]


def _key(e: dict) -> tuple:
    return (e["kind"], e["id"], e["pid"])


def probe(machine: Machine, timeout: float = 60.0, sysfs: str = "/sys") -> HostState:
    """Two commands on the host: `rdma res` (rdmalab.machines.rdma_res), then the snippet
    (sysfs, and the command lines of the processes holding objects on the device).
    MachineUnreachable propagates (the host is not there). `sysfs`: where sysfs is mounted
    (tests point it at a fake tree)."""
    f = machine.facts
    res = rdma_res.read(machine, device=f.device, timeout=timeout)
    pids = sorted({e["pid"] for items in res.values() if isinstance(items, list)
                   for e in items if isinstance(e, dict) and e.get("pid")})
    params = {"device": f.device, "port": f.port, "gid_index": f.gid_index,
              "netdev": f.netdev, "pids": pids, "sysfs": sysfs}
    r = machine.run(f"python3 -c {shlex.quote(_PROBE)} {shlex.quote(json.dumps(params))}",
                    timeout=timeout)
    state = HostState(machine.name, f.device, [], [], sysfs)
    try:
        if r.rc != 0 or r.timed_out:
            raise ValueError(f"rc {r.rc}{' (timed out)' if r.timed_out else ''}")
        d = json.loads(r.out.strip().splitlines()[-1])
    except (ValueError, IndexError) as e:
        state.checks.append(f"{machine.name}: the health check could not run ({e}; it needs "
                            f"python3 on the host): {(r.err or r.out).strip()[-500:]}")
        return state
    if not _check_port(state, f, d):
        return state
    errors = [v["error"] for v in res.values() if isinstance(v, dict)]
    if errors and len(errors) == len(res):
        state.checks.append(f"{machine.name}: `rdma res show` failed, leftovers not checked: "
                            f"{errors[-1]}")
    state.leftovers = _ours(res, d["cmdlines"])
    return state


def _check_port(state: HostState, f, d: dict) -> bool:
    """Notes in state.checks what the snippet found wrong with the device, port, GID and
    netdev; False when there is no such port (nothing more to check)."""
    name, sysfs, dev = state.name, state.sysfs, f"{f.device} port {f.port}"
    if f.device not in d["devices"]:
        have = ", ".join(d["devices"]) or "no RDMA devices at all"
        state.checks.append(f"{name}: RDMA device {f.device} not found: {sysfs}/class/"
                            f"infiniband has {have}")
        return False
    port = d["state"] or ""
    if port.startswith("!"):
        state.checks.append(f"{name}: {dev} does not exist ({port[1:]})")
        return False
    if port.split()[-1:] != ["ACTIVE"]:
        state.checks.append(f"{name}: {dev} is {port.split(':')[-1].strip() or port}, "
                            f"not ACTIVE (rdma link; is the netdev up?)")
    gid = d["gid"] or ""
    if gid.startswith("!") or not gid.replace("0", "").replace(":", ""):
        why = gid[1:] if gid.startswith("!") else "all zeros"
        state.checks.append(f"{name}: {dev} has no GID at index {f.gid_index} ({why}); check "
                            f"gid_index against {sysfs}/class/infiniband/{f.device}/ports/"
                            f"{f.port}/gids (RoCEv2 on IPv4: the ::ffff:<data_address> entry)")
    if d.get("netdev") is False:
        state.checks.append(f"{name}: netdev {f.netdev} not found ({sysfs}/class/net)")
    return True


def _ours(res: dict, cmdlines: dict[str, str]) -> list[dict]:
    """rdmalab's entries of an `rdma res` read (its comm or its process's command line says
    so): kind, id, pid, comm, cmdline."""
    out = []
    for kind, items in res.items():
        for e in items if isinstance(items, list) else []:
            if not isinstance(e, dict):
                continue
            pid, comm = e.get("pid"), str(e.get("comm", ""))
            cmd = cmdlines.get(str(pid), "")
            if "rdmalab" in comm or "rdmalab" in cmd:
                out.append({"kind": kind, "id": e.get(rdma_res.ID_KEYS[kind]), "pid": pid,
                            "comm": comm, "cmdline": cmd[:160]})
    return out


def health_check(machine: Machine) -> list[str]:
    """The host's problems before a run (empty = healthy)."""
    return probe(machine).problems


def leaks(machine: Machine, before: Optional[HostState] = None) -> list[str]:
    """The after-check: what is wrong now that was not `before` (a probe() taken before the
    run; None = everything counts): new rdmalab objects in `rdma res`, a port no longer
    ACTIVE, a GID gone. Call it once the run's processes on the host have exited."""
    after = probe(machine, sysfs=before.sysfs if before else "/sys")
    if before is not None:
        old = {_key(e) for e in before.leftovers}
        after.leftovers = [e for e in after.leftovers if _key(e) not in old]
        after.checks = [c for c in after.checks if c not in set(before.checks)]
    return after.problems
