"""`rdma res show`: the RDMA objects a host's kernel holds (restrack), read one way for everyone
who asks: the evidence bundle (rdmalab.report.evidence, before and after a scenario), the agent
lab's per-process count (AgentLab.kernel_resources) and the health check
(rdmalab.machines.hostcheck, rdmalab's leftovers).

One kind list (KINDS), one command (show), one JSON parser (entries), one device filter
(on_device); a read is {kind: [entries]}, or {kind: {"error": why}} for a kind that could not
be read (an older iproute2 or kernel does not list ctx or srq). Two ways to run it:

- batch(): in this process (a host's agent): one `rdma -j -b -` kept for the process's life
  (an exec costs ~0.15 s on a TCG guest; a query then costs its netlink dumps). rdma's batch
  mode stops at the first command that fails: the kinds after it come back as errors.
- read(machine): over a Machine (rdmalab.machines.machine), one command for every kind, each
  kind's output followed by a line with its exit status: one round trip, no kind stopping
  another.
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import threading
import time

from .machine import Machine

# In the order rdma's batch asks them: the kinds every kernel lists first, so that one an older
# iproute2 refuses stops as few others as possible.
KINDS = ("qp", "cm_id", "mr", "cq", "pd", "ctx", "srq")
ID_KEYS = {"qp": "lqpn", "cm_id": "cm-idn", "mr": "mrn", "cq": "cqn", "pd": "pdn",
           "ctx": "ctxn", "srq": "srqn"}  # the field naming an object of each kind
SBIN = "/usr/sbin:/sbin"  # where rdma lives when PATH (a login's, not root's) lacks it
MARK = "@rdmalab-res"     # read()'s line after each kind's output: MARK kind status


def show(kind: str) -> str:
    """rdma's command for one kind: a batch line as is, a command line after `rdma -j`."""
    return f"res show {kind}"


def entries(text: str) -> list:
    """Every JSON document in rdma's output for one kind (one array; older versions print one
    per device), arrays flattened. ValueError when the text is not JSON."""
    dec, pos, out = json.JSONDecoder(), 0, []
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return out
        doc, pos = dec.raw_decode(text, pos)
        out += doc if isinstance(doc, list) else [doc]


def on_device(items: list, device: str) -> list:
    """The entries of device (all when device is ""): a netns host sees every device."""
    if not device:
        return items
    return [e for e in items if not isinstance(e, dict) or e.get("ifname") in (None, device)]


def result(kind: str, text, rc: int, err: str, device: str = ""):
    """One kind's entries on device from its output (text None: it never answered), or
    {"error": why}."""
    if text is None or rc != 0:
        return {"error": f"rdma -j {show(kind)}: rc {rc}: "
                         f"{(err or 'no output').strip()[-300:]}"}
    try:
        return on_device(entries(text), device)
    except ValueError:
        return {"error": f"rdma -j {show(kind)}: not JSON: {text[:300]!r}"}


def held_by(res: dict, pids: set[int]) -> dict[str, int]:
    """How many objects of each kind the pids hold in a read; kinds with none, or unread, are
    left out."""
    out = {}
    for kind in KINDS:
        items = res.get(kind)
        if not isinstance(items, list):
            continue
        n = sum(1 for e in items if isinstance(e, dict) and e.get("pid") in pids)
        if n:
            out[kind] = n
    return out


# -- batch: in this process ---------------------------------------------------------------------

_RDMA: dict = {}  # the batch process: {"proc", "buf"}
_RDMA_LOCK = threading.Lock()


def parse_batch(out: str, rc: int, err: str, device: str = "",
                kinds: tuple[str, ...] = KINDS) -> dict:
    """A read from rdma's batch output: one line a command, in kinds' order, up to the first
    that failed (rc and err say why, for it and every kind after it)."""
    lines = [line for line in out.splitlines() if line.strip()]
    return {kind: result(kind, lines[i], 0, "", device) if i < len(lines)
            else result(kind, None, rc, err, device) for i, kind in enumerate(kinds)}


