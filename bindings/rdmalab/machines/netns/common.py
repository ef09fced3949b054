"""What the netns lab's rooms share: its constants, and commands run on the outer machine as
one script of named steps (a failure names the host, the step and the output)."""
from __future__ import annotations

import shlex

from ..machine import Machine, MachineError, Result

RDMA_KINDS = ("rxe", "siw", "none")
MODULES = {"rxe": "rdma_rxe", "siw": "siw"}
# rxe's IPv4-mapped GID sits behind the link-local one; siw has one GID (the MAC).
GID_INDEX = {"rxe": 1, "siw": 0}
NETNS_SINCE = (7, 1)     # rxe per network namespace (rxe_ns.c)
MAX_HOSTS = 16
CMD_TIMEOUT_S = 30.0
# sbin is not on every PATH (a non-login shell, sudo's secure_path aside): ip, rdma, modprobe.
SBIN_PATH = 'PATH="$PATH:/usr/sbin:/sbin"; '


def run_steps(outer: Machine, host: str, steps: list[tuple[str, str]],
              timeout: float = CMD_TIMEOUT_S) -> Result:
    """Runs (step, command) pairs as one script on the outer machine (one round trip); the
    first failing step ends it. Raises MachineError naming the host, the step and the output."""
    # Each step in a subshell: its own `exit 1` (a loop giving up) still names the step.
    script = SBIN_PATH + "\n".join(
        f"( {cmd} ) || {{ echo {shlex.quote('FAILED STEP: ' + step)} >&2; exit 1; }}"
        for step, cmd in steps)
    try:
        r = outer.run(script, timeout=timeout, root=True)
    except MachineError as e:
        # Same class: a guest gone stays MachineUnreachable.
        raise type(e)(f"{host}: {steps[0][0]}: the outer machine {outer.name} did not "
                      f"answer: {e}") from e
    if r.rc == 0 and not r.timed_out:
        return r
    failed = [l[len("FAILED STEP: "):] for l in r.err.splitlines()
              if l.startswith("FAILED STEP: ")]
    err = "\n".join(l for l in r.err.splitlines() if not l.startswith("FAILED STEP: "))
    step = failed[-1] if failed else " / ".join(s for s, _ in steps)
    cmd = dict(steps).get(step, "")
    raise MachineError(f"{host}: {step}: "
                       + (f"timed out after {timeout} s" if r.timed_out else f"rc {r.rc}")
                       + (f" (`{cmd}`)" if cmd else "")
                       + f"\nstdout:\n{r.out.strip()[-2000:]}\nstderr:\n{err.strip()[-2000:]}")


def netns_list(outer: Machine) -> list[str]:
    r = run_steps(outer, outer.name, [("list network namespaces", "ip netns list")])
    # "rl1 (id: 3)" or "rl1"
    return [l.split()[0] for l in r.out.splitlines() if l.strip()]


def has_netns(ns: str) -> str:
    # ip's own list: its run directory is /var/run/netns or /run/netns by version.
    return f"ip netns list | cut -d' ' -f1 | grep -qx {ns}"


def links(outer: Machine) -> list[str]:
    r = run_steps(outer, outer.name, [("list links", "ip -o link show")])
    # "7: rl1v@if2: <BROADCAST,...": the name, without the @peer
    return [l.split(":")[1].strip().split("@")[0] for l in r.out.splitlines() if ":" in l]
