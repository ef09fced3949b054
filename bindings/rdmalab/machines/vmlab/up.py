"""The VM lab as machines reached by SSH alone: `python3 -m rdmalab.machines.vmlab up|serve|down|power`.

`up` starts a detached supervisor (`serve`: a session of its own, output to its state dir's
serve.log) that owns the fault switch and N guests that do not see the controller's checkout,
waits until it reports them ready, writes an inventory TOML describing them as real machines
(forwarded SSH ports, power commands that call `power`) and exits; the guests run on. `down`
SIGTERMs the supervisor, which powers everything off. The inventory loader refuses unknown
keys, so the state dir is named in a sidecar file, <inventory>.vmlab.json.

State dir (kernel.STATE/up/<time>-<pid>, i.e. the clone's .cache/vmlab/up; outside run/, which
vm.VmGroup prunes):
  serve.log    the supervisor's output
  state.json   {"pid", "state": starting|ready|error|stopped, "error", "switch_pid",
                "control", "hosts": {name: {"qemu_pid", "ssh_port", "agent_port", "ip", "mac"}}}
  power.sock   JSON lines: {"host": "vm1", "action": "on|off|cycle"} -> {"ok", "error"|"boot_s"}
  lab/         vm.VmGroup's workdir (switch and NIC sockets, serial and qemu logs, fabric.pcap)
"""
from __future__ import annotations

import json
import os
import pathlib
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

from . import debian
from . import kernel as kernel_mod
from . import ssh as ssh_mod
from .vm import SOCK_PATH_MAX, VmGroup, Vm, VmError, VmTimeout, tail

AGENT_DIR = pathlib.Path("/var/tmp/rdmalab-agent")  # where the controller ships its agent
UP_DEADLINE_S = 300.0
DOWN_DEADLINE_S = 60.0
READY_DEADLINE_S = 240.0  # one guest's boot in serve; a loaded 2-core host needs more than 120
KEEP_STATES = 8
GID_INDEX = {"rxe": 1, "siw": 0}  # rxe: 1 is ::ffff:10.0.0.N (RoCEv2); 0 is the MAC's fe80::


class UpError(RuntimeError):
    pass


class _Stop(BaseException):  # not an Exception: no `except Exception` on the way swallows it
    pass