def batch(device: str = "", deadline_s: float = 5.0, kinds: tuple[str, ...] = KINDS) -> dict:
    """A read through this process's rdma batch process (started on first use). Stops it on
    any trouble; the next call starts another."""
    with _RDMA_LOCK:
        p = _RDMA.get("proc")
        if p is None or p.poll() is not None:
            env = dict(os.environ, PATH=os.environ.get("PATH", "") + ":" + SBIN)
            try:
                # stdbuf: each command's JSON line leaves at once, not when a pipe buffer fills.
                p = subprocess.Popen(["stdbuf", "-oL", "rdma", "-j", "-b", "-"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, close_fds=True)
            except OSError as e:
                return parse_batch("", -1, f"rdma batch process: {e}", device, kinds)
            _RDMA.update(proc=p, buf=b"")
        lines: list[str] = []
        try:
            p.stdin.write("".join(show(k) + "\n" for k in kinds).encode())
            p.stdin.flush()
            _read_lines(p, lines, len(kinds), deadline_s)
        except (OSError, EOFError, TimeoutError) as e:
            err = _stop(p)
            return parse_batch("\n".join(lines), p.returncode if p.returncode is not None
                               else -1, f"{type(e).__name__}: {e}; {err}", device, kinds)
        return parse_batch("\n".join(lines), 0, "", device, kinds)


def _read_lines(p: subprocess.Popen, lines: list[str], n: int, deadline_s: float) -> None:
    """Appends the batch process's next n lines to lines, within deadline_s."""
    end = time.monotonic() + deadline_s
    fd = p.stdout.fileno()
    while len(lines) < n:
        if b"\n" in _RDMA["buf"]:
            line, _, _RDMA["buf"] = _RDMA["buf"].partition(b"\n")
            lines.append(line.decode(errors="replace"))
            continue
        left = end - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError(f"rdma answered {len(lines)} of {n} queries within "
                               f"{deadline_s} s")
        chunk = os.read(fd, 65536)
        if not chunk:
            raise EOFError("rdma exited")
        _RDMA["buf"] += chunk


def _stop(p: subprocess.Popen) -> str:
    """Ends the batch process; its stderr (why a command failed)."""
    _RDMA.clear()
    p.kill()
    try:
        return (p.communicate(timeout=2)[1] or b"").decode(errors="replace").strip()[-300:]
    except Exception:
        return ""


# -- read: over a Machine -----------------------------------------------------------------------

def command(kinds: tuple[str, ...] = KINDS) -> str:
    """A shell command asking each kind in turn: its output (stderr with it: the error when it
    fails), then the line MARK kind status."""
    return f'PATH="$PATH:{SBIN}"; ' + "; ".join(
        f"rdma -j {show(k)} 2>&1; printf '\\n%s %s %s\\n' {MARK} {k} $?" for k in kinds)


def parse_marked(out: str, rc: int, err: str, device: str = "",
                 kinds: tuple[str, ...] = KINDS) -> dict:
    """A read from command()'s output; a kind with no status line (the command was cut
    short) fails with the command's rc and err."""
    res: dict = {}
    chunk: list[str] = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[0] == MARK and fields[1] in kinds:
            text = "\n".join(chunk)
            kind, status = fields[1], int(fields[2])
            res[kind] = result(kind, text, status, text, device)
            chunk = []
        else:
            chunk.append(line)
    return {kind: res[kind] if kind in res else result(kind, None, rc, err, device)
            for kind in kinds}


def read(machine: Machine, kinds: tuple[str, ...] = KINDS, *, device: str = "",
         root: bool = False, timeout: float = 60.0) -> dict:
    """A read over machine.run(): one command for every kind. MachineUnreachable propagates."""
    r = machine.run(command(kinds), timeout=timeout, root=root)
    why = r.err + (" (timed out)" if r.timed_out else "")
    return parse_marked(r.out, r.rc, why, device, kinds)