def _log(msg: str) -> None:
    print(f"[vmlab {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def default_hide() -> list[pathlib.Path]:
    """What an inventory guest must not see: the checkout, the artifact cache and the run
    state (where they live outside it), and the controller's own shipped agent."""
    paths = [kernel_mod.REPO, AGENT_DIR]
    for d in (kernel_mod.CACHE.resolve(), kernel_mod.STATE.resolve()):
        if not d.is_relative_to(kernel_mod.REPO) and d not in paths:
            paths.append(d)
    return paths


# ---- state files -------------------------------------------------------------------------

def sidecar(inventory: pathlib.Path) -> pathlib.Path:
    return inventory.with_name(inventory.name + ".vmlab.json")


def read_state(state: pathlib.Path) -> dict:
    try:
        return json.loads((state / "state.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _write_state(state: pathlib.Path, info: dict) -> None:
    tmp = state / "state.json.tmp"
    tmp.write_text(json.dumps(info, indent=1))
    os.replace(tmp, state / "state.json")  # readers never see half a file


def state_of(inventory: pathlib.Path) -> pathlib.Path:
    side = sidecar(inventory)
    try:
        return pathlib.Path(json.loads(side.read_text())["state"])
    except FileNotFoundError:
        raise UpError(f"no VM lab recorded for {inventory}: {side} is missing "
                      "(written by python3 -m rdmalab.machines.vmlab up)") from None
    except (ValueError, KeyError) as exc:
        raise UpError(f"{side}: unreadable ({exc})") from None


def running(pid: int | None, state: pathlib.Path) -> bool:
    """Whether pid is a live process of this lab: its command line names the state dir (a
    reused pid does not), and it is not a zombie."""
    if not pid:
        return False
    try:
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return str(state).encode() in cmdline and stat.rsplit(")", 1)[1].split()[0] != "Z"


def recorded_pids(state: pathlib.Path) -> list[int]:
    info = read_state(state)
    pids = [info.get("pid"), info.get("switch_pid")]
    pids += [h.get("qemu_pid") for h in info.get("hosts", {}).values()]
    return [p for p in pids if p]


def stop(state: pathlib.Path, deadline_s: float = DOWN_DEADLINE_S,
         sup: int | None = None) -> list[int]:
    """SIGTERM the supervisor (sup where it has not written state.json yet), wait for it,
    then SIGKILL whatever recorded is left. Returns the pids that had to be killed."""
    sup = read_state(state).get("pid") or sup
    if running(sup, state):
        os.kill(sup, signal.SIGTERM)
    end = time.monotonic() + deadline_s
    while running(sup, state) and time.monotonic() < end:
        time.sleep(0.2)
    killed = [p for p in recorded_pids(state) if running(p, state)]
    for p in killed:
        os.kill(p, signal.SIGKILL)
    end = time.monotonic() + 10.0
    while any(running(p, state) for p in killed) and time.monotonic() < end:
        time.sleep(0.1)
    return killed


def diagnostics(state: pathlib.Path) -> str:
    parts = [f"--- supervisor log ({state / 'serve.log'}) ---\n{tail(state / 'serve.log')}"]
    for log in sorted((state / "lab").glob("vm*/serial.log")):
        parts.append(f"--- {log.parent.name} serial log ({log}) ---\n{tail(log, 25)}")
    return "\n".join(parts)


def _prune() -> None:
    """Keeps the newest state dirs (their logs); never one whose supervisor runs."""
    root = kernel_mod.STATE / "up"
    old = sorted(root.glob("*-*"), key=lambda p: p.stat().st_mtime) if root.exists() else []
    for d in old[:max(0, len(old) - KEEP_STATES + 1)]:
        if not running(read_state(d).get("pid"), d):
            shutil.rmtree(d, ignore_errors=True)


# ---- the supervisor ----------------------------------------------------------------------

def _wait_sshd(vm: Vm, deadline_s: float = 30.0) -> None:
    """sshd answers with its banner; qemu's hostfwd accepts and closes while nothing listens."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", vm.ssh_port), timeout=5) as c:
                if c.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        if time.monotonic() > end:
            raise VmTimeout(f"{vm.spec.name}: sshd does not answer on 127.0.0.1:{vm.ssh_port}"
                            f"\n{vm.diagnostic()}")
        time.sleep(0.2)


_booted: set[str] = set()  # guests whose agent answered since their last start


def _ready(vm: Vm) -> float:
    _booted.discard(vm.spec.name)
    vm.wait_ready(READY_DEADLINE_S)
    _wait_sshd(vm)
    _booted.add(vm.spec.name)
    return round(time.monotonic() - vm.started_at, 1)


def _record(state: pathlib.Path, info: dict, lab: VmGroup) -> None:
    for vm in lab.vms:
        info["hosts"][vm.spec.name]["qemu_pid"] = vm.proc.pid if vm.alive() else None
    _write_state(state, info)


def _power(lab: VmGroup, host: str, action: str) -> dict:
    vm = next((v for v in lab.vms if v.spec.name == host), None)
    if vm is None:
        raise VmError(f"no host {host!r} in this lab ({', '.join(v.spec.name for v in lab.vms)})")
    if action not in ("on", "off", "cycle"):
        raise VmError(f"{host}: unknown power action {action!r} (on, off, cycle)")
    if action in ("off", "cycle"):
        vm.kill()  # SIGKILL, as a pulled plug
    if action == "off":
        return {}
    if vm.alive():
        return {"already_on": True}
    vm.start()  # same switch port, MAC and forwarded ports
    return {"boot_s": _ready(vm)}


def serve(state: pathlib.Path, device: str, n: int, memory_mb: int) -> int:
    """Owns the switch and the guests until SIGTERM; answers power requests in the main
    thread (PR_SET_PDEATHSIG ties each qemu to the thread that forked it)."""
    def on_term(*_: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop, however often signalled
        raise _Stop()

    signal.signal(signal.SIGTERM, on_term)
    info: dict = {"pid": os.getpid(), "state": "starting", "hosts": {}}
    _write_state(state, info)
    lab = None
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    rc = 0
    try:
        lab = VmGroup(n, rdma=device, memory_mb=memory_mb, workdir=state / "lab",
                  hide=default_hide(), keep=[AGENT_DIR])
        info["hosts"] = {vm.spec.name: {"ssh_port": vm.ssh_port, "agent_port": vm.port,
                                        "ip": vm.spec.ip, "mac": vm.spec.data_mac}
                         for vm in lab.vms}
        lab.start_switch()
        assert lab.switch is not None
        info["switch_pid"] = lab.switch.pid
        _write_state(state, info)
        if lab.switch_control is None:
            raise VmError("the fault switch (build/faults/rdmalab-switch) is not built: "
                          "run make build")
        info["control"] = str(lab.switch_control)
        t0 = time.monotonic()
        for vm in lab.vms:
            vm.start()
        _record(state, info, lab)
        _log(f"ready after {[_ready(vm) for vm in lab.vms]} s "
             f"({time.monotonic() - t0:.1f} s for all)")
        srv.bind(str(state / "power.sock"))
        srv.listen(8)
        srv.settimeout(1.0)
        info["state"] = "ready"
        _write_state(state, info)
        while True:
            try:
                conn, _ = srv.accept()
            except socket.timeout:
                continue
            with conn:
                conn.settimeout(10.0)
                try:
                    req = json.loads(conn.makefile("rb").readline())
                    _log(f"power {req.get('host')} {req.get('action')}")
                    reply = {"ok": True, **_power(lab, str(req.get("host")),
                                                  str(req.get("action")))}
                except (VmError, OSError, ValueError, AttributeError) as exc:
                    reply = {"ok": False, "error": str(exc)}
                _record(state, info, lab)
                _log(f"-> {reply}")
                try:
                    conn.sendall(json.dumps(reply).encode() + b"\n")
                except OSError:
                    pass  # the client gave up; the next request sees the new state
    except _Stop:
        _log("SIGTERM: powering off")
    except Exception as exc:  # reported to `up` through state.json, with the log
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _log(f"FAIL: {type(exc).__name__}: {exc}")
        info.update(state="error", error=f"{type(exc).__name__}: {exc}")
        _write_state(state, info)
        rc = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        srv.close()
        (state / "power.sock").unlink(missing_ok=True)
        if lab is not None:
            for vm in lab.vms:  # a booting guest's agent cannot power it off: close would
                if vm.spec.name not in _booted:  # wait 20 s for it
                    vm.kill()
            lab.close()
        if rc == 0:
            info["state"] = "stopped"
        if lab is not None:
            _record(state, info, lab)
        _log("stopped")
    return rc


# ---- the commands ------------------------------------------------------------------------

def _q(value: object) -> str:
    return json.dumps(str(value))  # a TOML basic string: JSON's escapes are TOML's


def _power_cmd(inventory: pathlib.Path, host: str, action: str) -> str:
    repo = shlex.quote(str(kernel_mod.REPO))
    return (f"cd {repo} && PYTHONPATH={repo}/bindings {shlex.quote(sys.executable)} "
            f"-m rdmalab.machines.vmlab power "
            f"--inventory {shlex.quote(str(inventory))} --host {host} {action}")


def inventory_text(info: dict, device: str, inventory: pathlib.Path) -> str:
    keys = ssh_mod.key_dir()
    out = [f"# written by python3 -m rdmalab.machines.vmlab up; remove with python3 -m rdmalab.machines.vmlab down "
           f"--inventory {inventory}",
           "[lab]", f"known_hosts = {_q(keys / 'known_hosts')}", "",
           "[[switch]]", 'name = "vmlab"', f"control = {_q(info['control'])}"]
    for name, h in info["hosts"].items():
        power = ", ".join(f"{a} = {_q(_power_cmd(inventory, name, a))}"
                          for a in ("on", "off", "cycle"))
        out += ["", "[[host]]", f"name = {_q(name)}",
                f'ssh = {{ user = "root", address = "127.0.0.1", port = {h["ssh_port"]}, '
                f'identity = {_q(keys / "id_ed25519")}, host_key_alias = {_q(ssh_mod.ALIAS)} }}',
                f'device = "{device}0"', "port = 1", f"gid_index = {GID_INDEX[device]}",
                'netdev = "eth0"', f"data_address = {_q(h['ip'])}", f"mac = {_q(h['mac'])}",
                f"power = {{ {power} }}", 'wire = { via = "switch", switch = "vmlab" }']
    return "\n".join(out) + "\n"


def inventory_folder(inventory: pathlib.Path) -> None:
    """The inventory's folder must exist; the clone's run state folder (make's default place
    for it) is made here, as nothing else makes it before a first run in a fresh clone."""
    if inventory.resolve().parent == kernel_mod.STATE.resolve():
        inventory.parent.mkdir(parents=True, exist_ok=True)
    if not inventory.parent.is_dir():
        raise UpError(f"cannot write the inventory {inventory}: {inventory.parent} is not a "
                      "directory")


def up(device: str, n: int, inventory: pathlib.Path, memory_mb: int) -> int:
    inventory = inventory.resolve()
    side = sidecar(inventory)
    inventory_folder(inventory)
    if side.exists():
        old = state_of(inventory)
        if running(read_state(old).get("pid"), old):
            raise UpError(f"{inventory} already describes a running VM lab (state {old}): "
                          f"python3 -m rdmalab.machines.vmlab down --inventory {inventory} first")
        side.unlink()  # its supervisor is gone
    _prune()
    state = kernel_mod.STATE.resolve() / "up" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    if len(str(state / "lab" / f"vm{n}.sock")) > SOCK_PATH_MAX:
        raise UpError(f"state dir {state} is too deep for unix socket paths "
                      f"({SOCK_PATH_MAX} bytes): set VMLAB_CACHE to a shorter path")
    state.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(kernel_mod.REPO / "bindings"))
    t0 = time.monotonic()
    with open(state / "serve.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rdmalab.machines.vmlab", "serve", "--state", str(state), "--device",
             device, "--hosts", str(n), "--memory", str(memory_mb)],
            cwd=kernel_mod.REPO, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)  # outlives this command
    # Named at once, so that `down` finds the lab even if this command is killed now.
    side.write_text(json.dumps({"state": str(state), "supervisor_pid": proc.pid}) + "\n")
    _log(f"supervisor pid {proc.pid}, state {state}")
    end = t0 + UP_DEADLINE_S
    # The supervisor's own lines (each guest's boot) go to serve.log; this one says the whole.
    with kernel_mod.waiting(f"up: {n} {device} guest{'s' * (n > 1)} ({debian.kernel_choice()})"
                            f" starting, log {state}/serve.log", UP_DEADLINE_S, started=t0):
        while (info := read_state(state)).get("state") != "ready":
            why = None
            if info.get("state") == "error":
                why = f"the supervisor failed: {str(info.get('error')).splitlines()[0]}"
            elif proc.poll() is not None:
                why = f"the supervisor exited (rc {proc.returncode}) before the guests were ready"
            elif time.monotonic() > end:
                why = f"the guests were not ready after {UP_DEADLINE_S:.0f} s"
            else:
                try:
                    time.sleep(0.5)
                except KeyboardInterrupt:
                    why = "interrupted"
            if why:
                stop(state, 30.0, proc.pid)
                proc.poll()
                side.unlink(missing_ok=True)
                raise UpError(f"{why}\n{diagnostics(state)}")
    try:
        inventory.write_text(inventory_text(info, device, inventory))
    except OSError as exc:
        stop(state, DOWN_DEADLINE_S)
        side.unlink(missing_ok=True)
        raise UpError(f"cannot write the inventory {inventory}: {exc} (guests stopped)") from None
    hosts = ", ".join(f"{k} ssh 127.0.0.1:{h['ssh_port']}" for k, h in info["hosts"].items())
    _log(f"up in {time.monotonic() - t0:.1f} s: {hosts}; inventory {inventory}")
    return 0


def down(inventory: pathlib.Path) -> int:
    inventory = inventory.resolve()
    state = state_of(inventory)
    sup = json.loads(sidecar(inventory).read_text()).get("supervisor_pid")
    t0 = time.monotonic()
    was_running = running(read_state(state).get("pid") or sup, state)
    killed = stop(state, DOWN_DEADLINE_S, sup)
    left = [p for p in recorded_pids(state) if running(p, state)]
    if left:
        raise UpError(f"processes of {state} still run after SIGKILL: {left}")
    sidecar(inventory).unlink()
    _log(f"down in {time.monotonic() - t0:.1f} s"
         + ("" if was_running else " (the supervisor was not running)")
         + (f"; SIGKILLed {killed}" if killed else ""))
    return 0


def power(inventory: pathlib.Path, host: str, action: str) -> int:
    try:
        state = state_of(inventory.resolve())
    except UpError as exc:
        raise UpError(f"{host}: power {action}: {exc}") from None
    path = state / "power.sock"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(READY_DEADLINE_S + 60.0)
            s.connect(str(path))
            s.sendall(json.dumps({"host": host, "action": action}).encode() + b"\n")
            reply = json.loads(s.makefile("rb").readline() or b"{}")
    except (OSError, ValueError) as exc:
        raise UpError(f"{host}: power {action}: the VM lab supervisor does not answer on "
                      f"{path}: {exc}") from None
    if not reply.get("ok"):
        raise UpError(f"{host}: power {action} failed: {reply.get('error', 'no reply')}")
    _log(f"{host}: power {action}: " + ("it was on already" if reply.get("already_on") else
         f"ready {reply['boot_s']} s after qemu start" if "boot_s" in reply else "done"))
    return 0
